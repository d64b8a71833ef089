//! vLLM's run-time adapter routes: `POST /v1/load_lora_adapter`
//! (`{"lora_name", "lora_path"}`) and `POST /v1/unload_lora_adapter`
//! (`{"lora_name"}`), answering `200` with vLLM's plain-text success line.
//! They answer only on a server started with `--enable-lora` and run-time
//! updating allowed ([`crate::ServerConfig::allow_runtime_lora_updating`]),
//! and behind the API key when there is one.
//!
//! Loading reads the PEFT folder off the async threads, checks it against
//! the model and the engine's slots (rank, layers, free slot) and only
//! then names it; one load or unload runs at a time.

use std::path::Path;

use axum::extract::State;
use grpo_model::lora::AdapterFolder;
use serde::Deserialize;

use crate::adapters::ServedAdapter;
use crate::error::{Error, Result};
use crate::json::JsonBody;
use crate::routes::generate::unix_now;
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
    load_adapter(&state, &request.lora_name, &request.lora_path).await?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        request.lora_name
    ))
}

/// `POST /v1/unload_lora_adapter`.
pub async fn unload(State(state): State<AppState>, JsonBody(request): JsonBody<UnloadAdapter>) -> Result<String> {
    check_allowed(&state, "/v1/unload_lora_adapter")?;
    unload_adapter(&state, &request.lora_name).await?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        request.lora_name
    ))
}

/// Loads the PEFT adapter folder `path` as `name`: refused (400) when the
/// server serves no adapters, the name is empty, the base model's or
/// taken, or the folder does not fit the model or the engine's slots; a
/// 404 when there is no adapter folder at `path`.
pub async fn load_adapter(state: &AppState, name: &str, path: &str) -> Result<()> {
    check_enabled(state)?;
    if name.is_empty() || path.is_empty() {
        return Err(Error::InvalidRequest {
            message: "Both 'lora_name' and 'lora_path' must be provided.".to_string(),
            param: None,
        });
    }
    if name == state.model.name {
        return Err(Error::invalid(
            "lora_name",
            format!("'{name}' is the base model's name: give the adapter another"),
        ));
    }
    let adapters = &state.adapters;
    let _changing = adapters.changing.lock().await;
    if adapters.get(name).is_some() {
        return Err(Error::invalid(
            "lora_name",
            format!("The lora adapter '{name}' has already been loaded."),
        ));
    }
    if !Path::new(path).join(grpo_model::lora::ADAPTER_CONFIG_FILE).is_file() {
        return Err(Error::AdapterNotFound {
            message: format!("Loading lora {name} failed: No adapter found for {path}"),
        });
    }
    let (config, dir) = (state.model.config.clone(), path.to_string());
    let folder = tokio::task::spawn_blocking(move || AdapterFolder::read(Path::new(&dir), &config))
        .await
        .map_err(|e| Error::invalid("lora_path", format!("reading the adapter failed: {e}")))?
        .map_err(|e| Error::invalid("lora_path", format!("Loading lora {name} failed: {e}")))?;
    let tensors = folder.tensors.into_iter().collect();
    let id = state
        .backend
        .load_adapter(folder.lora, tensors)
        .await
        .map_err(|e| Error::invalid("lora_path", format!("Loading lora {name} failed: {e}")))?;
    let served = ServedAdapter {
        id,
        path: path.to_string(),
        created: unix_now(),
    };
    adapters.insert(name, served);
    Ok(())
}

/// Unloads the adapter called `name`: its requests end as aborted. A 404
/// when no adapter has that name.
pub async fn unload_adapter(state: &AppState, name: &str) -> Result<()> {
    check_enabled(state)?;
    if name.is_empty() {
        return Err(Error::invalid(
            "lora_name",
            "'lora_name' needs to be provided to unload a LoRA adapter.",
        ));
    }
    let _changing = state.adapters.changing.lock().await;
    let served = state.adapters.remove(name).ok_or_else(|| Error::AdapterNotFound {
        message: format!("The lora adapter '{name}' cannot be found."),
    })?;
    state.backend.unload_adapter(served.id).await?;
    Ok(())
}

/// Refuses adapter loads on a server started without `--enable-lora`.
fn check_enabled(state: &AppState) -> Result<()> {
    if state.config.enable_lora {
        Ok(())
    } else {
        Err(Error::InvalidRequest {
            message: "LoRA is not enabled: start grpo serve with --enable-lora".to_string(),
            param: None,
        })
    }
}
