//! grpo-serving: an OpenAI / vLLM-compatible HTTP server on the rollout engine.
//!
//! Layers, outermost first: [`routes`] (HTTP, with [`auth`] and the body
//! limit) → [`validate`] (requests into engine requests, 400s naming the
//! field) → [`backend`] (a trait returning a stream of sample updates per
//! request, over the engine's actor handle) → the engine. [`protocol`]
//! holds the JSON types, [`sse`] the event stream, [`metrics`] the
//! vLLM-named Prometheus registry, [`error`] the one error type and its
//! HTTP mapping.
//!
//! [`adapters`] serves LoRA adapters by name.
//!
//! [`Server::bind`] takes an engine and its tokenizer, listens, and
//! [`Server::serve`] runs until a shutdown future resolves: it then stops
//! accepting, lets running requests finish for [`ServerConfig::shutdown_grace`],
//! aborts what still runs, and returns.

#![warn(missing_docs)]

pub mod adapters;
pub mod admission;
pub mod auth;
pub mod backend;
pub mod blocking;
pub mod error;
pub mod json;
pub mod metrics;
pub mod model;
pub mod protocol;
pub mod routes;
pub mod sse;
pub mod state;
pub mod structured;
pub mod tools;
pub mod unsupported;
pub mod validate;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use grpo_model::chat::ChatTemplate;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::ToolCallFormat;
use grpo_rollout::engine::Engine;
use grpo_rollout::handle::{EngineHandle, PauseMode};
use tokio::net::TcpListener;

pub use error::{Error, Result};

use crate::admission::RequestLimits;
use crate::auth::ApiKey;
use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::model::ServedModel;
use crate::state::AppState;

/// Largest request body by default: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// How the server presents itself and what it accepts.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name requests use and responses carry.
    pub served_model_name: String,
    /// The model as `--model` named it (`root` in `/v1/models`).
    pub model_root: String,
    /// The key every request but `/health`, `/version` and `/metrics` must
    /// carry as `Authorization: Bearer KEY`. Default none.
    pub api_key: Option<ApiKey>,
    /// Largest request body, in bytes. Default 8 MiB.
    pub max_body_bytes: usize,
    /// How long running requests may go on after shutdown begins before
    /// they are aborted. Default 30 s.
    pub shutdown_grace: Duration,
    /// Whether the control routes that change the server (`/pause`,
    /// `/resume`, `/update_weights_from_disk`) answer without an API key
    /// (with one they always answer, to its holders). Default false.
    pub enable_control_routes: bool,
    /// Bounds on one request and on requests at once.
    pub limits: RequestLimits,
    /// A chat template (Jinja source) used instead of the tokenizer's,
    /// as vLLM's `--chat-template`. Default none: the tokenizer's.
    pub chat_template: Option<String>,
    /// Serve LoRA adapters by name (vLLM's `--enable-lora`; the engine
    /// needs adapter slots). Default false.
    pub enable_lora: bool,
    /// Let `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` change
    /// the adapters while serving (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`). Default false.
    pub allow_runtime_lora_updating: bool,
}

impl ServerConfig {
    /// Defaults for a model called `name`.
    pub fn new(name: impl Into<String>) -> ServerConfig {
        let name = name.into();
        ServerConfig {
            served_model_name: name.clone(),
            model_root: name,
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            shutdown_grace: Duration::from_secs(30),
            enable_control_routes: false,
            limits: RequestLimits::default(),
            chat_template: None,
            enable_lora: false,
            allow_runtime_lora_updating: false,
        }
    }

    /// Whether the control routes answer: behind an API key, or enabled.
    pub fn control_routes(&self) -> bool {
        self.api_key.is_some() || self.enable_control_routes
    }
}

/// A bound server, ready to serve.
pub struct Server {
    listener: TcpListener,
    state: AppState,
}

impl Server {
    /// Puts `engine` (detokenizing with `tokenizer`) on its thread and listens on `addr`.
    pub async fn bind(
        addr: SocketAddr,
        engine: Engine,
        tokenizer: Arc<Tokenizer>,
        config: ServerConfig,
    ) -> Result<Server> {
        let source = config.chat_template.as_deref().or(tokenizer.chat_template());
        let chat_template = source.map(ChatTemplate::new).transpose()?;
        let tool_format = ToolCallFormat::of_template(source.unwrap_or_default());
        let model = ServedModel {
            name: config.served_model_name.clone(),
            root: config.model_root.clone(),
            config: engine.decoder().config().clone(),
            max_model_len: engine.config().max_model_len,
            max_num_seqs: engine.config().max_num_seqs,
            longest_token_bytes: model::longest_token_bytes(&tokenizer),
            parameters: engine.decoder().base_parameters().to_vec(),
            tokenizer: tokenizer.clone(),
            chat_template,
            tool_format,
            eos_token_ids: engine.decoder().config().eos_token_ids.clone(),
        };
        let backend = EngineHandle::spawn(engine.with_tokenizer(tokenizer));
        Server::bind_backend(addr, Arc::new(backend), model, config).await
    }

    /// Listens on `addr`, serving `model` from any `backend`.
    pub async fn bind_backend(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        model: ServedModel,
        config: ServerConfig,
    ) -> Result<Server> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let state = AppState {
            admission: Arc::new(tokio::sync::Semaphore::new(config.limits.max_concurrent_requests)),
            generating: Arc::default(),
            backend,
            adapters: Arc::default(),
            metrics: Arc::new(Metrics::new(&model.name)),
            model: Arc::new(model),
            config: Arc::new(config),
            started: routes::generate::unix_now(),
        };
        Ok(Server { listener, state })
    }

    /// Loads the PEFT adapter folder `path` to serve as `name` (as
    /// `/v1/load_lora_adapter` does; see [`routes::lora::load_adapter`]).
    pub async fn load_adapter(&self, name: &str, path: &str) -> Result<()> {
        routes::lora::load_adapter(&self.state, name, path).await
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then drains (see the crate docs).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let backend: Arc<dyn Backend> = self.state.backend.clone();
        let grace = self.state.config.shutdown_grace;
        let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            let _ = stopping.send(());
        };
        // After the grace period, abort whatever still runs so the open
        // streams end and the connections close.
        let reaper = tokio::spawn(async move {
            if stopped.await.is_ok() {
                tokio::time::sleep(grace).await;
                let _ = backend.pause(PauseMode::Abort).await;
            }
        });
        let app = routes::router(self.state);
        let served = axum::serve(self.listener, app).with_graceful_shutdown(signal).await;
        reaper.abort();
        served.map_err(Error::Serve)
    }
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
