//! Running the `grpo` binary from integration tests.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
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

/// A run config for a tiny random model in `dir`, with `extra` appended
/// (later keys of a section are refused by TOML, so `extra` adds tables).
/// Its dtypes are pinned to f32, so its numbers do not depend on a probe.
pub fn tiny_run(dir: &Path, trainer: &str) -> PathBuf {
    let model = tiny_model(dir);
    let rows: String = (0..12)
        .map(|i| format!("{{\"prompt\": \"Say {}:\", \"answer\": \"{}\"}}\n", i % 10, i % 10))
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\nname = {model:?}\n\n[data]\npath = \"data.jsonl\"\neval_size = 2\n\n[rollout]\ngroup_size = 2\nprompts_per_step = 2\nmax_completion_tokens = 4\nmax_model_len = 32\ndtype = \"f32\"\n\n[optimizer]\nlr = 1e-3\n\n[trainer]\nmicro_batch_size = 4\ncompute_dtype = \"f32\"\n{trainer}\n\n[logging]\nout = \"out\"\n\n[[reward]]\ntype = \"regex\"\npattern = \"^ [a-m]\"\n"
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// The JSON lines of `path`.
pub fn lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `grpo logprobs` of the lines of `input` under `model` (with `--adapter`
/// when given), which must succeed: each line's log-probs.
pub fn logprobs(model: &Path, adapter: Option<&Path>, input: &Path) -> Vec<Vec<f64>> {
    let mut args = vec![
        "logprobs",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    if let Some(adapter) = adapter {
        args.extend(["--adapter", adapter.to_str().unwrap()]);
    }
    stdout(&grpo_installed(&args))
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            value["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// The address a server started as `child` (stdout piped) prints on its
/// first line, `listening on ADDR`.
pub fn listening_address(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("a piped stdout"))
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not an address: {line:?}"))
        .to_string()
}

/// `grpo ARGS` (real cache folder), which must succeed.
pub fn run_ok(args: &[&str]) {
    let out = grpo_installed(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Starts `grpo ARGS` (real cache folder) and kills it with SIGKILL as
/// soon as `ready()` holds, which must happen while it still runs and
/// within 15 minutes.
pub fn kill_when(args: &[&str], ready: impl Fn() -> bool) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !ready() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended too early");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(900),
            "not ready in 15 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run must still be working when it is killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Asserts that two checkpoint folders hold the same parameters, optimizer
/// state and loop state, byte for byte.
pub fn assert_same_checkpoint(a: &Path, b: &Path) {
    let policy = if a.join("adapter_model.safetensors").is_file() {
        "adapter_model.safetensors"
    } else {
        "model.safetensors"
    };
    for file in [policy, "optimizer.safetensors", "trainer_state.json"] {
        let (x, y) = (
            std::fs::read(a.join(file)).unwrap(),
            std::fs::read(b.join(file)).unwrap(),
        );
        assert!(x == y, "{file} differs between {} and {}", a.display(), b.display());
    }
}

/// The model crate's test fixtures.
pub fn model_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("model/tests/fixtures")
}

/// The parity model of `family` with the tiny fixture tokenizer, in
/// `dir/model` (merge writes the tokenizer into its folder; serving needs one).
pub fn model_with_tokenizer(dir: &Path, family: &str) -> PathBuf {
    let fixtures = model_fixtures();
    let (base, model) = (fixtures.join("parity").join(family), dir.join("model"));
    std::fs::create_dir(&model).unwrap();
    for (from, name) in [
        (&base, "config.json"),
        (&base, "model.safetensors"),
        (&fixtures.join("tokenizer/tiny"), "tokenizer.json"),
        (&fixtures.join("tokenizer/tiny"), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(name), model.join(name)).unwrap();
    }
    model
}

/// One HTTP/1.0 request to `addr` (JSON body when given); the status and body.
pub fn http(addr: &str, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, String) {
    use std::io::{Read, Write};
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let (_, text) = answer.split_once("\r\n\r\n").unwrap();
    (status, text.to_string())
}

/// `grpo serve ARGS` (with `--port 0`) started in the background: the
/// child (killed when dropped) and the address it listens on.
pub fn serve<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_grpo"))
        .arg("serve")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening_address(&mut child);
    (Server(child), addr)
}

/// A running `grpo serve`, stopped when dropped.
pub struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
