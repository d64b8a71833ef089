//! Train steps over several devices through XLA's SPMD partitioner: the
//! program of [`TrainStep`](super::TrainStep) — the same forward, backward,
//! global-norm clipping and optimizer — with sharding annotations on its
//! inputs and outputs, compiled into one partition per device. XLA inserts
//! the collectives; no reduction is written by hand.
//!
//! - [`Parallelism::DataParallel`]: batch inputs split along dimension 0,
//!   parameters and optimizer state replicated; the gradients are summed
//!   across devices.
//! - [`Parallelism::Fsdp`]: the batch split as above, and every parameter
//!   and optimizer state tensor split along dimension 0 where its size
//!   divides by the device count (replicated where not): each device keeps
//!   only its shard between steps.

use super::graph::Tensor;
use super::train::{StepMetrics, StepOutputs, TrainStepSpec, step_args, trace_step, without_metrics};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::pjrt::{Buffer, Client, Device, Executable, ShardedBuffer};
use crate::sharding::Sharding;

/// How a sharded train step lays its tensors out over devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// Batch split along dimension 0; parameters and state replicated.
    DataParallel {
        /// Devices the step runs on (the client's first ones).
        devices: usize,
    },
    /// Batch, parameters and optimizer state split along dimension 0
    /// (a parameter whose dimension 0 does not divide stays replicated).
    Fsdp {
        /// Devices the step runs on (the client's first ones).
        devices: usize,
    },
}

impl Parallelism {
    /// Devices the step runs on.
    pub fn devices(self) -> usize {
        match self {
            Parallelism::DataParallel { devices } | Parallelism::Fsdp { devices } => devices,
        }
    }

    /// The layout of a parameter or optimizer state tensor of type `ty`.
    pub fn state_sharding(self, ty: &TensorType) -> Sharding {
        match (self, ty.dims.first()) {
            (Parallelism::Fsdp { devices }, Some(&rows)) if devices > 1 && rows % devices as i64 == 0 => {
                Sharding::split(0, devices)
            }
            _ => Sharding::replicated(),
        }
    }

    /// The layout of a batch input of type `ty`: split along dimension 0
    /// (replicated when it is a scalar).
    pub fn batch_sharding(self, ty: &TensorType) -> Sharding {
        if ty.dims.is_empty() {
            Sharding::replicated()
        } else {
            Sharding::split(0, self.devices())
        }
    }
}

/// Parameters and optimizer state of a sharded training run, each laid out
/// as the step's [`ShardedTrainStep::param_shardings`] and state shardings say.
#[derive(Debug)]
pub struct ShardedTrainState {
    /// Parameters, in the spec's order.
    pub params: Vec<ShardedBuffer>,
    /// Optimizer state, in [`Optimizer::state_spec`](super::Optimizer::state_spec) order.
    pub optimizer: Vec<ShardedBuffer>,
}

impl ShardedTrainState {
    /// Device bytes of parameters and optimizer state held by each device.
    pub fn device_bytes(&self) -> Vec<usize> {
        let devices = self.params.first().map_or(0, |p| p.shards().len());
        let arrays = || self.params.iter().chain(&self.optimizer);
        (0..devices)
            .map(|d| {
                arrays()
                    .map(|a| a.shards().get(d).map_or(0, Buffer::device_bytes))
                    .sum()
            })
            .collect()
    }
}

/// A compiled training step partitioned over several devices.
pub struct ShardedTrainStep {
    client: Client,
    executable: Executable,
    parallelism: Parallelism,
    state_spec: Vec<(String, TensorType)>,
    param_shardings: Vec<Sharding>,
    state_shardings: Vec<Sharding>,
    batch_shardings: Vec<Sharding>,
    metrics: usize,
}

