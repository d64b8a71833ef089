//! RL control routes like vLLM's: `POST /pause?mode=abort|wait|keep`,
//! `POST /resume`, `GET /is_paused`, and `POST /update_weights_from_disk`
//! (`{"model_path": DIR, "version": N, "abort_in_flight": false}`): every
//! parameter is read from the folder's safetensors (regular files named
//! inside the folder, read within [`LOAD_LIMIT`]) and checked before the
//! engine swaps any in; a checkpoint that does not fit is a 400 and the old
//! weights keep serving. The routes that change the server answer only
//! behind an API key or when enabled ([`crate::ServerConfig::control_routes`]);
//! otherwise they are a 403 saying how to turn them on.

use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use grpo_model::weights::{Safetensors, WeightSource};
use grpo_rollout::engine::InFlight;
use grpo_rollout::handle::PauseMode;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::json::JsonBody;
use crate::state::AppState;

/// How long reading a weight folder may take.
pub const LOAD_LIMIT: Duration = Duration::from_secs(300);

/// Refuses control route `path` of a server that keeps them off.
fn check_enabled(state: &AppState, path: &'static str) -> Result<()> {
    if state.config.control_routes() {
        Ok(())
    } else {
        Err(Error::ControlOff { path })
    }
}

/// The query of `/pause`.
#[derive(Debug, Deserialize)]
pub struct PauseQuery {
    /// `abort` (default), `wait` or `keep`.
    #[serde(default)]
    mode: Option<String>,
}

/// `{"status": ...}`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `paused` or `resumed`.
    status: &'static str,
}

/// `{"is_paused": bool}`.
#[derive(Debug, Serialize)]
pub struct IsPaused {
    /// Whether generation is paused.
    is_paused: bool,
}

/// `POST /pause?mode=…`.
pub async fn pause(State(state): State<AppState>, Query(query): Query<PauseQuery>) -> Result<Json<Status>> {
    check_enabled(&state, "/pause")?;
    let mode = match query.mode.as_deref().unwrap_or("abort") {
        "abort" => PauseMode::Abort,
        "wait" => PauseMode::Wait,
        "keep" => PauseMode::Keep,
        other => {
            return Err(Error::invalid(
                "mode",
                format!("mode `{other}` is not abort, wait or keep"),
            ));
        }
    };
    state.backend.pause(mode).await?;
    Ok(Json(Status { status: "paused" }))
}

/// `POST /resume`.
pub async fn resume(State(state): State<AppState>) -> Result<Json<Status>> {
    check_enabled(&state, "/resume")?;
    state.backend.resume().await?;
    Ok(Json(Status { status: "resumed" }))
}

/// `GET /is_paused`.
pub async fn is_paused(State(state): State<AppState>) -> Result<Json<IsPaused>> {
    let stats = state.backend.stats().await?;
    Ok(Json(IsPaused {
        is_paused: stats.paused,
    }))
}

/// The body of `/update_weights_from_disk`.
#[derive(Debug, Deserialize)]
pub struct UpdateWeights {
    /// A folder with `model.safetensors` (or an index and shards).
    model_path: String,
    /// The policy version the weights become.
    version: u64,
    /// End running samples (finish reason `abort`) instead of continuing them on the new weights.
    #[serde(default)]
    abort_in_flight: bool,
}

/// The answer of `/update_weights_from_disk`.
#[derive(Debug, Serialize)]
pub struct Updated {
    /// Always true (failures are errors).
    success: bool,
    /// The version now serving.
    version: u64,
    /// How many tensors were loaded.
    tensors: usize,
}

/// `POST /update_weights_from_disk`.
pub async fn update_weights_from_disk(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<UpdateWeights>,
) -> Result<Json<Updated>> {
    check_enabled(&state, "/update_weights_from_disk")?;
    let model = state.model.clone();
    let path = request.model_path.clone();
    let loading = tokio::task::spawn_blocking(move || -> Result<_> {
        let checkpoint = Safetensors::open_dir(&path)?;
        model
            .parameters
            .iter()
            .map(|spec| Ok((spec.name.clone(), checkpoint.tensor(&spec.name)?)))
            .collect::<Result<Vec<_>>>()
    });
    let tensors = tokio::time::timeout(LOAD_LIMIT, loading)
        .await
        .map_err(|_| Error::LoadTimeout {
            seconds: LOAD_LIMIT.as_secs(),
        })?
        .map_err(|e| Error::invalid("model_path", format!("loading the checkpoint failed: {e}")))??;
    let count = tensors.len();
    let in_flight = if request.abort_in_flight {
        InFlight::Abort
    } else {
        InFlight::Keep
    };
    state
        .backend
        .update_weights(request.version, tensors, in_flight)
        .await?;
    Ok(Json(Updated {
        success: true,
        version: request.version,
        tensors: count,
    }))
}
