//! The server driven by the official `openai` Python client: a real server
//! of the tiny fixture model with an API key on an ephemeral loopback port,
//! and `openai_client.py` run against it (completions and chat, with and
//! without streaming, n > 1, log-probs, seed reproducibility, include_usage,
//! `models.list`, `AuthenticationError`, `BadRequestError`, fields grpo
//! does not implement refused by name).
//!
//! The interpreter is the test venv's (`tools/test_python.rs`): the test
//! fails, never skips, when the client is missing.

mod common;
#[path = "../../tools/test_python.rs"]
mod test_python;

use std::path::Path;

use common::{MODEL, start};
use grpo_serving::auth::ApiKey;

const KEY: &str = "openai-client-test-key";

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_works() {
    let python = test_python::test_python();
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
