//! The train-step compiler: a loss function over (params, batch) becomes
//! ONE executable `(params, opt_state, batch, lr) → (params', opt_state',
//! loss, grad_norm)` — forward, backward, clipping and the optimizer —
//! with parameters and optimizer state donated, so updates happen in place.
//!
//! Gradient accumulation uses three programs instead: gradients of the first
//! micro-batch, gradients added for each further micro-batch (accumulator
//! donated), and the clipped optimizer update of the mean gradient.
//!
//! A loss function may also return metrics (scalars computed with the
//! loss, such as clip fractions); each step reports them, summed over
//! micro-batches.
//!
//! The same step program runs over several devices as
//! [`ShardedTrainStep`](super::ShardedTrainStep).

use super::function::Function;
use super::graph::{Graph, Tensor};
use super::optim::{Optimizer, clip_by_global_norm, global_norm};
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::pjrt::{Arg, Buffer, Client, Device, Executable};

/// The shapes and optimizer of a training step.
pub struct TrainStepSpec<'a> {
    /// Parameter types, in the order the loss function receives them.
    pub params: Vec<TensorType>,
    /// Batch tensor types, in the order the loss function receives them.
    pub batch: Vec<TensorType>,
    /// The optimizer traced into the step.
    pub optimizer: &'a dyn Optimizer,
    /// Global gradient-norm clipping threshold; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
}

/// Device buffers a training run owns: parameters and optimizer state.
#[derive(Debug)]
pub struct TrainState {
    /// Parameters, in the spec's order.
    pub params: Vec<Buffer>,
    /// Optimizer state, in [`Optimizer::state_spec`] order.
    pub optimizer: Vec<Buffer>,
}

/// What one step reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetrics {
    /// The loss before the update (mean over micro-batches).
    pub loss: f32,
    /// The global gradient norm before clipping.
    pub grad_norm: f32,
    /// The loss function's metrics, in its order (summed over micro-batches).
    pub metrics: Vec<f32>,
}

/// A compiled training step.
pub struct TrainStep {
    client: Client,
    executable: Executable,
    state_spec: Vec<(String, TensorType)>,
    metrics: usize,
}

/// A loss function over (params, batch) returning a scalar loss and scalar metrics.
type LossFn<'a> = &'a dyn Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>;

/// The traced pieces shared by the step programs.
struct Traced {
    graph: Graph,
    params: Vec<Tensor>,
    loss: Tensor,
    metrics: Vec<Tensor>,
    grads: Vec<Tensor>,
}

/// A plain loss function as one without metrics.
pub(super) fn without_metrics(
    loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<Tensor>,
) -> impl Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    move |params, batch| Ok((loss_fn(params, batch)?, Vec::new()))
}

