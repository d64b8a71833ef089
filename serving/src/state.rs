//! What every route shares: the backend, the model, the metrics, the config.

use std::sync::Arc;

use crate::ServerConfig;
use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::model::ServedModel;

/// The routes' shared state (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    /// Places of generation requests running at once ([`crate::admission`]).
    pub admission: Arc<tokio::sync::Semaphore>,
    /// Generation requests with prompts still running or waiting: each
    /// keeps its fair share of the engine's slots queued ([`crate::routes`]).
    pub generating: Arc<std::sync::atomic::AtomicUsize>,
    /// Where generation happens.
    pub backend: Arc<dyn Backend>,
    /// The served model.
    pub model: Arc<ServedModel>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The server's settings.
    pub config: Arc<ServerConfig>,
    /// When the server started (Unix seconds).
    pub started: u64,
}

impl AppState {
    /// Refuses a request for a model other than the served one (a missing name is fine).
    pub fn check_model(&self, model: Option<&str>) -> crate::Result<()> {
        match model {
            Some(name) if name != self.model.name => Err(crate::Error::ModelNotFound {
                model: name.to_string(),
                served: self.model.name.clone(),
            }),
            _ => Ok(()),
        }
    }
}
