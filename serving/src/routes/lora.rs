//! vLLM's run-time adapter routes: `POST /v1/load_lora_adapter`
//! (`{"lora_name", "lora_path"}`) and `POST /v1/unload_lora_adapter`
//! (`{"lora_name"}`), answering `200` with vLLM's plain-text success line.
//! They answer only on a server started with `--enable-lora` and run-time
//! updating allowed ([`crate::ServerConfig::allow_runtime_lora_updating`]),
//! and behind the API key when there is one.

use axum::extract::State;
use serde::Deserialize;

use crate::adapters;
use crate::error::{Error, Result};
use crate::json::JsonBody;
use crate::state::AppState;

/// The body of `/v1/load_lora_adapter`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadAdapter {
    /// The name requests will use.
    lora_name: String,
    /// A PEFT adapter folder on the server's machine.
    lora_path: String,
}

/// The body of `/v1/unload_lora_adapter`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnloadAdapter {
    /// The adapter's name.
    lora_name: String,
}

/// Refuses run-time adapter route `path` of a server that keeps them off.
fn check_allowed(state: &AppState, path: &'static str) -> Result<()> {
    if state.config.enable_lora && state.config.allow_runtime_lora_updating {
        Ok(())
    } else {
        Err(Error::AdapterUpdatesOff { path })
    }
}

/// `POST /v1/load_lora_adapter`.
pub async fn load(State(state): State<AppState>, JsonBody(request): JsonBody<LoadAdapter>) -> Result<String> {
    check_allowed(&state, "/v1/load_lora_adapter")?;
    adapters::load(&state, &request.lora_name, &request.lora_path).await?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        request.lora_name
    ))
}

/// `POST /v1/unload_lora_adapter`.
pub async fn unload(State(state): State<AppState>, JsonBody(request): JsonBody<UnloadAdapter>) -> Result<String> {
    check_allowed(&state, "/v1/unload_lora_adapter")?;
    adapters::unload(&state, &request.lora_name).await?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        request.lora_name
    ))
}
