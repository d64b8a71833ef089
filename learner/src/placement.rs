//! Where the learner keeps its parameters, optimizer state and batches: on
//! one device (the default), or laid out over the client's first devices
//! for XLA's SPMD partitioner (`[trainer] parallelism`, grpo-xla's
//! [`Parallelism`]): data parallel — parameters and AdamW state replicated,
//! each device a slice of every micro-batch's rows, gradients summed by the
//! partitioner's all-reduce — or FSDP — parameters, gradients and AdamW
//! state also split along dimension 0, so each device holds about 1/N of
//! them between steps.
//!
//! The forward-only log-prob programs (old policy for μ > 1, the frozen
//! reference for β > 0, laid out as the learner's weights) are partitioned
//! the same way ([`crate::completion_logprobs`]). What leaves the learner
//! goes through the host: the weights pushed to the fleet and written to
//! checkpoints are gathered from their shards ([`LearnerState::host_params`]);
//! `grpo sft`'s eval loss runs on the first device
//! ([`LearnerState::with_params_on_one_device`]: its replicas under data
//! parallelism, a gathered copy under FSDP).

use grpo_model::decoder::Decoder;
use grpo_model::weights::HostTensor;
use grpo_xla::trace::{Parallelism, ShardedTrainState, TrainState};
use grpo_xla::{Buffer, Client, Device, ElementType, NativeType, ShardedBuffer, TensorType};

use crate::checkpoint::host_tensor;
use crate::error::{Error, Result};

/// The devices the learner's state and batches are on.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Everything on one device.
    OneDevice(Device),
    /// Laid out by `parallelism` over `devices` (the client's first ones).
    Spmd {
        /// Data parallel or FSDP, and over how many devices.
        parallelism: Parallelism,
        /// The devices, in partition order.
        devices: Vec<Device>,
    },
}

/// The learner's parameters and optimizer state on its [`Placement`] (a
/// frozen reference policy has no optimizer state).
#[derive(Debug)]
pub enum LearnerState {
    /// On one device.
    OneDevice(TrainState),
    /// Sharded over several.
    Sharded(ShardedTrainState),
}