impl ShardedTrainStep {
    /// Traces `loss_fn(params, batch)` (a scalar over the whole batch) and
    /// compiles the step for the client's first `parallelism.devices()` devices.
    pub fn compile(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        parallelism: Parallelism,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<Tensor>,
    ) -> Result<ShardedTrainStep> {
        Self::compile_with_metrics(client, spec, parallelism, without_metrics(loss_fn))
    }

    /// As [`ShardedTrainStep::compile`], for a loss function that also
    /// returns scalar metrics.
    pub fn compile_with_metrics(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        parallelism: Parallelism,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<ShardedTrainStep> {
        let devices = parallelism.devices();
        let batch_shardings: Vec<Sharding> = spec.batch.iter().map(|t| parallelism.batch_sharding(t)).collect();
        for (i, (sharding, ty)) in batch_shardings.iter().zip(&spec.batch).enumerate() {
            sharding.shard_type_of(&format!("batch input {i}"), ty, devices)?;
        }
        let program = trace_step(spec, &loss_fn)?;
        let param_shardings: Vec<Sharding> = spec.params.iter().map(|t| parallelism.state_sharding(t)).collect();
        let state_shardings: Vec<Sharding> = program
            .state_spec
            .iter()
            .map(|(_, t)| parallelism.state_sharding(t))
            .collect();
        let updated = param_shardings.iter().chain(&state_shardings).cloned();
        let inputs = updated
            .clone()
            .chain(batch_shardings.iter().cloned())
            .chain([Sharding::replicated()]) // lr
            .collect();
        let outputs = updated
            .chain(vec![Sharding::replicated(); 2 + program.metrics]) // loss, grad_norm, metrics
            .collect();
        let function = program.function.sharded(devices, inputs, outputs)?;
        Ok(ShardedTrainStep {
            client: client.clone(),
            executable: function.compile(client)?,
            parallelism,
            state_spec: program.state_spec,
            param_shardings,
            state_shardings,
            batch_shardings,
            metrics: program.metrics,
        })
    }

    /// The layout the step was compiled for.
    pub fn parallelism(&self) -> Parallelism {
        self.parallelism
    }

    /// The devices the step runs on, in partition order: shard `i` of every
    /// input belongs on `devices()[i]`.
    pub fn devices(&self) -> &[Device] {
        self.executable.devices()
    }

    /// The layout of each parameter.
    pub fn param_shardings(&self) -> &[Sharding] {
        &self.param_shardings
    }

    /// The layout of each batch input.
    pub fn batch_shardings(&self) -> &[Sharding] {
        &self.batch_shardings
    }

    /// Names and types (whole, unsharded) of the optimizer state tensors.
    pub fn optimizer_state_spec(&self) -> &[(String, TensorType)] {
        &self.state_spec
    }

    /// A training state from sharded parameters, with zeroed optimizer
    /// state (each device allocates only its shards).
    pub fn init_state(&self, params: Vec<ShardedBuffer>) -> Result<ShardedTrainState> {
        let optimizer = self
            .state_spec
            .iter()
            .zip(&self.state_shardings)
            .map(|((_, ty), sharding)| self.client.sharded_zeros(ty, sharding, self.devices()))
            .collect::<Result<_>>()?;
        Ok(ShardedTrainState { params, optimizer })
    }

    /// Runs one step in place on `state` over the whole `batch` (each input
    /// laid out as [`ShardedTrainStep::batch_shardings`]) with learning rate `lr`.
    pub fn step(&self, state: &mut ShardedTrainState, batch: &[&ShardedBuffer], lr: f32) -> Result<StepMetrics> {
        let lr = self
            .client
            .sharded_from_host(&[lr], &[], &Sharding::replicated(), self.devices())?;
        let outputs = self
            .executable
            .execute_sharded(&step_args(&state.params, &state.optimizer, batch, &lr))?;
        StepOutputs::split(outputs, self.param_shardings.len(), self.metrics).finish(
            &mut state.params,
            &mut state.optimizer,
            |scalar| Ok(scalar.to_host::<f32>()?[0]),
        )
    }
}
