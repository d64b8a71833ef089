//! What every route shares: the backend, the model, the metrics, the config.

use std::sync::Arc;

use grpo_rollout::adapters::AdapterId;

use crate::ServerConfig;
use crate::adapters::ServedAdapters;
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
    /// The LoRA adapters served by name.
    pub adapters: Arc<ServedAdapters>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The server's settings.
    pub config: Arc<ServerConfig>,
    /// When the server started (Unix seconds).
    pub started: u64,
}

/// What a request's `model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The name responses carry: the adapter's, or the served model's.
    pub name: String,
    /// The adapter that generates, if one is named.
    pub adapter: Option<AdapterId>,
}

impl AppState {
    /// What `model` names: the served model (also when missing) or one of
    /// its adapters; any other name is a 404 listing those served.
    pub fn resolve_model(&self, model: Option<&str>) -> crate::Result<Target> {
        let base = || Target {
            name: self.model.name.clone(),
            adapter: None,
        };
        match model {
            None => Ok(base()),
            Some(name) if name == self.model.name => Ok(base()),
            Some(name) => match self.adapters.get(name) {
                Some(adapter) => Ok(Target {
                    name: name.to_string(),
                    adapter: Some(adapter.id),
                }),
                None => {
                    let adapters = self.adapters.list().into_iter().map(|(n, _)| n);
                    let served: Vec<String> = std::iter::once(self.model.name.clone())
                        .chain(adapters)
                        .map(|n| format!("`{n}`"))
                        .collect();
                    Err(crate::Error::ModelNotFound {
                        model: name.to_string(),
                        served: served.join(", "),
                    })
                }
            },
        }
    }

    /// Refuses a request for a model this server does not serve (a missing name is fine).
    pub fn check_model(&self, model: Option<&str>) -> crate::Result<()> {
        self.resolve_model(model).map(|_| ())
    }
}