/// What a learner state's optimizer state starts as.
#[derive(Debug, Clone, Copy)]
pub enum OptimizerState<'a> {
    /// None: a frozen policy (the KL term's reference).
    Frozen,
    /// Zeros of these names and types (a fresh run; the optimizer's
    /// [`grpo_xla::trace::Optimizer::state_spec`]).
    Zeros(&'a [(String, TensorType)]),
    /// A checkpoint's tensors, in the optimizer's state order.
    Resumed(&'a [HostTensor]),
}

/// One micro-batch's inputs on the learner's placement, in
/// [`crate::trainer::batch_types`] order.
#[derive(Debug)]
pub enum BatchInputs {
    /// On one device.
    OneDevice(Vec<Buffer>),
    /// Each input's rows split over the devices.
    Sharded(Vec<ShardedBuffer>),
}

impl Placement {
    /// The placement of `parallelism` (`None`: the client's first device)
    /// over the client's first devices.
    pub fn new(client: &Client, parallelism: Option<Parallelism>) -> Result<Placement> {
        let Some(parallelism) = parallelism else {
            return Ok(Placement::OneDevice(client.device(0)?.clone()));
        };
        let devices = client
            .devices()
            .get(..parallelism.devices())
            .ok_or_else(|| Error::Config {
                field: "trainer.devices",
                message: format!(
                    "{}: the client has {} devices",
                    parallelism.devices(),
                    client.devices().len()
                ),
            })?;
        Ok(Placement::Spmd {
            parallelism,
            devices: devices.to_vec(),
        })
    }

    /// The SPMD layout, if any.
    pub fn parallelism(&self) -> Option<Parallelism> {
        match self {
            Placement::OneDevice(_) => None,
            Placement::Spmd { parallelism, .. } => Some(*parallelism),
        }
    }

    /// Devices the learner spans.
    pub fn device_count(&self) -> usize {
        self.parallelism().map_or(1, Parallelism::devices)
    }

    /// Checks that micro-batches of `rows` rows split evenly over the devices.
    pub fn check_rows(&self, rows: usize) -> Result<()> {
        let devices = self.device_count();
        if !rows.is_multiple_of(devices) {
            return Err(Error::Config {
                field: "trainer.micro_batch_size",
                message: format!("{rows} rows do not split over {devices} devices: use a multiple of {devices}"),
            });
        }
        Ok(())
    }

    /// The learner state of `params` (f32 on the client's first device, the
    /// decoder's order) with `optimizer`'s state, laid out on this placement.
    pub fn state(&self, client: &Client, params: Vec<Buffer>, optimizer: OptimizerState<'_>) -> Result<LearnerState> {
        Ok(match self {
            Placement::OneDevice(device) => LearnerState::OneDevice(TrainState {
                params,
                optimizer: match optimizer {
                    OptimizerState::Frozen => Vec::new(),
                    OptimizerState::Zeros(spec) => spec
                        .iter()
                        .map(|(_, ty)| Ok(client.buffer_from_host_bytes(&vec![0u8; ty.byte_size()], ty, device)?))
                        .collect::<Result<_>>()?,
                    OptimizerState::Resumed(tensors) => tensors
                        .iter()
                        .map(|t| Ok(client.buffer_from_host(&t.data, &t.dims_i64(), device)?))
                        .collect::<Result<_>>()?,
                },
            }),
            Placement::Spmd { parallelism, devices } => {
                let sharding = |dims: &[i64]| parallelism.state_sharding(&TensorType::new(ElementType::F32, dims));
                let place = |tensor: &HostTensor| -> Result<ShardedBuffer> {
                    let dims = tensor.dims_i64();
                    Ok(client.sharded_from_host(&tensor.data, &dims, &sharding(&dims), devices)?)
                };
                LearnerState::Sharded(ShardedTrainState {
                    params: params.iter().map(|p| place(&host_tensor(p)?)).collect::<Result<_>>()?,
                    optimizer: match optimizer {
                        OptimizerState::Frozen => Vec::new(),
                        OptimizerState::Zeros(spec) => spec
                            .iter()
                            .map(|(_, ty)| Ok(client.sharded_zeros(ty, &sharding(&ty.dims), devices)?))
                            .collect::<Result<_>>()?,
                        OptimizerState::Resumed(tensors) => tensors.iter().map(place).collect::<Result<_>>()?,
                    },
                })
            }
        })
    }

    /// No inputs yet, of this placement's kind.
    pub fn inputs(&self) -> BatchInputs {
        match self {
            Placement::OneDevice(_) => BatchInputs::OneDevice(Vec::new()),
            Placement::Spmd { .. } => BatchInputs::Sharded(Vec::new()),
        }
    }

    /// Appends the host array `data` of dimensions `dims` to `inputs`: on
    /// the device, or split along its rows over the devices (a scalar
    /// replicated).
    pub fn push<T: NativeType>(
        &self,
        client: &Client,
        inputs: &mut BatchInputs,
        data: &[T],
        dims: &[i64],
    ) -> Result<()> {
        match (self, inputs) {
            (Placement::OneDevice(device), BatchInputs::OneDevice(buffers)) => {
                buffers.push(client.buffer_from_host(data, dims, device)?);
            }
            (Placement::Spmd { parallelism, devices }, BatchInputs::Sharded(arrays)) => {
                let sharding = parallelism.batch_sharding(&TensorType::new(T::ELEMENT_TYPE, dims));
                arrays.push(client.sharded_from_host(data, dims, &sharding, devices)?);
            }
            _ => {
                return Err(Error::Config {
                    field: "trainer.parallelism",
                    message: "a batch input of another placement than the learner's".to_string(),
                });
            }
        }
        Ok(())
    }
}

impl LearnerState {
    /// The parameters as f32 host tensors named by `decoder` (gathered
    /// from their shards).
    pub fn host_params(&self, decoder: &Decoder) -> Result<Vec<(String, HostTensor)>> {
        let tensors = match self {
            LearnerState::OneDevice(state) => host_buffers(&state.params)?,
            LearnerState::Sharded(state) => host_sharded(&state.params)?,
        };
        let names = decoder.parameters().iter().map(|p| p.name.clone());
        Ok(names.zip(tensors).collect())
    }

    /// The optimizer state as f32 host tensors, in its order.
    pub fn host_optimizer(&self) -> Result<Vec<HostTensor>> {
        match self {
            LearnerState::OneDevice(state) => host_buffers(&state.optimizer),
            LearnerState::Sharded(state) => host_sharded(&state.optimizer),
        }
    }

    /// Runs `f` on the parameters whole on the client's first device, as
    /// the forward-only programs take them: the buffers themselves on one
    /// device, the first device's replicas under data parallelism, a
    /// gathered copy under FSDP (freed when `f` returns).
    pub fn with_params_on_one_device<T>(&self, client: &Client, f: impl FnOnce(&[&Buffer]) -> Result<T>) -> Result<T> {
        match self {
            LearnerState::OneDevice(state) => f(&state.params.iter().collect::<Vec<_>>()),
            LearnerState::Sharded(state) if state.params.iter().all(|p| p.sharding().is_replicated()) => {
                f(&state.params.iter().map(|p| &p.shards()[0]).collect::<Vec<_>>())
            }
            LearnerState::Sharded(state) => {
                let device = client.device(0)?;
                let gathered = state
                    .params
                    .iter()
                    .map(|p| Ok(client.buffer_from_host(&p.to_host::<f32>()?, &p.tensor_type().dims, device)?))
                    .collect::<Result<Vec<Buffer>>>()?;
                f(&gathered.iter().collect::<Vec<_>>())
            }
        }
    }

    /// Device bytes of parameters and optimizer state held by each device.
    pub fn device_bytes(&self) -> Vec<usize> {
        match self {
            LearnerState::OneDevice(state) => vec![
                state
                    .params
                    .iter()
                    .chain(&state.optimizer)
                    .map(Buffer::device_bytes)
                    .sum(),
            ],
            LearnerState::Sharded(state) => state.device_bytes(),
        }
    }
}

/// Device buffers as host tensors.
fn host_buffers(buffers: &[Buffer]) -> Result<Vec<HostTensor>> {
    buffers.iter().map(host_tensor).collect()
}

/// Sharded f32 arrays gathered into host tensors.
fn host_sharded(arrays: &[ShardedBuffer]) -> Result<Vec<HostTensor>> {
    arrays
        .iter()
        .map(|array| {
            let dims = array.tensor_type().dims.iter().map(|&d| d as usize).collect();
            Ok(HostTensor::new(dims, array.to_host::<f32>()?)?)
        })
        .collect()
}
