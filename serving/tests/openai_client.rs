//! The server driven by the official `openai` Python client: a real server
//! of the tiny fixture model with an API key on an ephemeral loopback port,
//! and `openai_client.py` run against it (completions and chat, with and
//! without streaming, n > 1, log-probs, seed reproducibility, include_usage,
//! `models.list`, `AuthenticationError`, `BadRequestError`).
//!
//! The interpreter is `$GRPO_OPENAI_PYTHON` (`scripts/test.sh` sets it from
//! `tools/openai-venv.sh`); when unset the test runs `tools/openai-venv.sh`
//! itself. Either way it fails, never skips, when the client is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{MODEL, start};
use grpo_serving::auth::ApiKey;

const KEY: &str = "openai-client-test-key";

/// The venv's interpreter: `$GRPO_OPENAI_PYTHON`, or what `tools/openai-venv.sh` prints.
fn openai_python() -> PathBuf {
    if let Some(python) = std::env::var_os("GRPO_OPENAI_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/openai-venv.sh");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed ({}): the openai Python client could not be installed",
        script.display(),
        output.status
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("openai-venv.sh printed no interpreter")
            .trim(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_works() {
    let python = openai_python();
    let check = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        check.status.success(),
        "{} cannot import openai: {}",
        python.display(),
        String::from_utf8_lossy(&check.stderr)
    );

    let server = start(4, |config| config.api_key = Some(ApiKey::new(KEY))).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .args([server.base.as_str(), KEY, MODEL])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "openai_client.py failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(stdout.contains("all openai client checks passed"), "{stdout}");
    server.shutdown().await;
}
