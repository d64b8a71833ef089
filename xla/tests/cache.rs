//! The compile cache: memory hits in one process, disk hits in a fresh one.

mod common;

use common::matmul_program;
use grpo_xla::{Client, ClientOptions, CompileOptions, CompileStats, ElementType, Platform, Plugin};

/// Set in the child process: the cache folder to reuse.
const CHILD_CACHE_DIR: &str = "GRPO_XLA_TEST_CHILD_CACHE_DIR";

fn client_with_cache(dir: &std::path::Path) -> Client {
    let plugin = Plugin::find(Platform::Cpu).unwrap_or_else(|e| panic!("{e}"));
    Client::new(
        &plugin,
        ClientOptions::default().compile_cache_dir(Some(dir.to_path_buf())),
    )
    .unwrap()
}

fn run_matmul(client: &Client) -> Vec<f32> {
    let device = client.device(0).unwrap();
    let executable = client
        .compile(&matmul_program(4, 8, 2, ElementType::F32), &CompileOptions::default())
        .unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32 / 8.0).collect();
    let b: Vec<f32> = (0..16).map(|i| 1.0 - i as f32 / 16.0).collect();
    let a = client.buffer_from_host(&a, &[4, 8], device).unwrap();
    let b = client.buffer_from_host(&b, &[8, 2], device).unwrap();
    executable.execute(&[&a, &b]).unwrap()[0].to_host::<f32>().unwrap()
}

#[test]
fn a_second_compile_is_a_memory_hit() {
    let dir = tempfile::tempdir().unwrap();
    let client = client_with_cache(dir.path());
    let first = run_matmul(&client);
    let second = run_matmul(&client);
    assert_eq!(first, second);
    assert_eq!(
        client.compile_stats(),
        CompileStats {
            compiles: 1,
            memory_hits: 1,
            disk_hits: 0
        }
    );
    // Other options are another program.
    client
        .compile(
            &matmul_program(4, 8, 2, ElementType::F32),
            &CompileOptions::on_device(client.device(0).unwrap()),
        )
        .unwrap();
    assert_eq!(client.compile_stats().compiles, 2);
}

#[test]
fn a_fresh_process_loads_the_program_from_disk() {
    if let Some(dir) = std::env::var_os(CHILD_CACHE_DIR) {
        // The child: everything must come from the parent's disk entries.
        let client = client_with_cache(std::path::Path::new(&dir));
        let result = run_matmul(&client);
        assert_eq!(
            client.compile_stats(),
            CompileStats {
                compiles: 0,
                memory_hits: 0,
                disk_hits: 1
            }
        );
        println!("child result {result:?}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = client_with_cache(dir.path());
    let want = run_matmul(&client);
    assert_eq!(client.compile_stats().compiles, 1);
    let entries = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(entries, 1, "one serialized executable on disk");

    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_fresh_process_loads_the_program_from_disk",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CACHE_DIR, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(&format!("child result {want:?}")), "{stdout}");
}

#[test]
fn a_corrupt_disk_entry_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let want = run_matmul(&client_with_cache(dir.path()));
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::write(entry.unwrap().path(), b"corrupt").unwrap();
    }
    let client = client_with_cache(dir.path());
    assert_eq!(run_matmul(&client), want);
    assert_eq!(
        client.compile_stats(),
        CompileStats {
            compiles: 1,
            memory_hits: 0,
            disk_hits: 0
        }
    );
}
