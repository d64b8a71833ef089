//! Running the `grpo` binary from integration tests.

#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

use grpo_xla::{Platform, PluginSearch};

/// The installed CPU plugin, so runs with a fresh cache folder skip setup.
pub fn cpu_plugin() -> PathBuf {
    PluginSearch::from_environment(Platform::Cpu)
        .find(Platform::Cpu)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `grpo ARGS` with the cache folder `cache`.
pub fn grpo(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(args)
        .env("GRPO_CACHE_DIR", cache)
        .env("GRPO_PJRT_PLUGIN", cpu_plugin())
        .output()
        .unwrap()
}

/// `grpo ARGS` with the real cache folder (for the bundled model).
pub fn grpo_installed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo")).args(args).output().unwrap()
}

/// The stdout of a run that must have succeeded.
pub fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "grpo failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A tiny random llama (`grpo init-model --preset tiny`) at `dir/tiny`, made once.
pub fn tiny_model(dir: &std::path::Path) -> PathBuf {
    let model = dir.join("tiny");
    if !model.exists() {
        stdout(&grpo_installed(&[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "tiny",
            "--out",
            model.to_str().unwrap(),
        ]));
    }
    model
}
