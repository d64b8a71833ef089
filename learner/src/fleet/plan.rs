//! The rollout fleet a run asks for (`[rollout]`: workers to call, a
//! registry to listen on, in-process engines) and building it: engines on
//! the client's devices with the policy's weights in the engine dtype,
//! workers reached with the shared token (over TLS where configured).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::WeightSource;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_worker::{AuthToken, ClientTls, PushOptions, ServerTls};
use grpo_xla::{Client, Device};

use super::{Fleet, FleetConfig, LocalFleet, WorkerFleet};
use crate::config::RolloutSection;
use crate::error::{Error, Result};

/// The rollout fleet `[rollout]` asks for.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// How the fleet pushes weights and watches its workers.
    pub config: FleetConfig,
    /// Worker addresses to call.
    pub workers: Vec<String>,
    /// Where to take worker registrations.
    pub listen: Option<SocketAddr>,
    /// Whether the in-process engines generate too.
    pub in_process: bool,
    /// In-process engines, one per device.
    pub engines: usize,
    /// The CA file workers' certificates must chain to (`rollout.tls_ca`).
    pub tls_ca: Option<PathBuf>,
    /// The registry's certificate and key files (`rollout.tls_cert`, `rollout.tls_key`).
    pub registry_tls: Option<(PathBuf, PathBuf)>,
}

/// What the fleet's in-process engines are made of.
pub struct EngineParts<'a> {
    /// The device client.
    pub client: &'a Client,
    /// The policy's decoder.
    pub decoder: &'a Decoder,
    /// The policy's starting weights.
    pub weights: &'a dyn WeightSource,
    /// The tokenizer (for completion text).
    pub tokenizer: Arc<Tokenizer>,
    /// Slots, longest sequence and dtype of each engine.
    pub config: EngineConfig,
}

impl FleetPlan {
    /// The fleet `rollout` asks for (validated as it was read).
    pub fn of(rollout: &RolloutSection) -> FleetPlan {
        FleetPlan {
            config: FleetConfig {
                push: PushOptions {
                    dtype: rollout.weight_dtype.wire(),
                    ..PushOptions::default()
                },
                heartbeat: rollout.heartbeat_s.duration(),
                timeout: rollout.worker_timeout_s.duration(),
                wait: rollout.worker_wait_s.duration(),
            },
            workers: rollout.workers.clone(),
            listen: rollout.listen,
            in_process: rollout.in_process(),
            engines: rollout.engines,
            tls_ca: rollout.tls_ca.clone(),
            registry_tls: rollout.tls_cert.clone().zip(rollout.tls_key.clone()),
        }
    }

    /// What the learner trusts when it calls workers.
    fn dial(&self) -> Result<ClientTls> {
        match &self.tls_ca {
            Some(ca) => ClientTls::from_ca_file(ca).map_err(|e| Error::Config {
                field: "rollout.tls_ca",
                message: e.to_string(),
            }),
            None => Ok(ClientTls::default()),
        }
    }

    /// The registry's TLS identity, if it serves TLS.
    fn registry_tls(&self) -> Result<Option<ServerTls>> {
        let Some((cert, key)) = &self.registry_tls else {
            return Ok(None);
        };
        ServerTls::from_pem_files(cert, key)
            .map(Some)
            .map_err(|e| Error::Config {
                field: "rollout.tls_cert",
                message: e.to_string(),
            })
    }

    /// Whether one in-process engine is the whole fleet (no workers, no registry).
    pub fn local_only(&self) -> bool {
        self.workers.is_empty() && self.listen.is_none() && self.engines == 1
    }

    /// Builds the fleet: in-process engines made of `engine`, workers
    /// reached with the token `token` gives (only called when there are
    /// workers to call or a registry to open).
    pub fn build(&self, engine: &EngineParts<'_>, token: impl Fn() -> Result<AuthToken>) -> Result<Box<dyn Fleet>> {
        let devices = engine.client.devices();
        if self.engines > devices.len() {
            return Err(Error::Config {
                field: "rollout.engines",
                message: format!(
                    "{} needs as many devices; the client has {} (on CPU: grpo run --cpu-devices {})",
                    self.engines,
                    devices.len(),
                    self.engines
                ),
            });
        }
        if self.local_only() {
            return Ok(Box::new(LocalFleet::new(engine.on(&devices[0])?)));
        }
        let dial = self.dial()?;
        let mut fleet = WorkerFleet::new(self.config, engine.decoder.config().vocab_size)?;
        if !self.workers.is_empty() {
            fleet.add_workers(&self.workers, &token()?, &dial)?;
        }
        if let Some(addr) = self.listen {
            let bound = fleet.listen(addr, token()?, self.registry_tls()?, dial)?;
            tracing::info!("taking rollout worker registrations on {bound} (grpo worker --learner {bound})");
        }
        if self.in_process {
            for device in &devices[..self.engines] {
                let name = match self.engines {
                    1 => "in-process".to_string(),
                    _ => format!("in-process (device {})", device.id()),
                };
                fleet.add_engine(name, engine.on(device)?);
            }
        }
        Ok(Box::new(fleet))
    }
}

impl EngineParts<'_> {
    /// An engine on `device` with the weights uploaded in its dtype.
    fn on(&self, device: &Device) -> Result<Engine> {
        let weights = upload_parameters(self.client, device, self.decoder, self.weights, self.config.dtype)?;
        Ok(
            Engine::new(self.client, self.decoder.clone(), weights, self.config)?
                .with_tokenizer(self.tokenizer.clone()),
        )
    }
}
