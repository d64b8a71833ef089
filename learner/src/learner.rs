//! The learner: the policy's f32 master weights and AdamW state on a
//! device mesh (one device, or data parallel / FSDP over several under
//! `[trainer] parallelism`; see grpo-xla's [`Mesh`]), the compiled train
//! steps of its [`Objective`] keyed by micro-batch shape, and what leaves
//! it: host copies of the weights (for the fleet, checkpoints and the final
//! folder), device copies for an in-process engine on its one device
//! ([`EngineCopy`]), and checkpoints.
//!
//! With LoRA adapters ([`Decoder::with_adapters`]) the learner trains the
//! adapters alone: the base model is a frozen input of the train step (no
//! gradient, no optimizer state), and what leaves for the fleet is the
//! policy with the adapters merged in. With adapter dropout
//! ([`Decoder::with_adapter_dropout`]) each micro-batch of each update
//! draws its own masks, numbered by the update and the micro-batch, so a
//! resumed run draws the masks it would have drawn.
//!
//! Memory: parameters plus AdamW's two moments, three f32 copies of the
//! model (split over the devices under FSDP) — with adapters, one copy of
//! the base (f32, or bf16 when it is given so) plus three of the adapters —
//! and one set of compiled programs per micro-batch shape; a host copy of
//! the weights only while it is being sent or written.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use grpo_model::decoder::Decoder;
use grpo_model::lora::AdapterFolder;
use grpo_model::names::ParamSpec;
use grpo_model::weights::HostTensor;
use grpo_xla::trace::{AdamW, Mesh, Optimizer, StepMetrics, Tensor, TrainState, TrainStep, TrainStepSpec};
use grpo_xla::{Buffer, Client, ElementType, ShardedBuffer, TensorType};

use crate::batch::MicroBatchShape;
use crate::checkpoint::{self, CheckpointParts, OPTIMIZER_FILE, SavedModel, SavedPolicy};
use crate::engine_copy::EngineCopy;
use crate::error::{Error, Result};
use crate::objective::Objective;

/// How the learner updates its weights.
#[derive(Debug, Clone, Copy)]
pub struct Optimization {
    /// AdamW's settings (the rate comes from the run's schedule each step).
    pub optimizer: AdamW,
    /// Global gradient-norm clipping; `None` disables it.
    pub max_grad_norm: Option<f64>,
    /// The dtype the forward and backward run in: the f32 master weights
    /// are converted to it inside the step (bf16 is mixed precision;
    /// gradients flow back through the conversion).
    pub compute: ElementType,
}

/// The policy's weights and optimizer state on a mesh, trained toward an objective.
pub struct Learner<O> {
    client: Client,
    decoder: Decoder,
    mesh: Mesh,
    objective: O,
    optimization: Optimization,
    state: TrainState,
    steps: HashMap<(MicroBatchShape, bool), TrainStep>,
    /// Compiled on the first sync to an engine on the learner's device.
    engine_copy: Option<EngineCopy>,
}

impl<O: Objective> Learner<O> {
    /// A learner of `decoder` on `mesh` from `params` (on the client's
    /// first device, the decoder's order: with adapters, the base model's
    /// then the adapters'; f32, but for a frozen base, which is held in the
    /// dtype it comes in: f32 or bf16) and `optimizer_state`: a checkpoint's
    /// tensors by name, or zeros for `None` (or a checkpoint saved before
    /// the first step, which holds none).
    pub fn new(
        client: &Client,
        decoder: &Decoder,
        mesh: Mesh,
        objective: O,
        optimization: Optimization,
        params: Vec<Buffer>,
        optimizer_state: Option<&BTreeMap<String, HostTensor>>,
    ) -> Result<Learner<O>> {
        let names = optimizer_names(decoder, &optimization.optimizer);
        let optimizer = match optimizer_state.filter(|saved| !saved.is_empty()) {
            None => names
                .iter()
                .map(|(_, ty)| Ok(mesh.zeros(client, ty, &mesh.state_sharding(ty))?))
                .collect::<Result<_>>()?,
            Some(saved) => names
                .iter()
                .map(|(name, ty)| {
                    let tensor = saved_tensor(saved, name, ty)?;
                    Ok(mesh.from_host(client, &tensor.data, &ty.dims, &mesh.state_sharding(ty))?)
                })
                .collect::<Result<_>>()?,
        };
        let mut params = params;
        let trained = params.split_off(frozen_specs(decoder).len());
        let state = TrainState {
            params: lay_out(client, &mesh, trained)?,
            optimizer,
            frozen: lay_out(client, &mesh, params)?,
        };
        Ok(Learner {
            client: client.clone(),
            decoder: decoder.clone(),
            mesh,
            objective,
            optimization,
            state,
            steps: HashMap::new(),
            engine_copy: None,
        })
    }

