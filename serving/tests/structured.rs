//! Structured outputs and forced tool calls, driven by the official
//! `openai` Python client (`structured_client.py`, with `jsonschema`)
//! against a server of the tiny random model with the Hermes tools
//! template: JSON schemas (whole and streamed), `json_object`, regex and
//! choice guides, `tool_choice` `required` and named, at least 50 samples
//! each, and invalid guides refused with a 400.
//!
//! The interpreter is the test venv's (`tools/test_python.rs`): the test
//! fails, never skips, when the client is missing.

mod common;

use common::{MODEL, run_client_script, start_with_len};

const TOOLS_TEMPLATE: &str = include_str!("../../model/templates/chatml_tools.jinja");

#[tokio::test(flavor = "multi_thread")]
async fn guided_answers_hold_to_their_grammar_for_the_openai_client() {
    let server = start_with_len(16, 1024, |config| {
        config.chat_template = Some(TOOLS_TEMPLATE.to_string())
    })
    .await;
    run_client_script(
        "structured_client.py",
        &[server.base.as_str(), MODEL],
        "all structured output checks passed",
    )
    .await;
    server.shutdown().await;
}
