//! The `grpo` binary end to end: devices, the matmul benchmark, the disk
//! compile cache across processes, and errors for bad choices.

use std::path::PathBuf;
use std::process::{Command, Output};

use grpo_xla::{Platform, PluginSearch};

/// The installed CPU plugin, so runs with a fresh cache folder skip setup.
fn cpu_plugin() -> PathBuf {
    PluginSearch::from_environment(Platform::Cpu)
        .find(Platform::Cpu)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn grpo(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(args)
        .env("GRPO_CACHE_DIR", cache)
        .env("GRPO_PJRT_PLUGIN", cpu_plugin())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "grpo failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn devices_lists_the_plugin_and_its_devices() {
    let cache = tempfile::tempdir().unwrap();
    let text = stdout(&grpo(cache.path(), &["devices", "--cpu-devices", "2"]));
    assert!(text.contains(&cpu_plugin().display().to_string()), "{text}");
    assert!(text.contains("PJRT API:  0."), "{text}");
    assert!(text.contains("devices:   2"), "{text}");
    assert!(text.contains("[1] id 1 kind cpu"), "{text}");
}

#[test]
fn bench_matmul_reports_rates_and_reuses_the_disk_cache() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "bench", "matmul", "--sizes", "32,64", "--dtypes", "f32,bf16", "--runs", "3", "--warmup", "1",
    ];
    let first = stdout(&grpo(cache.path(), &args));
    let rows: Vec<&str> = first
        .lines()
        .filter(|l| l.starts_with("f32") || l.starts_with("bf16"))
        .collect();
    assert_eq!(rows.len(), 4, "{first}");
    for row in rows {
        let rate: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{row}");
    }
    assert!(
        first.contains("programs: 4 compiled, 0 loaded from the disk cache"),
        "{first}"
    );
    let second = stdout(&grpo(cache.path(), &args));
    assert!(
        second.contains("programs: 0 compiled, 4 loaded from the disk cache"),
        "{second}"
    );
}

#[test]
fn bad_choices_are_errors_that_say_what_to_do() {
    let cache = tempfile::tempdir().unwrap();
    let platform = grpo(cache.path(), &["devices", "--platform", "gpu"]);
    assert!(!platform.status.success());
    let message = String::from_utf8_lossy(&platform.stderr);
    assert!(message.contains("choose cpu, cuda or tpu"), "{message}");

    let missing = grpo(cache.path(), &["devices", "--plugin", "/nonexistent/plugin.so"]);
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(message.contains("/nonexistent/plugin.so"), "{message}");

    let dtype = grpo(cache.path(), &["bench", "matmul", "--dtypes", "s32"]);
    let message = String::from_utf8_lossy(&dtype.stderr);
    assert!(
        !dtype.status.success() && message.contains("not a float type"),
        "{message}"
    );
}
