//! The train-step compiler: a loss function over (params, batch) becomes
//! ONE executable `(params, opt_state, batch, lr) → (params', opt_state',
//! loss, grad_norm, metrics…)` — forward, backward, clipping and the
//! optimizer — with parameters and optimizer state donated, so updates
//! happen in place.
//!
//! Accumulation is a property of the step ([`TrainStepSpec::accumulate`]):
//! such a step takes several micro-batches through three programs instead —
//! gradients of the first, gradients added for each further one
//! (accumulator donated), and the clipped optimizer update of their mean.
//!
//! A step may compute in another dtype than its parameters'
//! ([`TrainStepSpec::compute`], bf16 on f32 master weights): the loss sees
//! converted parameters and their gradients flow back through the
//! conversion. An accumulating step converts them once, by a fourth
//! program before its micro-batches, which then share the copies instead
//! of each converting every parameter again.
//!
//! Every step runs on a [`Mesh`]: on one device its programs are compiled
//! as traced; over several they carry the mesh's sharding annotations and
//! XLA partitions them (see [`super::mesh`]). Arrays are
//! [`ShardedBuffer`]s either way (one whole shard on one device).
//!
//! A loss function returns its scalar loss and scalar metrics (such as
//! clip fractions); each step reports them, summed over micro-batches.
//!
//! Besides the trained parameters a step may take frozen ones
//! ([`TrainStepSpec::frozen`]): inputs the loss reads (a base model under
//! adapters) that get no gradient, no optimizer state and no update, laid
//! out like the parameters and borrowed by every run.

use super::function::Function;
use super::graph::{Graph, Tensor};
use super::mesh::Mesh;
use super::optim::{Optimizer, clip_by_global_norm, global_norm};
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::pjrt::{Arg, Buffer, Client, Executable, ShardedBuffer};
use crate::sharding::Sharding;

/// The shapes, optimizer and accumulation of a training step.
pub struct TrainStepSpec<'a> {
    /// Parameter types, in the order the loss function receives them.
    pub params: Vec<TensorType>,
    /// Frozen input types (read by the loss, never trained), in the order
    /// the loss function receives them.
    pub frozen: Vec<TensorType>,
    /// Batch tensor types (of one micro-batch when accumulating), in the
    /// order the loss function receives them.
    pub batch: Vec<TensorType>,
    /// The optimizer traced into the step.
    pub optimizer: &'a dyn Optimizer,
    /// Global gradient-norm clipping threshold; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
    /// Whether a step takes several micro-batches whose gradients are
    /// averaged before one update (three programs) instead of one batch
    /// (one program).
    pub accumulate: bool,
    /// The dtype the loss function receives the parameters in (converted
    /// where theirs differs; gradients come back in the parameters' dtype).
    pub compute: ElementType,
}

/// Device arrays a training run owns: parameters and optimizer state,
/// each laid out on the step's mesh.
#[derive(Debug)]
pub struct TrainState {
    /// Parameters, in the spec's order.
    pub params: Vec<ShardedBuffer>,
    /// Optimizer state, in [`Optimizer::state_spec`] order.
    pub optimizer: Vec<ShardedBuffer>,
    /// Frozen inputs, in the spec's order (empty when nothing is frozen).
    pub frozen: Vec<ShardedBuffer>,
}

