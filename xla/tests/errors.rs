//! Bad input gets an error that names the problem, never an abort.

mod common;

use common::{cpu_client, matmul_program};
use grpo_xla::{CompileOptions, ElementType, Error, Platform, Plugin, PluginSearch};

#[test]
fn malformed_program_text_returns_the_parsers_message() {
    let client = cpu_client(1);
    let broken = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = stablehlo.add %x, %undefined : tensor<2xf32>\n  return %y : tensor<2xf32>\n}";
    let error = client.compile(broken, &CompileOptions::default()).unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(
            error,
            Error::Pjrt {
                function: "client_compile",
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("2:26") && text.contains("undeclared SSA value"),
        "the parser's message and position: {text}"
    );
    let garbage = client
        .compile("this is not a program", &CompileOptions::default())
        .unwrap_err();
    assert!(matches!(garbage, Error::Pjrt { .. }), "{garbage}");
}

#[test]
fn wrong_arguments_are_refused_before_execution() {
    let client = cpu_client(1);
    let device = client.device(0).unwrap();
    let executable = client
        .compile(&matmul_program(2, 3, 4, ElementType::F32), &CompileOptions::default())
        .unwrap();
    let a = client.buffer_from_host(&[0.5f32; 6], &[2, 3], device).unwrap();
    let b = client.buffer_from_host(&[0.5f32; 12], &[3, 4], device).unwrap();

    let count = executable.execute(&[&a]).unwrap_err();
    assert!(
        matches!(
            count,
            Error::ArgumentCount {
                expected: 2,
                found: 1,
                ..
            }
        ),
        "{count}"
    );

    let transposed = client.buffer_from_host(&[0.5f32; 12], &[4, 3], device).unwrap();
    let shape = executable.execute(&[&a, &transposed]).unwrap_err();
    assert!(matches!(shape, Error::ArgumentType { index: 1, .. }), "{shape}");
    assert!(
        shape.to_string().contains("must be f32[3, 4], got f32[4, 3]"),
        "{shape}"
    );

    let integers = client.buffer_from_host(&[1i32; 12], &[3, 4], device).unwrap();
    let dtype = executable.execute(&[&a, &integers]).unwrap_err();
    assert!(dtype.to_string().contains("got s32[3, 4]"), "{dtype}");

    // The right call still works after the refused ones.
    let out = executable.execute(&[&a, &b]).unwrap();
    assert!(
        out[0]
            .to_host::<f32>()
            .unwrap()
            .iter()
            .all(|&v| (v - 0.75).abs() < 1e-6)
    );
}

#[test]
fn a_missing_plugin_names_the_pip_package_and_setup() {
    let empty = tempfile::tempdir().unwrap();
    let search = PluginSearch {
        explicit: None,
        package_dirs: vec![empty.path().to_path_buf()],
    };
    let error = search.find(Platform::Cpu).unwrap_err().to_string();
    assert!(error.contains("lammps-jax-pjrt-cpu==0.11.2"), "{error}");
    assert!(error.contains("grpo setup"), "{error}");
    assert!(error.contains(&empty.path().display().to_string()), "{error}");
    let cuda = search.find(Platform::Cuda).unwrap_err().to_string();
    assert!(
        cuda.contains("jax-cuda13-pjrt") && cuda.contains("--platform cuda"),
        "{cuda}"
    );

    let explicit = PluginSearch {
        explicit: Some(empty.path().join("nothing.so")),
        package_dirs: Vec::new(),
    };
    let error = explicit.find(Platform::Cpu).unwrap_err().to_string();
    assert!(
        error.contains("GRPO_PJRT_PLUGIN") && error.contains("nothing.so"),
        "{error}"
    );
}

#[test]
fn files_that_are_not_plugins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("plugin.so");
    std::fs::write(&text, "not a shared library").unwrap();
    let error = Plugin::load(&text).unwrap_err();
    assert!(matches!(error, Error::PluginLoad { .. }), "{error}");

    // A real shared library without the PJRT entry point.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libm to stand in for a library that is not a plugin");
    let error = Plugin::load(libm).unwrap_err();
    assert!(matches!(error, Error::NotAPlugin { .. }), "{error}");
    assert!(error.to_string().contains("GetPjrtApi"), "{error}");

    let missing = Plugin::load(dir.path().join("absent.so")).unwrap_err();
    assert!(matches!(missing, Error::PluginLoad { .. }), "{missing}");
}

#[test]
fn the_installed_plugin_reports_a_supported_version() {
    let plugin = Plugin::find(Platform::Cpu).unwrap();
    let (major, minor) = plugin.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 81, "minor {minor}");
    assert!(
        plugin.attributes().iter().any(|(name, _)| name.contains("stablehlo")),
        "{:?}",
        plugin.attributes()
    );
}

#[test]
fn compile_options_that_would_abort_xla_are_refused() {
    let client = cpu_client(2);
    let program = matmul_program(2, 2, 2, ElementType::F32);
    let bad = [
        (
            CompileOptions {
                num_replicas: 0,
                ..CompileOptions::default()
            },
            "at least 1",
        ),
        (
            CompileOptions {
                num_partitions: 0,
                ..CompileOptions::default()
            },
            "at least 1",
        ),
        (
            CompileOptions {
                num_replicas: 3,
                ..CompileOptions::default()
            },
            "need 3 devices, the client has 2",
        ),
        (
            CompileOptions {
                num_replicas: 2,
                num_partitions: 1,
                device_assignment: Some(vec![vec![0]]),
            },
            "2 replicas × 1 partitions",
        ),
        (
            CompileOptions {
                num_replicas: 1,
                num_partitions: 1,
                device_assignment: Some(vec![vec![7]]),
            },
            "device 7",
        ),
        (
            CompileOptions {
                num_replicas: 2,
                num_partitions: 1,
                device_assignment: Some(vec![vec![1], vec![1]]),
            },
            "device 1 twice",
        ),
    ];
    for (options, needle) in bad {
        let error = client.compile(&program, &options).unwrap_err();
        assert!(matches!(error, Error::CompileOptions(_)), "{error}");
        assert!(error.to_string().contains(needle), "{error} should contain {needle}");
    }
    assert_eq!(client.compile_stats().compiles, 0);

    let two = client
        .compile(&program, &CompileOptions::replicated(client.devices()))
        .unwrap();
    let a = client
        .buffer_from_host(&[1.0f32; 4], &[2, 2], client.device(0).unwrap())
        .unwrap();
    let error = two.execute(&[&a, &a]).unwrap_err();
    assert!(
        matches!(
            error,
            Error::DeviceCount {
                expected: 2,
                found: 1,
                ..
            }
        ),
        "{error}"
    );
}