    /// The devices it spans.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The policy's decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Its parameters and optimizer state.
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// The policy's weights in the decoder's order: the frozen base's, then
    /// the trained ones (all of them without adapters).
    pub fn policy(&self) -> Vec<&ShardedBuffer> {
        self.state.frozen.iter().chain(&self.state.params).collect()
    }

    /// The dtypes of [`Learner::policy`]'s weights.
    pub fn policy_dtypes(&self) -> Vec<ElementType> {
        self.policy().iter().map(|p| p.tensor_type().dtype).collect()
    }

    /// One optimizer step at learning rate `lr` over `micro_batches` of
    /// `shape` (each the objective's inputs on the mesh, as
    /// [`crate::batch::batch_input`] lays them out), compiling the step for
    /// the shape on first use. `update` numbers the step within the run
    /// (the same on a resumed run): it seeds the adapters' dropout masks.
    pub fn train(
        &mut self,
        shape: MicroBatchShape,
        micro_batches: &[Vec<ShardedBuffer>],
        lr: f32,
        update: u64,
    ) -> Result<StepMetrics> {
        let key = (shape, micro_batches.len() > 1);
        if !self.steps.contains_key(&key) {
            let step = self.compile(shape, key.1)?;
            self.steps.insert(key, step);
        }
        let draws = if self.decoder.adapter_dropout() > 0.0 {
            (0..micro_batches.len())
                .map(|micro| {
                    let draw = ((update << 10) | micro as u64) as u32;
                    crate::batch::batch_input(&self.client, &self.mesh, &[draw], &[])
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let inputs: Vec<Vec<&ShardedBuffer>> = micro_batches
            .iter()
            .enumerate()
            .map(|(i, m)| m.iter().chain(draws.get(i)).collect())
            .collect();
        let mut metrics = self.steps[&key].step(&mut self.state, &inputs, lr)?;
        if self.decoder.router_aux_loss_coef() > 0.0
            && let Some(balance) = metrics.metrics.last_mut()
        {
            // Summed over the micro-batches, reported as their mean.
            *balance /= micro_batches.len().max(1) as f32;
        }
        Ok(metrics)
    }

    /// Traces the objective's loss for micro-batches of `shape` and
    /// compiles its train step on the mesh (with adapter dropout, each
    /// micro-batch's inputs end with its masks' draw number). With the
    /// load-balancing loss, each micro-batch's loss adds `coef · balance`,
    /// as transformers adds it before the step averages the micro-batches,
    /// and its last metric is the balance loss.
    fn compile(&self, shape: MicroBatchShape, accumulate: bool) -> Result<TrainStep> {
        let dropout = self.decoder.adapter_dropout() > 0.0;
        let coef = self.decoder.router_aux_loss_coef();
        let mut batch = self.objective.batch_types(shape);
        if dropout {
            batch.push(TensorType::new(ElementType::U32, []));
        }
        let spec = TrainStepSpec {
            params: types(trained_specs(&self.decoder), ElementType::F32),
            frozen: self.state.frozen.iter().map(|b| b.tensor_type().clone()).collect(),
            batch,
            optimizer: &self.optimization.optimizer,
            max_grad_norm: self.optimization.max_grad_norm,
            accumulate,
            compute: self.optimization.compute,
        };
        let loss = |trained: &[Tensor], frozen: &[Tensor], batch: &[Tensor]| {
            // The step hands the trained parameters over in the compute dtype already.
            let mut params = in_dtype(frozen, self.optimization.compute)?;
            params.extend(trained.iter().cloned());
            let batch = match (dropout, batch.split_last()) {
                (true, Some((draw, inputs))) => {
                    params.push(draw.clone());
                    inputs
                }
                _ => batch,
            };
            let traced = self.objective.loss(&self.decoder, &params, batch)?;
            let (mut loss, mut metrics) = (traced.loss, traced.metrics);
            if let Some(balance) = traced.balance.filter(|_| coef > 0.0) {
                loss = loss.add(&balance.mul_scalar(coef)?)?;
                metrics.push(balance.stop_gradient()?);
            }
            Ok((loss, metrics))
        };
        Ok(TrainStep::compile(&self.client, &spec, &self.mesh, loss)?)
    }

    /// Copies of the policy's weights in `dtype` (adapters merged in), made
    /// on the device, for an engine on device `device`; `None` unless the
    /// learner's whole state is on that one device (then weights go through
    /// the host). Refuses weights with a non-finite value.
    pub fn engine_weights(&mut self, device: i32, dtype: ElementType) -> Result<Option<Vec<Buffer>>> {
        let on_device = self.mesh.devices().len() == 1 && self.mesh.devices()[0].id() == device;
        if !on_device {
            return Ok(None);
        }
        if self.engine_copy.as_ref().is_none_or(|copy| copy.dtype() != dtype) {
            let inputs = self.policy_dtypes();
            self.engine_copy = Some(EngineCopy::compile(&self.client, &self.decoder, &inputs, dtype)?);
        }
        let params: Vec<&Buffer> = self.policy().iter().map(|p| &p.shards()[0]).collect();
        let copy = self.engine_copy.as_ref().expect("compiled above");
        copy.run(&params).map(Some)
    }

    /// The load-balancing loss of a step's metrics (its mean over the
    /// micro-batches, without the coefficient), when the step adds it.
    pub fn balance_loss(&self, metrics: &StepMetrics) -> Option<f32> {
        (self.decoder.router_aux_loss_coef() > 0.0)
            .then(|| metrics.metrics.last().copied())
            .flatten()
    }

    /// Train-step programs compiled so far (one per micro-batch shape and accumulation).
    pub fn compiled_steps(&self) -> usize {
        self.steps.len()
    }

    /// The trained parameters (the adapters, or the whole model without
    /// them) as f32 host tensors named by the decoder (gathered from their shards).
    pub fn host_params(&self) -> Result<Vec<(String, HostTensor)>> {
        let names = trained_specs(&self.decoder).iter().map(|p| p.name.clone());
        Ok(names.zip(host_arrays(&self.state.params)?).collect())
    }

    /// The policy as a plain model's f32 host tensors named by the base
    /// decoder: the adapters merged in on the device (in f32) when it has
    /// them, else [`Learner::host_params`].
    pub fn host_policy(&self) -> Result<Vec<(String, HostTensor)>> {
        if self.decoder.lora().is_none() {
            return self.host_params();
        }
        let merge = EngineCopy::compile(&self.client, &self.decoder, &self.policy_dtypes(), ElementType::F32)?;
        let merged = self.with_params_on_one_device(|params| merge.run(params))?;
        let names = self.decoder.base_parameters().iter().map(|p| p.name.clone());
        names
            .zip(&merged)
            .map(|(name, buffer)| Ok((name, host_tensor(buffer)?)))
            .collect()
    }

    /// The optimizer state as f32 host tensors, named as checkpoints store them.
    pub fn host_optimizer(&self) -> Result<Vec<(String, HostTensor)>> {
        let names = optimizer_names(&self.decoder, &self.optimization.optimizer);
        let names = names.into_iter().map(|(name, _)| name);
        Ok(names.zip(host_arrays(&self.state.optimizer)?).collect())
    }

    /// Bytes of every buffer alive on the learner's client (its devices'
    /// memory: the learner's state, and the in-process engines' weights and
    /// KV caches when they share the client), not counting program temporaries.
    pub fn live_buffer_bytes(&self) -> usize {
        self.client.live_buffers().bytes
    }

    /// Device bytes of parameters and optimizer state held by each device.
    pub fn state_bytes_per_device(&self) -> Vec<usize> {
        self.state.device_bytes()
    }

    /// The trained weights as they are saved: a PEFT adapter folder's
    /// tensors with adapters, else the whole model's.
    pub fn saved_policy(&self) -> Result<SavedPolicy> {
        let params = self.host_params()?;
        Ok(match self.decoder.lora() {
            Some(lora) => SavedPolicy::Adapters(AdapterFolder {
                lora: lora.clone(),
                tensors: params.into_iter().collect(),
                dropout: self.decoder.adapter_dropout(),
            }),
            None => SavedPolicy::Model(params),
        })
    }

    /// Writes `OUT/checkpoint-<step>/` (the policy as a Hugging Face folder
    /// of `model`, or its adapters as a PEFT folder; the optimizer state and
    /// the loop's `loop_state`), atomically.
    pub fn save_checkpoint(
        &self,
        out: &Path,
        step: u64,
        model: SavedModel<'_>,
        loop_state: serde_json::Value,
    ) -> Result<PathBuf> {
        checkpoint::save(
            out,
            &CheckpointParts {
                step,
                model,
                policy: self.saved_policy()?,
                optimizer: self.host_optimizer()?,
                state: loop_state,
            },
        )
    }

    /// Runs `f` on the policy's weights (the decoder's order) whole on the
    /// mesh's first device, as forward-only programs of one device take
    /// them: the arrays' buffers on one device or when replicated, a
    /// gathered copy under FSDP (freed when `f` returns).
    pub fn with_params_on_one_device<T>(&self, f: impl FnOnce(&[&Buffer]) -> Result<T>) -> Result<T> {
        let params = self.policy();
        if params.iter().all(|p| p.sharding().is_replicated()) {
            return f(&params.iter().map(|p| &p.shards()[0]).collect::<Vec<_>>());
        }
        let device = &self.mesh.devices()[0];
        let gathered = params
            .iter()
            .map(|p| {
                let dims = &p.tensor_type().dims;
                Ok(match p.tensor_type().dtype {
                    ElementType::Bf16 => self
                        .client
                        .buffer_from_host(&p.to_host::<half::bf16>()?, dims, device)?,
                    _ => self.client.buffer_from_host(&p.to_host::<f32>()?, dims, device)?,
                })
            })
            .collect::<Result<Vec<Buffer>>>()?;
        f(&gathered.iter().collect::<Vec<_>>())
    }
}

/// Checks that micro-batches of `rows` rows split evenly over `mesh`'s devices.
pub fn check_rows(mesh: &Mesh, rows: usize) -> Result<()> {
    let devices = mesh.size();
    if !rows.is_multiple_of(devices) {
        return Err(Error::Config {
            field: "trainer.micro_batch_size",
            message: format!("{rows} rows do not split over {devices} devices: use a multiple of {devices}"),
        });
    }
    Ok(())
}

/// Weights `params` (f32 or bf16 on the client's first device, the
/// decoder's order) laid out on `mesh` as the learner keeps them, each in
/// its dtype: the buffers themselves on one device, cut through the host
/// over several.
pub fn lay_out(client: &Client, mesh: &Mesh, params: Vec<Buffer>) -> Result<Vec<ShardedBuffer>> {
    if mesh.parallelism().is_none() {
        return Ok(params.into_iter().map(ShardedBuffer::from).collect());
    }
    params
        .iter()
        .map(|p| {
            let dims = p.dims().to_vec();
            let sharding = mesh.state_sharding(&TensorType::new(p.dtype(), dims.clone()));
            Ok(match p.dtype() {
                ElementType::Bf16 => mesh.from_host(client, &p.to_host::<half::bf16>()?, &dims, &sharding)?,
                _ => mesh.from_host(client, &host_tensor(p)?.data, &dims, &sharding)?,
            })
        })
        .collect()
}

/// The optimizer state's names and types, its `m.<i>` / `v.<i>` named after
/// the trained parameters (`m.model.norm.weight`), as checkpoints store them.
pub fn optimizer_names(decoder: &Decoder, optimizer: &dyn Optimizer) -> Vec<(String, TensorType)> {
    let trained = trained_specs(decoder);
    optimizer
        .state_spec(&types(trained, ElementType::F32))
        .into_iter()
        .map(|(name, ty)| {
            let named = match name.split_once('.') {
                Some((slot, index)) => match index.parse::<usize>() {
                    Ok(i) => format!("{slot}.{}", trained[i].name),
                    Err(_) => name,
                },
                None => name,
            };
            (named, ty)
        })
        .collect()
}

/// The checkpoint tensor `name`, checked to be of type `ty`.
fn saved_tensor<'a>(saved: &'a BTreeMap<String, HostTensor>, name: &str, ty: &TensorType) -> Result<&'a HostTensor> {
    let bad = |message: String| Error::Data {
        path: PathBuf::from(OPTIMIZER_FILE),
        line: 0,
        message,
    };
    let tensor = saved.get(name).ok_or_else(|| {
        bad(format!(
            "no optimizer tensor `{name}`: the checkpoint is of another model or optimizer"
        ))
    })?;
    let dims = tensor.dims_i64();
    if dims != ty.dims {
        return Err(bad(format!(
            "`{name}` has shape {dims:?}, the model needs {:?}",
            ty.dims
        )));
    }
    Ok(tensor)
}

/// The parameters of `decoder` the learner trains: its adapters when it
/// has some, else all of them.
pub fn trained_specs(decoder: &Decoder) -> &[ParamSpec] {
    match decoder.lora() {
        Some(_) => decoder.adapter_parameters(),
        None => decoder.parameters(),
    }
}

/// The parameters of `decoder` the learner keeps frozen: the base model
/// under adapters, else none.
pub fn frozen_specs(decoder: &Decoder) -> &[ParamSpec] {
    match decoder.lora() {
        Some(_) => decoder.base_parameters(),
        None => &[],
    }
}

/// The types of parameters `specs` in `dtype`, in their order.
pub fn types(specs: &[ParamSpec], dtype: ElementType) -> Vec<TensorType> {
    specs
        .iter()
        .map(|p| TensorType::new(dtype, p.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
        .collect()
}

/// `params` converted to `dtype` where they are in another.
pub fn in_dtype(params: &[Tensor], dtype: ElementType) -> grpo_xla::Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| {
            if p.dtype() == dtype {
                Ok(p.clone())
            } else {
                p.convert(dtype)
            }
        })
        .collect()
}

/// A device buffer (f32 or bf16) as an f32 host tensor.
pub fn host_tensor(buffer: &Buffer) -> Result<HostTensor> {
    let dims: Vec<usize> = buffer.dims().iter().map(|&d| d as usize).collect();
    let data = match buffer.dtype() {
        ElementType::Bf16 => buffer.to_host::<half::bf16>()?.iter().map(|v| v.to_f32()).collect(),
        _ => buffer.to_host::<f32>()?,
    };
    Ok(HostTensor::new(dims, data)?)
}

/// Named device buffers (f32 or bf16) as named f32 host tensors, collected
/// into any collection (a list for the fleet, a map for a checkpoint).
pub fn host_tensors<C: FromIterator<(String, HostTensor)>>(tensors: &[(&str, &Buffer)]) -> Result<C> {
    tensors
        .iter()
        .map(|(name, buffer)| Ok((name.to_string(), host_tensor(buffer)?)))
        .collect()
}

/// f32 arrays gathered from their shards into host tensors.
fn host_arrays(arrays: &[ShardedBuffer]) -> Result<Vec<HostTensor>> {
    arrays
        .iter()
        .map(|array| {
            let dims = array.tensor_type().dims.iter().map(|&d| d as usize).collect();
            Ok(HostTensor::new(dims, array.to_host::<f32>()?)?)
        })
        .collect()
}
