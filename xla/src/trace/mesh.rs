//! The devices a train step runs on and how its tensors are laid out over
//! them. One device is a mesh of one: its programs are compiled as traced,
//! with no sharding annotations, and its arrays are whole. Over several
//! devices XLA's SPMD partitioner compiles one partition per device from
//! the layout a [`Parallelism`] gives and inserts the collectives; no
//! reduction is written by hand.
//!
//! - [`Parallelism::DataParallel`]: batch inputs split along dimension 0,
//!   parameters and optimizer state replicated; the gradients are summed
//!   across devices.
//! - [`Parallelism::Fsdp`]: the batch split as above, and every parameter
//!   and optimizer state tensor split along dimension 0 where its size
//!   divides by the device count (replicated where not): each device keeps
//!   only its shard between steps.

use super::function::Function;
use crate::dtype::{NativeType, TensorType};
use crate::error::{Error, Result};
use crate::pjrt::{Client, Device, ShardedBuffer};
use crate::sharding::Sharding;

/// How a train step lays its tensors out over several devices.
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
}

/// The devices of a program and the layout of its tensors on them.
#[derive(Debug, Clone)]
pub struct Mesh {
    /// The layout over several devices; `None` on one.
    parallelism: Option<Parallelism>,
    /// The devices, in partition order.
    devices: Vec<Device>,
}

impl Mesh {
    /// One device: programs unpartitioned, arrays whole.
    pub fn single(device: &Device) -> Mesh {
        Mesh {
            parallelism: None,
            devices: vec![device.clone()],
        }
    }

    /// The client's first device (`None`), or its first
    /// `parallelism.devices()` devices laid out by `parallelism`.
    pub fn new(client: &Client, parallelism: Option<Parallelism>) -> Result<Mesh> {
        let Some(parallelism) = parallelism.filter(|p| p.devices() > 1) else {
            return Ok(Mesh::single(client.device(0)?));
        };
        let devices = client
            .devices()
            .get(..parallelism.devices())
            .ok_or_else(|| Error::Trace {
                op: "mesh",
                message: format!(
                    "{parallelism:?} spans {} devices, the client has {} (on CPU the client option \
                     `cpu_device_count` makes more)",
                    parallelism.devices(),
                    client.devices().len()
                ),
            })?;
        Ok(Mesh {
            parallelism: Some(parallelism),
            devices: devices.to_vec(),
        })
    }

    /// The layout over several devices; `None` on one.
    pub fn parallelism(&self) -> Option<Parallelism> {
        self.parallelism
    }

    /// The devices, in partition order: shard `i` of an array lives on `devices()[i]`.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How many devices the mesh spans.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The layout of a parameter or optimizer state tensor of type `ty`:
    /// split along dimension 0 under FSDP where it divides, else whole on
    /// every device.
    pub fn state_sharding(&self, ty: &TensorType) -> Sharding {
        let devices = self.size();
        match (self.parallelism, ty.dims.first()) {
            (Some(Parallelism::Fsdp { .. }), Some(&rows)) if rows % devices as i64 == 0 => Sharding::split(0, devices),
            _ => Sharding::replicated(),
        }
    }

    /// The layout of a batch input of type `ty`: split along dimension 0
    /// over several devices (a scalar replicated), whole on one.
    pub fn batch_sharding(&self, ty: &TensorType) -> Sharding {
        if self.parallelism.is_none() || ty.dims.is_empty() {
            Sharding::replicated()
        } else {
            Sharding::split(0, self.size())
        }
    }

    /// `function` with its parameters laid out as `inputs` and its outputs
    /// as `outputs` for the partitioner; on one device, `function` as it is.
    pub fn partition(&self, function: Function, inputs: Vec<Sharding>, outputs: Vec<Sharding>) -> Result<Function> {
        match self.parallelism {
            None => Ok(function),
            Some(_) => function.sharded(self.size(), inputs, outputs),
        }
    }

    /// The row-major host array `data` of dimensions `dims` cut by
    /// `sharding` onto the mesh's devices.
    pub fn from_host<T: NativeType>(
        &self,
        client: &Client,
        data: &[T],
        dims: &[i64],
        sharding: &Sharding,
    ) -> Result<ShardedBuffer> {
        client.sharded_from_host(data, dims, sharding, &self.devices)
    }

    /// Zeros of type `ty` laid out by `sharding` (each device allocates only its shard).
    pub fn zeros(&self, client: &Client, ty: &TensorType, sharding: &Sharding) -> Result<ShardedBuffer> {
        client.sharded_zeros(ty, sharding, &self.devices)
    }
}
