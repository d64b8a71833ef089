//! `GET /v1/models`, `GET /health` (200, or 503 once the engine is down),
//! `GET /version` and `GET /metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::error::{Error, Result};
use crate::protocol::models::{ModelCard, ModelList, Version};
use crate::state::AppState;

/// `GET /v1/models`: the served model, then its adapters by name (each
/// with its folder as `root` and the model as `parent`, as vLLM lists them).
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let base = ModelCard {
        id: state.model.name.clone(),
        object: "model",
        created: state.started,
        owned_by: "grpo",
        root: state.model.root.clone(),
        parent: None,
        max_model_len: Some(state.model.max_model_len),
    };
    let adapters = state.adapters.list().into_iter().map(|(name, adapter)| ModelCard {
        id: name,
        object: "model",
        created: adapter.created,
        owned_by: "grpo",
        root: adapter.path,
        parent: Some(state.model.name.clone()),
        max_model_len: None,
    });
    Json(ModelList {
        object: "list",
        data: std::iter::once(base).chain(adapters).collect(),
    })
}

/// `GET /health`: an empty 200 while the engine runs, answered at once
/// (it does not wait for the engine's step in progress), else a 503.
pub async fn health(State(state): State<AppState>) -> Result<()> {
    if state.backend.is_running() {
        Ok(())
    } else {
        Err(Error::Engine(grpo_rollout::Error::EngineStopped {
            reason: "its thread has ended".to_string(),
        }))
    }
}

/// `GET /version`.
pub async fn version() -> Json<Version> {
    Json(Version {
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// `GET /metrics`, in Prometheus' text format.
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse> {
    let stats = state.backend.stats().await?;
    let text = state.metrics.render(&stats);
    Ok(([(CONTENT_TYPE, grpo_metrics::CONTENT_TYPE)], text))
}