impl TrainState {
    /// Device bytes of parameters and optimizer state held by each device.
    pub fn device_bytes(&self) -> Vec<usize> {
        let devices = self.params.first().map_or(0, |p| p.shards().len());
        let arrays = || self.params.iter().chain(&self.optimizer).chain(&self.frozen);
        (0..devices)
            .map(|d| {
                arrays()
                    .map(|a| a.shards().get(d).map_or(0, Buffer::device_bytes))
                    .sum()
            })
            .collect()
    }
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

/// A loss function over (params, frozen, batch) returning a scalar loss and scalar metrics.
type LossFn<'a> = &'a dyn Fn(&[Tensor], &[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>;

/// The traced pieces shared by the step programs.
struct Traced {
    graph: Graph,
    params: Vec<Tensor>,
    loss: Tensor,
    metrics: Vec<Tensor>,
    grads: Vec<Tensor>,
}

/// In which dtype a traced program takes the parameters.
#[derive(Clone, Copy)]
enum ParamsIn {
    /// Their own: the program converts them to the compute dtype.
    Stored,
    /// The compute dtype: converted before the program, once a step.
    Compute,
}

/// Traces `loss_fn` over fresh parameters (then the inputs `before_batch`
/// adds, then the frozen inputs, then the batch) and differentiates it
/// with respect to the parameters; the gradients are in the parameters'
/// stored dtypes.
fn trace_loss(
    name: &str,
    spec: &TrainStepSpec<'_>,
    params_in: ParamsIn,
    loss_fn: LossFn<'_>,
    before_batch: impl FnOnce(&Graph) -> Result<()>,
) -> Result<Traced> {
    let graph = Graph::new(name);
    let (params, seen) = match params_in {
        ParamsIn::Stored => {
            let params = parameters(&graph, &spec.params)?;
            let seen = params
                .iter()
                .map(|p| p.convert(spec.compute))
                .collect::<Result<Vec<_>>>()?;
            (params, seen)
        }
        ParamsIn::Compute => {
            let params = parameters(&graph, &compute_types(spec))?;
            (params.clone(), params)
        }
    };
    before_batch(&graph)?;
    let frozen = parameters(&graph, &spec.frozen)?;
    let batch = parameters(&graph, &spec.batch)?;
    let (loss, metrics) = loss_fn(&seen, &frozen, &batch)?;
    if let Some(bad) = metrics.iter().find(|m| m.rank() != 0) {
        return Err(Error::Trace {
            op: "train_step",
            message: format!("metrics must be scalars, got {}", bad.ty),
        });
    }
    let wrt: Vec<&Tensor> = params.iter().collect();
    let grads = super::autodiff::grad(&loss, &wrt)?
        .iter()
        .zip(&spec.params)
        .map(|(g, stored)| g.convert(stored.dtype))
        .collect::<Result<Vec<_>>>()?;
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

/// The parameters' types in the step's compute dtype.
fn compute_types(spec: &TrainStepSpec<'_>) -> Vec<TensorType> {
    spec.params
        .iter()
        .map(|t| TensorType::new(spec.compute, t.dims.clone()))
        .collect()
}

/// A graph parameter of each type.
fn parameters(graph: &Graph, types: &[TensorType]) -> Result<Vec<Tensor>> {
    types.iter().map(|t| graph.parameter(t.dtype, &t.dims)).collect()
}

/// The layout of a step's tensors on its mesh.
struct Layout {
    mesh: Mesh,
    params: Vec<Sharding>,
    state: Vec<Sharding>,
    frozen: Vec<Sharding>,
    batch: Vec<Sharding>,
}

impl Layout {
    /// The layout of `spec`'s tensors and the optimizer state `state_spec`
    /// on `mesh`, checked to fit its devices.
    fn new(spec: &TrainStepSpec<'_>, state_spec: &[(String, TensorType)], mesh: &Mesh) -> Result<Layout> {
        let batch: Vec<Sharding> = spec.batch.iter().map(|t| mesh.batch_sharding(t)).collect();
        for (i, (sharding, ty)) in batch.iter().zip(&spec.batch).enumerate() {
            sharding.shard_type_of(&format!("batch input {i}"), ty, mesh.size())?;
        }
        Ok(Layout {
            mesh: mesh.clone(),
            params: spec.params.iter().map(|t| mesh.state_sharding(t)).collect(),
            state: state_spec.iter().map(|(_, t)| mesh.state_sharding(t)).collect(),
            frozen: spec.frozen.iter().map(|t| mesh.state_sharding(t)).collect(),
            batch,
        })
    }

    /// `function` laid out for the partitioner (as it is on one device).
    fn partition(&self, function: Function, inputs: &[&[Sharding]], outputs: &[&[Sharding]]) -> Result<Function> {
        let join = |parts: &[&[Sharding]]| parts.iter().flat_map(|p| p.iter().cloned()).collect();
        self.mesh.partition(function, join(inputs), join(outputs))
    }
}

/// `count` replicated scalars.
fn scalars(count: usize) -> Vec<Sharding> {
    vec![Sharding::replicated(); count]
}

/// The compiled programs of a step.
enum Programs {
    /// `(params, state, frozen, batch, lr) → (params', state', loss, grad_norm, metrics…)`.
    Whole(Executable),
    /// `convert (params) → params in the compute dtype` (when it differs),
    /// then `first (params, frozen, batch) → (grads, loss, metrics…)`,
    /// `accumulate (params, acc, frozen, batch) → (acc + grads, loss,
    /// metrics…)` with the accumulator donated (both on the converted
    /// parameters), `apply (params, state, acc, lr, scale) → (params',
    /// state', grad_norm)` with parameters and state donated.
    Accumulating(Accumulation),
}

/// The programs of an accumulating step.
struct Accumulation {
    /// `(params) → params in the compute dtype`, when that differs from theirs.
    convert: Option<Executable>,
    first: Executable,
    accumulate: Executable,
    apply: Executable,
}

/// A compiled training step on a mesh.
pub struct TrainStep {
    client: Client,
    programs: Programs,
    layout: Layout,
    state_spec: Vec<(String, TensorType)>,
    metrics: usize,
}

impl TrainStep {
    /// Traces `loss_fn(params, frozen, batch)` (a scalar loss and scalar
    /// metrics) and compiles the step's programs for `mesh`.
    pub fn compile(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        mesh: &Mesh,
        loss_fn: impl Fn(&[Tensor], &[Tensor], &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<TrainStep> {
        let state_spec = spec.optimizer.state_spec(&spec.params);
        let layout = Layout::new(spec, &state_spec, mesh)?;
        let (programs, metrics) = match spec.accumulate {
            false => whole_program(client, spec, &layout, &state_spec, &loss_fn)?,
            true => accumulation_programs(client, spec, &layout, &state_spec, &loss_fn)?,
        };
        Ok(TrainStep {
            client: client.clone(),
            programs,
            layout,
            state_spec,
            metrics,
        })
    }

    /// The mesh the step runs on.
    pub fn mesh(&self) -> &Mesh {
        &self.layout.mesh
    }

    /// The layout of each parameter (and of its optimizer state).
    pub fn param_shardings(&self) -> &[Sharding] {
        &self.layout.params
    }

    /// The layout of each batch input.
    pub fn batch_shardings(&self) -> &[Sharding] {
        &self.layout.batch
    }

    /// The layout of each frozen input.
    pub fn frozen_shardings(&self) -> &[Sharding] {
        &self.layout.frozen
    }

    /// A training state from parameters laid out as
    /// [`TrainStep::param_shardings`] (and frozen inputs as
    /// [`TrainStep::frozen_shardings`]), with zeroed optimizer state (each
    /// device allocates only its shards).
    pub fn init_state(&self, params: Vec<ShardedBuffer>, frozen: Vec<ShardedBuffer>) -> Result<TrainState> {
        let optimizer = self
            .state_spec
            .iter()
            .zip(&self.layout.state)
            .map(|((_, ty), sharding)| self.layout.mesh.zeros(&self.client, ty, sharding))
            .collect::<Result<_>>()?;
        Ok(TrainState {
            params,
            optimizer,
            frozen,
        })
    }

    /// One optimizer step in place on `state` with learning rate `lr` over
    /// `micro_batches`, each laid out as [`TrainStep::batch_shardings`]:
    /// exactly one unless the step accumulates.
    pub fn step(&self, state: &mut TrainState, micro_batches: &[Vec<&ShardedBuffer>], lr: f32) -> Result<StepMetrics> {
        match (&self.programs, micro_batches) {
            (Programs::Whole(program), [batch]) => self.run_whole(program, state, batch, lr),
            (Programs::Accumulating(programs), [first, rest @ ..]) => {
                self.run_accumulating(programs, state, (first, rest), lr)
            }
            (Programs::Whole(_), _) => Err(Error::Trace {
                op: "train_step",
                message: format!(
                    "the step takes one batch, given {} micro-batches: compile it with `accumulate`",
                    micro_batches.len()
                ),
            }),
            (Programs::Accumulating(_), []) => Err(Error::Trace {
                op: "train_step",
                message: "needs at least one micro-batch".to_string(),
            }),
        }
    }

    /// An f32 scalar on every device of `program`.
    fn scalar(&self, program: &Executable, value: f32) -> Result<ShardedBuffer> {
        self.client
            .sharded_from_host(&[value], &[], &Sharding::replicated(), program.devices())
    }

    /// The whole-step program on one batch.
    fn run_whole(
        &self,
        program: &Executable,
        state: &mut TrainState,
        batch: &[&ShardedBuffer],
        lr: f32,
    ) -> Result<StepMetrics> {
        let lr = self.scalar(program, lr)?;
        let mut args: Vec<Arg<'_, ShardedBuffer>> = state.params.iter().map(Arg::Donate).collect();
        args.extend(state.optimizer.iter().map(Arg::Donate));
        args.extend(state.frozen.iter().map(Arg::Borrow));
        args.extend(batch.iter().map(|&b| Arg::Borrow(b)));
        args.push(Arg::Borrow(&lr));
        let mut outputs = program.execute_sharded(&args)?;
        let metrics = outputs.split_off(outputs.len() - self.metrics);
        let norm = outputs.pop().expect("grad norm output");
        let loss = outputs.pop().expect("loss output");
        state.optimizer = outputs.split_off(state.params.len());
        state.params = outputs;
        Ok(StepMetrics {
            loss: read(&loss)?,
            grad_norm: read(&norm)?,
            metrics: metrics.iter().map(read).collect::<Result<_>>()?,
        })
    }

    /// The accumulation programs over the micro-batches `(first, rest)`.
    fn run_accumulating(
        &self,
        Accumulation {
            convert,
            first,
            accumulate,
            apply,
        }: &Accumulation,
        state: &mut TrainState,
        (first_batch, rest): (&Vec<&ShardedBuffer>, &[Vec<&ShardedBuffer>]),
        lr: f32,
    ) -> Result<StepMetrics> {
        let read_all = |arrays: &[ShardedBuffer]| arrays.iter().map(read).collect::<Result<Vec<_>>>();
        let converted = match convert {
            Some(program) => Some(program.execute_sharded(&state.params.iter().map(Arg::Borrow).collect::<Vec<_>>())?),
            None => None,
        };
        let seen = converted.as_ref().unwrap_or(&state.params);
        let mut args: Vec<Arg<'_, ShardedBuffer>> = seen.iter().map(Arg::Borrow).collect();
        args.extend(state.frozen.iter().map(Arg::Borrow));
        args.extend(first_batch.iter().map(|&b| Arg::Borrow(b)));
        let mut acc = first.execute_sharded(&args)?;
        let mut metrics = read_all(&acc.split_off(acc.len() - self.metrics))?;
        let mut loss_sum = read(&acc.pop().expect("loss output"))?;
        for batch in rest {
            let mut args: Vec<Arg<'_, ShardedBuffer>> = seen.iter().map(Arg::Borrow).collect();
            args.extend(acc.iter().map(Arg::Donate));
            args.extend(state.frozen.iter().map(Arg::Borrow));
            args.extend(batch.iter().map(|&b| Arg::Borrow(b)));
            let mut out = accumulate.execute_sharded(&args)?;
            let more = read_all(&out.split_off(out.len() - self.metrics))?;
            metrics.iter_mut().zip(more).for_each(|(sum, m)| *sum += m);
            loss_sum += read(&out.pop().expect("loss output"))?;
            acc = out;
        }
        drop(converted); // before the update's temporaries
        let count = (1 + rest.len()) as f32;
        let lr = self.scalar(apply, lr)?;
        let scale = self.scalar(apply, 1.0 / count)?;
        let mut args: Vec<Arg<'_, ShardedBuffer>> = state.params.iter().map(Arg::Donate).collect();
        args.extend(state.optimizer.iter().map(Arg::Donate));
        args.extend(acc.iter().map(Arg::Borrow));
        args.push(Arg::Borrow(&lr));
        args.push(Arg::Borrow(&scale));
        let mut outputs = apply.execute_sharded(&args)?;
        let norm = outputs.pop().expect("grad norm output");
        state.optimizer = outputs.split_off(state.params.len());
        state.params = outputs;
        Ok(StepMetrics {
            loss: loss_sum / count,
            grad_norm: read(&norm)?,
            metrics,
        })
    }
}

/// Reads an f32 scalar output.
fn read(scalar: &ShardedBuffer) -> Result<f32> {
    Ok(scalar.to_host::<f32>()?[0])
}

/// Traces and compiles the whole step of `loss_fn`; returns it with the
/// loss function's metric count.
fn whole_program(
    client: &Client,
    spec: &TrainStepSpec<'_>,
    layout: &Layout,
    state_spec: &[(String, TensorType)],
    loss_fn: LossFn<'_>,
) -> Result<(Programs, usize)> {
    let mut state = Vec::new();
    let traced = trace_loss("train_step", spec, ParamsIn::Stored, loss_fn, |graph| {
        state = parameters(graph, &types(state_spec))?;
        Ok(())
    })?;
    let lr = traced.graph.parameter(ElementType::F32, &[])?;
    let (mut outputs, norm) = trace_update(spec, &traced.params, &traced.grads, &state, &lr)?;
    outputs.push(traced.loss.clone());
    outputs.push(norm);
    outputs.extend(traced.metrics.iter().cloned());
    let metrics = traced.metrics.len();
    let function = build(&traced.graph, &outputs)?.donate_range(0..spec.params.len() + state_spec.len())?;
    let (p, s, f, b) = (
        &layout.params[..],
        &layout.state[..],
        &layout.frozen[..],
        &layout.batch[..],
    );
    let function = layout.partition(function, &[p, s, f, b, &scalars(1)], &[p, s, &scalars(2 + metrics)])?;
    Ok((Programs::Whole(function.compile(client)?), metrics))
}

/// Traces and compiles the three accumulation programs of `loss_fn`;
/// returns them with the loss function's metric count.
fn accumulation_programs(
    client: &Client,
    spec: &TrainStepSpec<'_>,
    layout: &Layout,
    state_spec: &[(String, TensorType)],
    loss_fn: LossFn<'_>,
) -> Result<(Programs, usize)> {
    let n = spec.params.len();
    let (p, s, f, b) = (
        &layout.params[..],
        &layout.state[..],
        &layout.frozen[..],
        &layout.batch[..],
    );

    let converted = spec.params.iter().any(|t| t.dtype != spec.compute);
    let params_in = if converted { ParamsIn::Compute } else { ParamsIn::Stored };
    let convert = if converted {
        let graph = Graph::new("compute_params");
        let params = parameters(&graph, &spec.params)?;
        let outputs = params
            .iter()
            .map(|p| p.convert(spec.compute))
            .collect::<Result<Vec<_>>>()?;
        Some(layout.partition(build(&graph, &outputs)?, &[p], &[p])?)
    } else {
        None
    };

    let first = trace_loss("grad_first", spec, params_in, loss_fn, |_| Ok(()))?;
    let metrics = first.metrics.len();
    let per_batch = scalars(1 + metrics); // loss, metrics
    let mut outputs = first.grads.clone();
    outputs.push(first.loss.clone());
    outputs.extend(first.metrics.iter().cloned());
    let first = layout.partition(build(&first.graph, &outputs)?, &[p, f, b], &[p, &per_batch])?;

    let mut acc = Vec::new();
    let more = trace_loss("grad_accumulate", spec, params_in, loss_fn, |graph| {
        acc = parameters(graph, &spec.params)?;
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
    let accumulate = layout.partition(accumulate, &[p, p, f, b], &[p, &per_batch])?;

    let graph = Graph::new("apply_update");
    let params = parameters(&graph, &spec.params)?;
    let state = parameters(&graph, &types(state_spec))?;
    let acc = parameters(&graph, &spec.params)?;
    let lr = graph.parameter(ElementType::F32, &[])?;
    let scale = graph.parameter(ElementType::F32, &[])?;
    let mean = acc
        .iter()
        .map(|a| a.mul(&scale.convert(a.dtype())?))
        .collect::<Result<Vec<_>>>()?;
    let (mut outputs, norm) = trace_update(spec, &params, &mean, &state, &lr)?;
    outputs.push(norm);
    let apply = build(&graph, &outputs)?.donate_range(0..n + state_spec.len())?;
    let apply = layout.partition(apply, &[p, s, p, &scalars(2)], &[p, s, &scalars(1)])?; // … lr, scale → … grad_norm

    let programs = Programs::Accumulating(Accumulation {
        convert: convert.map(|f| f.compile(client)).transpose()?,
        first: first.compile(client)?,
        accumulate: accumulate.compile(client)?,
        apply: apply.compile(client)?,
    });
    Ok((programs, metrics))
}

/// The types of a state spec.
fn types(spec: &[(String, TensorType)]) -> Vec<TensorType> {
    spec.iter().map(|(_, t)| t.clone()).collect()
}

fn build(graph: &Graph, outputs: &[Tensor]) -> Result<Function> {
    let refs: Vec<&Tensor> = outputs.iter().collect();
    graph.build(&refs)
}
