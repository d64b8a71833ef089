//! Where the loop's rollouts come from, and how new weights reach them:
//!
//! - [`LocalFleet`]: the in-process engine. New weights are handed over in
//!   memory: as copies made on the device when the engine shares the
//!   learner's ([`PolicyWeights::Device`], no host round trip), else as host
//!   tensors ([`Engine::update_weights`]), with nothing serialized.
//! - [`WorkerFleet`]: rollout workers (`grpo worker`) over gRPC — listed in
//!   the config, or announcing themselves to the learner's registry — and
//!   optionally the in-process engine beside them. Groups go to the member
//!   with the most free room; a worker that dies or stalls is found by its
//!   missed Health calls, its groups go to the others (each group's samples
//!   are taken from exactly one attempt), and a worker that comes back gets
//!   the current weights before it gets work (see [`pool`]).
//!
//! A request may name the member it prefers ([`Fleet::generate_preferring`]):
//! a multi-turn episode's later turns go where its earlier ones ran, whose
//! engine still keeps their tokens and computes only the new ones. A
//! preferred member that is not ready is passed over for the usual choice
//! (that turn is then prefilled whole there).
//!
//! Both report the bytes moved, so the loop logs the weight-sync rate.

mod member;
mod plan;
mod pool;

use std::sync::Arc;
use std::time::Instant;

use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;
use grpo_rollout::engine::{Engine, EngineStats, InFlight};
use grpo_rollout::output::Completion;
use grpo_rollout::request::Request;
use grpo_xla::{Buffer, ElementType};

use crate::error::Result;

pub use member::{Failure, check_answer};
pub use plan::{EngineParts, FleetPlan};
pub use pool::{FleetConfig, WorkerFleet};

/// A policy's named tensors (Hugging Face names), shared rather than copied
/// between the learner, the fleet and its members.
pub type HostWeights = Arc<[(String, HostTensor)]>;

/// New policy weights as the learner hands them to its fleet.
pub enum PolicyWeights {
    /// Named f32 host tensors: for any fleet.
    Host(HostWeights),
    /// Every parameter, in the decoder's order, copied on the device of the
    /// in-process engine in its dtype: only for a fleet whose
    /// [`Fleet::shared_device`] is that device and dtype.
    Device {
        /// The copies.
        buffers: Vec<Buffer>,
        /// Seconds the copy took (part of the sync's time).
        copy_seconds: f64,
    },
    /// LoRA adapters alone, as named f32 host tensors of the layout `lora`,
    /// which engines and workers apply beside the base weights they hold.
    Adapters {
        /// The adapters' layout.
        lora: LoraConfig,
        /// The adapter tensors.
        tensors: HostWeights,
    },
}

impl PolicyWeights {
    /// Bytes of the policy as f32 values (what a sync is measured by).
    fn f32_bytes(&self) -> u64 {
        match self {
            PolicyWeights::Host(tensors) | PolicyWeights::Adapters { tensors, .. } => f32_bytes(tensors),
            PolicyWeights::Device { buffers, .. } => buffers.iter().map(|b| b.element_count() as u64 * 4).sum(),
        }
    }
}

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

/// How a fleet stands, for the step's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct FleetHealth {
    /// Engines and workers it knows of.
    #[serde(rename = "fleet_members")]
    pub members: usize,
    /// Of those, the ones taking work (answering, on the current weights).
    #[serde(rename = "fleet_ready")]
    pub ready: usize,
    /// Groups given to another member after theirs failed, stalled or
    /// restarted, since the fleet started.
    #[serde(rename = "fleet_requeued_groups")]
    pub requeued_groups: u64,
}

/// A member of a fleet: its index, stable for the fleet's life.
pub type MemberId = usize;

/// A request's completions and the member that made them.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// The request's samples by index.
    pub completions: Vec<Completion>,
    /// The member that served it.
    pub member: MemberId,
}

/// A set of rollout engines the loop generates with (movable to the
/// rollout thread of [`crate::rollouts`]).
pub trait Fleet: Send {
    /// The completions of every request, in request order (each request's
    /// samples by index).
    fn generate(&mut self, requests: &[Request]) -> Result<Vec<Vec<Completion>>> {
        let served = self.generate_preferring(requests, &vec![None; requests.len()])?;
        Ok(served.into_iter().map(|s| s.completions).collect())
    }

    /// As [`Fleet::generate`], request `i` going to member `prefer[i]` when
    /// that member is ready; each request's completions with the member
    /// that served them.
    fn generate_preferring(&mut self, requests: &[Request], prefer: &[Option<MemberId>]) -> Result<Vec<Served>>;

    /// Installs `weights` as policy `version` everywhere.
    fn update_weights(&mut self, version: u64, weights: PolicyWeights) -> Result<SyncReport>;

    /// The device id and dtype of its one in-process engine when that
    /// engine is the whole fleet: weights may then come as
    /// [`PolicyWeights::Device`] copies made on that device.
    fn shared_device(&self) -> Option<(i32, ElementType)>;

    /// Marks the weights the fleet was built with as policy `version`
    /// (a resumed run's engine holds its checkpoint's weights). Workers,
    /// whose weights the learner does not know, get the named host tensors
    /// `weights` makes pushed (made only then: the in-process engine needs
    /// no copy of them).
    fn start_at(&mut self, version: u64, weights: &dyn Fn() -> Result<Vec<(String, HostTensor)>>) -> Result<()>;

    /// How it stands now.
    fn health(&self) -> FleetHealth;
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

    /// The engine's load and counters.
    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }
}

impl Fleet for LocalFleet {
    fn generate_preferring(&mut self, requests: &[Request], _prefer: &[Option<MemberId>]) -> Result<Vec<Served>> {
        let groups = self.engine.generate(requests)?;
        Ok(groups
            .into_iter()
            .map(|completions| Served { completions, member: 0 })
            .collect())
    }

    fn update_weights(&mut self, version: u64, weights: PolicyWeights) -> Result<SyncReport> {
        let started = Instant::now();
        let bytes = weights.f32_bytes();
        let copy_seconds = match weights {
            PolicyWeights::Host(tensors) => {
                self.engine.update_weights(version, &tensors, InFlight::Keep)?;
                0.0
            }
            PolicyWeights::Device { buffers, copy_seconds } => {
                self.engine.update_weights_on_device(version, buffers, InFlight::Keep)?;
                copy_seconds
            }
            PolicyWeights::Adapters { lora, tensors } => {
                self.engine.update_adapters(version, &lora, &tensors, InFlight::Keep)?;
                0.0
            }
        };
        Ok(SyncReport {
            bytes,
            seconds: copy_seconds + started.elapsed().as_secs_f64(),
        })
    }

    fn shared_device(&self) -> Option<(i32, ElementType)> {
        Some((self.engine.device().id(), self.engine.config().dtype))
    }

    fn start_at(&mut self, version: u64, _weights: &dyn Fn() -> Result<Vec<(String, HostTensor)>>) -> Result<()> {
        Ok(self.engine.update_weights::<HostTensor>(version, &[], InFlight::Keep)?)
    }

    fn health(&self) -> FleetHealth {
        FleetHealth {
            members: 1,
            ready: 1,
            requeued_groups: 0,
        }
    }
}