/// Traces `loss_fn` over fresh parameters (after `leading` other inputs are
/// added by `before`) and differentiates it.
fn trace_loss(
    name: &str,
    spec: &TrainStepSpec<'_>,
    loss_fn: LossFn<'_>,
    before_batch: impl FnOnce(&Graph) -> Result<()>,
) -> Result<Traced> {
    let graph = Graph::new(name);
    let params = spec
        .params
        .iter()
        .map(|t| graph.parameter(t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    before_batch(&graph)?;
    let batch = spec
        .batch
        .iter()
        .map(|t| graph.parameter(t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    let (loss, metrics) = loss_fn(&params, &batch)?;
    if let Some(bad) = metrics.iter().find(|m| m.rank() != 0) {
        return Err(Error::Trace {
            op: "train_step",
            message: format!("metrics must be scalars, got {}", bad.ty),
        });
    }
    let wrt: Vec<&Tensor> = params.iter().collect();
    let grads = super::autodiff::grad(&loss, &wrt)?;
    Ok(Traced {
        graph,
        params,
        loss: loss.convert(ElementType::F32)?,
        metrics: metrics
            .iter()
            .map(|m| m.convert(ElementType::F32))
            .collect::<Result<_>>()?,
        grads,
    })
}

/// Clips (if asked) and applies the optimizer; returns the update outputs
/// `params', state'` and the norm.
fn trace_update(
    spec: &TrainStepSpec<'_>,
    params: &[Tensor],
    grads: &[Tensor],
    state: &[Tensor],
    lr: &Tensor,
) -> Result<(Vec<Tensor>, Tensor)> {
    let (grads, norm) = match spec.max_grad_norm {
        Some(max) => clip_by_global_norm(grads, max)?,
        None => (grads.to_vec(), global_norm(grads)?),
    };
    let (new_params, new_state) = spec.optimizer.update(params, &grads, state, lr)?;
    let mut outputs = new_params;
    outputs.extend(new_state);
    Ok((outputs, norm.convert(ElementType::F32)?))
}

fn state_parameters(graph: &Graph, spec: &[(String, TensorType)]) -> Result<Vec<Tensor>> {
    spec.iter().map(|(_, t)| graph.parameter(t.dtype, &t.dims)).collect()
}

/// The whole step as one function `(params, opt_state, batch, lr) →
/// (params', opt_state', loss, grad_norm, metrics…)`, parameters and
/// optimizer state donated to their updates.
pub(super) struct StepProgram {
    pub function: Function,
    pub state_spec: Vec<(String, TensorType)>,
    pub metrics: usize,
}

/// Traces the whole step of `loss_fn`.
pub(super) fn trace_step(spec: &TrainStepSpec<'_>, loss_fn: LossFn<'_>) -> Result<StepProgram> {
    let state_spec = spec.optimizer.state_spec(&spec.params);
    let mut state = Vec::new();
    let traced = trace_loss("train_step", spec, loss_fn, |graph| {
        state = state_parameters(graph, &state_spec)?;
        Ok(())
    })?;
    let lr = traced.graph.parameter(ElementType::F32, &[])?;
    let (mut outputs, norm) = trace_update(spec, &traced.params, &traced.grads, &state, &lr)?;
    outputs.push(traced.loss.clone());
    outputs.push(norm);
    outputs.extend(traced.metrics.iter().cloned());
    let function = build(&traced.graph, &outputs)?.donate_range(0..spec.params.len() + state_spec.len())?;
    Ok(StepProgram {
        function,
        state_spec,
        metrics: traced.metrics.len(),
    })
}

/// Runs the whole-step program `(params, state, batch, lr) → (params',
/// state', loss, grad_norm, metrics…)` with parameters and state donated
/// and replaced by their updates; reads the step's scalars.
pub(super) fn run_step<R: Runner>(
    runner: &R,
    program: &Executable,
    (params, optimizer): (&mut Vec<R::Array>, &mut Vec<R::Array>),
    batch: &[&R::Array],
    lr: f32,
    metrics: usize,
) -> Result<StepMetrics> {
    let lr = runner.scalar(program, lr)?;
    let mut args: Vec<Arg<'_, R::Array>> = params.iter().map(Arg::Donate).collect();
    args.extend(optimizer.iter().map(Arg::Donate));
    args.extend(batch.iter().map(|&b| Arg::Borrow(b)));
    args.push(Arg::Borrow(&lr));
    let mut outputs = runner.run(program, &args)?;
    let metrics = outputs.split_off(outputs.len() - metrics);
    let norm = outputs.pop().expect("grad norm output");
    let loss = outputs.pop().expect("loss output");
    *optimizer = outputs.split_off(params.len());
    *params = outputs;
    Ok(StepMetrics {
        loss: runner.read(&loss)?,
        grad_norm: runner.read(&norm)?,
        metrics: metrics.iter().map(|m| runner.read(m)).collect::<Result<_>>()?,
    })
}

impl TrainStep {
    /// Traces `loss_fn(params, batch)` (a scalar) and compiles the whole step.
    pub fn compile(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<Tensor>,
    ) -> Result<TrainStep> {
        Self::compile_with_metrics(client, spec, without_metrics(loss_fn))
    }

    /// As [`TrainStep::compile`], for a loss function that also returns
    /// scalar metrics ([`StepMetrics::metrics`]).
    pub fn compile_with_metrics(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<TrainStep> {
        let program = trace_step(spec, &loss_fn)?;
        Ok(TrainStep {
            client: client.clone(),
            executable: program.function.compile(client)?,
            state_spec: program.state_spec,
            metrics: program.metrics,
        })
    }

    /// Names and types of the optimizer state tensors.
    pub fn optimizer_state_spec(&self) -> &[(String, TensorType)] {
        &self.state_spec
    }

    /// A training state from parameter buffers, with zeroed optimizer state.
    pub fn init_state(&self, params: Vec<Buffer>) -> Result<TrainState> {
        init_state(&self.client, &self.executable, &self.state_spec, params)
    }

    /// Runs one step in place on `state` with learning rate `lr`.
    pub fn step(&self, state: &mut TrainState, batch: &[&Buffer], lr: f32) -> Result<StepMetrics> {
        run_step(
            &OneDevice(&self.client),
            &self.executable,
            (&mut state.params, &mut state.optimizer),
            batch,
            lr,
            self.metrics,
        )
    }
}

/// The three programs of gradient accumulation, traced (not yet laid out
/// or compiled): `first (params, batch) → (grads, loss, metrics…)`,
/// `accumulate (params, acc, batch) → (acc + grads, loss, metrics…)` with
/// the accumulator donated, and `apply (params, state, acc, lr, scale) →
/// (params', state', grad_norm)` with parameters and state donated.
pub(super) struct AccumulationPrograms {
    pub first: Function,
    pub accumulate: Function,
    pub apply: Function,
    pub state_spec: Vec<(String, TensorType)>,
    pub metrics: usize,
}

/// Traces the accumulation programs of `loss_fn`.
pub(super) fn trace_accumulation(spec: &TrainStepSpec<'_>, loss_fn: LossFn<'_>) -> Result<AccumulationPrograms> {
    let n = spec.params.len();
    let state_spec = spec.optimizer.state_spec(&spec.params);
    let param_parameters = |graph: &Graph| -> Result<Vec<Tensor>> {
        spec.params.iter().map(|t| graph.parameter(t.dtype, &t.dims)).collect()
    };

    let first = trace_loss("grad_first", spec, loss_fn, |_| Ok(()))?;
    let metrics = first.metrics.len();
    let mut outputs = first.grads.clone();
    outputs.push(first.loss.clone());
    outputs.extend(first.metrics.iter().cloned());
    let first = build(&first.graph, &outputs)?;

    let mut acc = Vec::new();
    let more = trace_loss("grad_accumulate", spec, loss_fn, |graph| {
        acc = param_parameters(graph)?;
        Ok(())
    })?;
    let mut outputs = acc
        .iter()
        .zip(&more.grads)
        .map(|(a, g)| a.add(g))
        .collect::<Result<Vec<_>>>()?;
    outputs.push(more.loss.clone());
    outputs.extend(more.metrics.iter().cloned());
    let accumulate = (0..n).try_fold(build(&more.graph, &outputs)?, |f, i| f.donate(n + i, i))?;

    let graph = Graph::new("apply_update");
    let params = param_parameters(&graph)?;
    let state = state_parameters(&graph, &state_spec)?;
    let acc = param_parameters(&graph)?;
    let lr = graph.parameter(ElementType::F32, &[])?;
    let scale = graph.parameter(ElementType::F32, &[])?;
    let mean = acc
        .iter()
        .map(|a| a.mul(&scale.convert(a.dtype())?))
        .collect::<Result<Vec<_>>>()?;
    let (mut outputs, norm) = trace_update(spec, &params, &mean, &state, &lr)?;
    outputs.push(norm);
    let apply = build(&graph, &outputs)?.donate_range(0..n + state_spec.len())?;

    Ok(AccumulationPrograms {
        first,
        accumulate,
        apply,
        state_spec,
        metrics,
    })
}

/// How a step's programs run and what they run on: buffers of one device,
/// or sharded arrays of a partitioned program.
pub(super) trait Runner {
    /// The arrays the programs take and return.
    type Array;
    /// Runs `program` on `args`.
    fn run(&self, program: &Executable, args: &[Arg<'_, Self::Array>]) -> Result<Vec<Self::Array>>;
    /// An f32 scalar placed for `program`.
    fn scalar(&self, program: &Executable, value: f32) -> Result<Self::Array>;
    /// Reads an f32 scalar output.
    fn read(&self, scalar: &Self::Array) -> Result<f32>;
}

/// Programs of one device, on [`Buffer`]s.
pub(super) struct OneDevice<'a>(pub &'a Client);

impl Runner for OneDevice<'_> {
    type Array = Buffer;
    fn run(&self, program: &Executable, args: &[Arg<'_>]) -> Result<Vec<Buffer>> {
        program.execute_args(args)
    }
    fn scalar(&self, program: &Executable, value: f32) -> Result<Buffer> {
        scalar_on(self.0, program, value)
    }
    fn read(&self, scalar: &Buffer) -> Result<f32> {
        read_scalar(scalar)
    }
}

/// The compiled accumulation programs.
pub(super) struct Accumulation {
    pub first: Executable,
    pub accumulate: Executable,
    pub apply: Executable,
    /// Metrics of the loss function.
    pub metrics: usize,
}

impl Accumulation {
    /// One optimizer step over `micro_batches` (at least one), in place on
    /// `params` and `optimizer`.
    pub fn step<R: Runner>(
        &self,
        runner: &R,
        params: &mut Vec<R::Array>,
        optimizer: &mut Vec<R::Array>,
        micro_batches: &[Vec<&R::Array>],
        lr: f32,
    ) -> Result<StepMetrics> {
        let (first, rest) = micro_batches.split_first().ok_or_else(|| Error::Trace {
            op: "train_step",
            message: "needs at least one micro-batch".to_string(),
        })?;
        let read_all = |arrays: &[R::Array]| arrays.iter().map(|a| runner.read(a)).collect::<Result<Vec<_>>>();
        let mut args: Vec<Arg<'_, R::Array>> = params.iter().map(Arg::Borrow).collect();
        args.extend(first.iter().map(|&b| Arg::Borrow(b)));
        let mut acc = runner.run(&self.first, &args)?;
        let mut metrics = read_all(&acc.split_off(acc.len() - self.metrics))?;
        let mut loss_sum = runner.read(&acc.pop().expect("loss output"))?;
        for batch in rest {
            let mut args: Vec<Arg<'_, R::Array>> = params.iter().map(Arg::Borrow).collect();
            args.extend(acc.iter().map(Arg::Donate));
            args.extend(batch.iter().map(|&b| Arg::Borrow(b)));
            let mut out = runner.run(&self.accumulate, &args)?;
            let more = read_all(&out.split_off(out.len() - self.metrics))?;
            metrics.iter_mut().zip(more).for_each(|(sum, m)| *sum += m);
            loss_sum += runner.read(&out.pop().expect("loss output"))?;
            acc = out;
        }
        let count = micro_batches.len() as f32;
        let lr = runner.scalar(&self.apply, lr)?;
        let scale = runner.scalar(&self.apply, 1.0 / count)?;
        let mut args: Vec<Arg<'_, R::Array>> = params.iter().map(Arg::Donate).collect();
        args.extend(optimizer.iter().map(Arg::Donate));
        args.extend(acc.iter().map(Arg::Borrow));
        args.push(Arg::Borrow(&lr));
        args.push(Arg::Borrow(&scale));
        let mut outputs = runner.run(&self.apply, &args)?;
        let norm = outputs.pop().expect("grad norm output");
        *optimizer = outputs.split_off(params.len());
        *params = outputs;
        Ok(StepMetrics {
            loss: loss_sum / count,
            grad_norm: runner.read(&norm)?,
            metrics,
        })
    }
}

/// A training step over several micro-batches whose gradients are averaged
/// before one optimizer update.
pub struct AccumulatingTrainStep {
    client: Client,
    programs: Accumulation,
    state_spec: Vec<(String, TensorType)>,
}

impl AccumulatingTrainStep {
    /// Traces `loss_fn(params, micro_batch)` and compiles the three programs.
    pub fn compile(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<Tensor>,
    ) -> Result<AccumulatingTrainStep> {
        Self::compile_with_metrics(client, spec, without_metrics(loss_fn))
    }

    /// As [`AccumulatingTrainStep::compile`], for a loss function that also
    /// returns scalar metrics (summed over the micro-batches).
    pub fn compile_with_metrics(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        loss_fn: impl Fn(&[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<AccumulatingTrainStep> {
        let traced = trace_accumulation(spec, &loss_fn)?;
        Ok(AccumulatingTrainStep {
            client: client.clone(),
            programs: Accumulation {
                first: traced.first.compile(client)?,
                accumulate: traced.accumulate.compile(client)?,
                apply: traced.apply.compile(client)?,
                metrics: traced.metrics,
            },
            state_spec: traced.state_spec,
        })
    }

    /// A training state from parameter buffers, with zeroed optimizer state.
    pub fn init_state(&self, params: Vec<Buffer>) -> Result<TrainState> {
        init_state(&self.client, &self.programs.apply, &self.state_spec, params)
    }

    /// One optimizer step over `micro_batches` (at least one), in place.
    pub fn step(&self, state: &mut TrainState, micro_batches: &[Vec<&Buffer>], lr: f32) -> Result<StepMetrics> {
        self.programs.step(
            &OneDevice(&self.client),
            &mut state.params,
            &mut state.optimizer,
            micro_batches,
            lr,
        )
    }
}

fn build(graph: &Graph, outputs: &[Tensor]) -> Result<Function> {
    let refs: Vec<&Tensor> = outputs.iter().collect();
    graph.build(&refs)
}

/// A state of `params` and zeroed optimizer tensors, on the program's device.
fn init_state(
    client: &Client,
    executable: &Executable,
    state_spec: &[(String, TensorType)],
    params: Vec<Buffer>,
) -> Result<TrainState> {
    let device = program_device(executable)?;
    let optimizer = state_spec
        .iter()
        .map(|(_, t)| client.buffer_from_host_bytes(&vec![0u8; t.byte_size()], t, device))
        .collect::<Result<_>>()?;
    Ok(TrainState { params, optimizer })
}

fn program_device(executable: &Executable) -> Result<&Device> {
    executable
        .devices()
        .first()
        .ok_or_else(|| Error::unexpected("train_step", "the program has no device"))
}

/// An f32 scalar on the program's device.
fn scalar_on(client: &Client, executable: &Executable, value: f32) -> Result<Buffer> {
    client.buffer_from_host(&[value], &[], program_device(executable)?)
}

fn read_scalar(buffer: &Buffer) -> Result<f32> {
    Ok(buffer.to_host::<f32>()?[0])
}
