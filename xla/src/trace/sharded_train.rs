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
//!
//! [`ShardedAccumulatingTrainStep`] is the same over several micro-batches
//! (gradients accumulate in the parameters' layout, then one update).

use super::function::Function;
use super::graph::Tensor;
use super::train::{
    Accumulation, Runner, StepMetrics, TrainStepSpec, run_step, trace_accumulation, trace_step, without_metrics,
};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::pjrt::{Arg, Buffer, Client, Device, Executable, ShardedBuffer};
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

/// The layout of a step's tensors under a [`Parallelism`].
struct Layout {
    parallelism: Parallelism,
    params: Vec<Sharding>,
    state: Vec<Sharding>,
    batch: Vec<Sharding>,
}

impl Layout {
    /// The layout of `spec`'s tensors and the optimizer state `state_spec`,
    /// checked to fit the devices.
    fn new(spec: &TrainStepSpec<'_>, state_spec: &[(String, TensorType)], parallelism: Parallelism) -> Result<Layout> {
        let batch: Vec<Sharding> = spec.batch.iter().map(|t| parallelism.batch_sharding(t)).collect();
        for (i, (sharding, ty)) in batch.iter().zip(&spec.batch).enumerate() {
            sharding.shard_type_of(&format!("batch input {i}"), ty, parallelism.devices())?;
        }
        Ok(Layout {
            parallelism,
            params: spec.params.iter().map(|t| parallelism.state_sharding(t)).collect(),
            state: state_spec.iter().map(|(_, t)| parallelism.state_sharding(t)).collect(),
            batch,
        })
    }

    fn devices(&self) -> usize {
        self.parallelism.devices()
    }

    /// `count` replicated scalars.
    fn scalars(count: usize) -> Vec<Sharding> {
        vec![Sharding::replicated(); count]
    }

    /// Concatenates layouts.
    fn join<'a>(parts: impl IntoIterator<Item = &'a [Sharding]>) -> Vec<Sharding> {
        parts.into_iter().flatten().cloned().collect()
    }
}

/// Programs partitioned over devices, on [`ShardedBuffer`]s.
struct Partitioned<'a>(&'a Client);

impl Runner for Partitioned<'_> {
    type Array = ShardedBuffer;
    fn run(&self, program: &Executable, args: &[Arg<'_, ShardedBuffer>]) -> Result<Vec<ShardedBuffer>> {
        program.execute_sharded(args)
    }
    fn scalar(&self, program: &Executable, value: f32) -> Result<ShardedBuffer> {
        self.0
            .sharded_from_host(&[value], &[], &Sharding::replicated(), program.devices())
    }
    fn read(&self, scalar: &ShardedBuffer) -> Result<f32> {
        Ok(scalar.to_host::<f32>()?[0])
    }
}

/// Zeroed optimizer state laid out as `layout` says over `devices`.
fn zero_state(
    client: &Client,
    state_spec: &[(String, TensorType)],
    layout: &Layout,
    devices: &[Device],
    params: Vec<ShardedBuffer>,
) -> Result<ShardedTrainState> {
    let optimizer = state_spec
        .iter()
        .zip(&layout.state)
        .map(|((_, ty), sharding)| client.sharded_zeros(ty, sharding, devices))
        .collect::<Result<_>>()?;
    Ok(ShardedTrainState { params, optimizer })
}

