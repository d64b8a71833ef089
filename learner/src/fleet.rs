//! Where the loop's rollouts come from, and how new weights reach them:
//!
//! - [`LocalFleet`]: the in-process engine on the learner's device. New
//!   weights are handed over in memory ([`Engine::update_weights`]): the
//!   documented fast path, with nothing serialized.
//! - [`RemoteFleet`]: rollout workers (`grpo worker`) over gRPC. A step's
//!   requests are spread over the workers (each queues what it cannot run
//!   at once), and after every step the learner streams the named tensors
//!   to every worker in checksummed chunks (f32 or bf16), versioned; a
//!   worker that refuses or fails an update stops the run with its error.
//!   At the start the learner pushes its weights too, so every worker
//!   serves the learner's policy (a resumed run's, or a fresh one's) before
//!   it gets work. Every completion's tokens must carry the version pushed
//!   last: a worker that restarted (and serves its start-up weights) stops
//!   the run with an error naming it instead of training on the wrong policy.
//!
//! Both report the bytes moved, so the loop logs the weight-sync rate.

use std::time::Instant;

use grpo_model::weights::HostTensor;
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::output::Completion;
use grpo_rollout::request::Request;
use grpo_rollout::worker::{PushOptions, Token, WorkerClient, WorkerError};
use grpo_xla::Buffer;

use crate::checkpoint::host_tensors;
use crate::error::{Error, Result};

/// What one weight sync moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncReport {
    /// Bytes of tensor values sent (over all workers).
    pub bytes: u64,
    /// Seconds it took.
    pub seconds: f64,
}

impl SyncReport {
    /// The rate in GB/s (10⁹ bytes).
    pub fn gb_per_second(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

/// A set of rollout engines the loop generates with (movable to the
/// rollout thread of [`crate::rollouts`]).
pub trait Fleet: Send {
    /// The completions of every request, in request order (each request's
    /// samples by index).
    fn generate(&mut self, requests: &[Request]) -> Result<Vec<Vec<Completion>>>;

    /// Installs `tensors` as policy `version` everywhere.
    fn update_weights(&mut self, version: u64, tensors: &[(String, HostTensor)]) -> Result<SyncReport>;

    /// Marks the weights the fleet was built with as policy `version`
    /// (a resumed run's engine holds its checkpoint's weights). Workers,
    /// whose weights the learner does not know, get `params` (named device
    /// buffers) pushed; the in-process engine needs no copy of them.
    fn start_at(&mut self, version: u64, params: &[(&str, &Buffer)]) -> Result<()>;
}

/// Bytes of `tensors` as f32 values.
fn f32_bytes(tensors: &[(String, HostTensor)]) -> u64 {
    tensors.iter().map(|(_, t)| t.data.len() as u64 * 4).sum()
}

/// The in-process engine.
pub struct LocalFleet {
    engine: Engine,
}

impl LocalFleet {
    /// A fleet of `engine` alone.
    pub fn new(engine: Engine) -> LocalFleet {
        LocalFleet { engine }
    }
}

impl Fleet for LocalFleet {
    fn generate(&mut self, requests: &[Request]) -> Result<Vec<Vec<Completion>>> {
        Ok(self.engine.generate(requests)?)
    }

    fn update_weights(&mut self, version: u64, tensors: &[(String, HostTensor)]) -> Result<SyncReport> {
        let started = Instant::now();
        self.engine.update_weights(version, tensors, InFlight::Keep)?;
        Ok(SyncReport {
            bytes: f32_bytes(tensors),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    fn start_at(&mut self, version: u64, _params: &[(&str, &Buffer)]) -> Result<()> {
        Ok(self.engine.update_weights(version, &[], InFlight::Keep)?)
    }
}

/// Rollout workers over gRPC.
pub struct RemoteFleet {
    runtime: tokio::runtime::Runtime,
    workers: Vec<(String, WorkerClient)>,
    options: PushOptions,
    /// The version every worker was last given.
    version: Option<u64>,
}

fn worker_error(endpoint: &str, e: WorkerError) -> Error {
    Error::Worker {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    }
}

impl RemoteFleet {
    /// Connects to every worker at `endpoints` (`host:port` or URLs) with
    /// the shared `token`; weights travel as `options` say.
    pub fn connect(endpoints: &[String], token: &Token, options: PushOptions) -> Result<RemoteFleet> {
        if endpoints.is_empty() {
            return Err(Error::Config {
                field: "rollout.workers",
                message: "no worker addresses".to_string(),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                field: "rollout.workers",
                message: format!("cannot start the gRPC runtime: {e}"),
            })?;
        let workers = runtime.block_on(async {
            let mut workers = Vec::with_capacity(endpoints.len());
            for endpoint in endpoints {
                let client = WorkerClient::connect(endpoint, token)
                    .await
                    .map_err(|e| worker_error(endpoint, e))?;
                workers.push((endpoint.clone(), client));
            }
            Ok::<_, Error>(workers)
        })?;
        Ok(RemoteFleet {
            runtime,
            workers,
            options,
            version: None,
        })
    }
}

/// An error when `group`, from the worker at `endpoint`, holds a token not
/// sampled under `version`.
fn check_version(endpoint: &str, version: Option<u64>, group: &[Completion]) -> Result<()> {
    let Some(version) = version else {
        return Ok(());
    };
    match group.iter().flat_map(|c| &c.versions).find(|&&v| v != version) {
        None => Ok(()),
        Some(served) => Err(Error::Worker {
            endpoint: endpoint.to_string(),
            message: format!(
                "served policy version {served}, not version {version} it was given (did it restart?); \
                 restart the worker, then resume the run with --resume"
            ),
        }),
    }
}

impl Fleet for RemoteFleet {
    fn generate(&mut self, requests: &[Request]) -> Result<Vec<Vec<Completion>>> {
        let calls: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let (endpoint, client) = &self.workers[i % self.workers.len()];
                let (endpoint, mut client, request) = (endpoint.clone(), client.clone(), request.clone());
                let version = self.version;
                self.runtime.spawn(async move {
                    let samples = client
                        .generate(&request)
                        .await
                        .map_err(|e| worker_error(&endpoint, e))?;
                    let group = samples.all().await.map_err(|e| worker_error(&endpoint, e))?;
                    check_version(&endpoint, version, &group)?;
                    Ok::<_, Error>(group)
                })
            })
            .collect();
        self.runtime.block_on(async {
            let mut groups = Vec::with_capacity(calls.len());
            for call in calls {
                groups.push(call.await.map_err(|e| Error::Worker {
                    endpoint: "generate".to_string(),
                    message: e.to_string(),
                })??);
            }
            Ok(groups)
        })
    }

    fn update_weights(&mut self, version: u64, tensors: &[(String, HostTensor)]) -> Result<SyncReport> {
        let started = Instant::now();
        let options = self.options;
        self.runtime.block_on(async {
            for (endpoint, client) in &mut self.workers {
                client
                    .push_weights(version, tensors, &options)
                    .await
                    .map_err(|e| worker_error(endpoint, e))?;
            }
            Ok::<_, Error>(())
        })?;
        self.version = Some(version);
        let per_worker = f32_bytes(tensors) / 4 * options.dtype.element_bytes() as u64;
        Ok(SyncReport {
            bytes: per_worker * self.workers.len() as u64,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    fn start_at(&mut self, version: u64, params: &[(&str, &Buffer)]) -> Result<()> {
        let tensors: Vec<_> = host_tensors(params)?;
        self.update_weights(version, &tensors).map(|_| ())
    }
}
