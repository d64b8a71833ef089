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

use common::{MODEL, run_client_script, start};
use grpo_serving::auth::ApiKey;

const KEY: &str = "openai-client-test-key";

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_works() {
    let server = start(4, |config| config.api_key = Some(ApiKey::new(KEY))).await;
    run_client_script(
        "openai_client.py",
        &[server.base.as_str(), KEY, MODEL],
        "all openai client checks passed",
    )
    .await;
    server.shutdown().await;
}