/// A compiled training step partitioned over several devices.
pub struct ShardedTrainStep {
    client: Client,
    executable: Executable,
    layout: Layout,
    state_spec: Vec<(String, TensorType)>,
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
        let program = trace_step(spec, &loss_fn)?;
        let layout = Layout::new(spec, &program.state_spec, parallelism)?;
        let (p, s, b) = (&layout.params[..], &layout.state[..], &layout.batch[..]);
        let inputs = Layout::join([p, s, b, &Layout::scalars(1)]); // … lr
        let outputs = Layout::join([p, s, &Layout::scalars(2 + program.metrics)]); // … loss, grad_norm, metrics
        let function = program.function.sharded(layout.devices(), inputs, outputs)?;
        Ok(ShardedTrainStep {
            client: client.clone(),
            executable: function.compile(client)?,
            layout,
            state_spec: program.state_spec,
            metrics: program.metrics,
        })
    }

    /// The layout the step was compiled for.
    pub fn parallelism(&self) -> Parallelism {
        self.layout.parallelism
    }

    /// The devices the step runs on, in partition order: shard `i` of every
    /// input belongs on `devices()[i]`.
    pub fn devices(&self) -> &[Device] {
        self.executable.devices()
    }

    /// The layout of each parameter.
    pub fn param_shardings(&self) -> &[Sharding] {
        &self.layout.params
    }

    /// The layout of each batch input.
    pub fn batch_shardings(&self) -> &[Sharding] {
        &self.layout.batch
    }

    /// Names and types (whole, unsharded) of the optimizer state tensors.
    pub fn optimizer_state_spec(&self) -> &[(String, TensorType)] {
        &self.state_spec
    }

    /// A training state from sharded parameters, with zeroed optimizer
    /// state (each device allocates only its shards).
    pub fn init_state(&self, params: Vec<ShardedBuffer>) -> Result<ShardedTrainState> {
        zero_state(&self.client, &self.state_spec, &self.layout, self.devices(), params)
    }

    /// Runs one step in place on `state` over the whole `batch` (each input
    /// laid out as [`ShardedTrainStep::batch_shardings`]) with learning rate `lr`.
    pub fn step(&self, state: &mut ShardedTrainState, batch: &[&ShardedBuffer], lr: f32) -> Result<StepMetrics> {
        run_step(
            &Partitioned(&self.client),
            &self.executable,
            (&mut state.params, &mut state.optimizer),
            batch,
            lr,
            self.metrics,
        )
    }
}

/// A training step over several micro-batches partitioned over devices:
/// each micro-batch's gradients (laid out as the parameters) accumulate,
/// then one clipped optimizer update — the programs of
/// [`AccumulatingTrainStep`](super::AccumulatingTrainStep), sharded.
pub struct ShardedAccumulatingTrainStep {
    client: Client,
    programs: Accumulation,
    layout: Layout,
    state_spec: Vec<(String, TensorType)>,
}

impl ShardedAccumulatingTrainStep {
    /// Traces `loss_fn(params, micro_batch)` and its metrics, and compiles
    /// the three programs for the client's first `parallelism.devices()` devices.
    pub fn compile_with_metrics(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        parallelism: Parallelism,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<ShardedAccumulatingTrainStep> {
        let traced = trace_accumulation(spec, &loss_fn)?;
        let layout = Layout::new(spec, &traced.state_spec, parallelism)?;
        let (p, s, b) = (&layout.params[..], &layout.state[..], &layout.batch[..]);
        let scalars = Layout::scalars(1 + traced.metrics); // loss, metrics
        let compile = |function: Function, inputs: Vec<Sharding>, outputs: Vec<Sharding>| {
            function.sharded(layout.devices(), inputs, outputs)?.compile(client)
        };
        let programs = Accumulation {
            first: compile(traced.first, Layout::join([p, b]), Layout::join([p, &scalars]))?,
            accumulate: compile(traced.accumulate, Layout::join([p, p, b]), Layout::join([p, &scalars]))?,
            apply: compile(
                traced.apply,
                Layout::join([p, s, p, &Layout::scalars(2)]), // … lr, scale
                Layout::join([p, s, &Layout::scalars(1)]),    // … grad_norm
            )?,
            metrics: traced.metrics,
        };
        Ok(ShardedAccumulatingTrainStep {
            client: client.clone(),
            programs,
            layout,
            state_spec: traced.state_spec,
        })
    }

    /// The devices the step runs on, in partition order.
    pub fn devices(&self) -> &[Device] {
        self.programs.apply.devices()
    }

    /// The layout of each parameter.
    pub fn param_shardings(&self) -> &[Sharding] {
        &self.layout.params
    }

    /// The layout of each micro-batch input.
    pub fn batch_shardings(&self) -> &[Sharding] {
        &self.layout.batch
    }

    /// A training state from sharded parameters, with zeroed optimizer state.
    pub fn init_state(&self, params: Vec<ShardedBuffer>) -> Result<ShardedTrainState> {
        zero_state(&self.client, &self.state_spec, &self.layout, self.devices(), params)
    }

    /// One optimizer step over `micro_batches` (at least one, each laid out
    /// as [`ShardedAccumulatingTrainStep::batch_shardings`]), in place.
    pub fn step(
        &self,
        state: &mut ShardedTrainState,
        micro_batches: &[Vec<&ShardedBuffer>],
        lr: f32,
    ) -> Result<StepMetrics> {
        self.programs.step(
            &Partitioned(&self.client),
            &mut state.params,
            &mut state.optimizer,
            micro_batches,
            lr,
        )
    }
}
