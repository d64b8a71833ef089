//! Sharded arrays: one array of an SPMD program held as a buffer per device,
//! each buffer the device's shard under a [`Sharding`]; cut from a host
//! array and gathered back into one.

use super::buffer::Buffer;
use super::client::Client;
use super::device::Device;
use crate::dtype::{NativeType, TensorType};
use crate::error::{Error, Result};
use crate::sharding::Sharding;

/// An array laid out over devices: shard `i` is on device `i` of the
/// program (partition `i`). Run it with [`Executable::execute_sharded`](super::Executable::execute_sharded).
#[derive(Debug)]
pub struct ShardedBuffer {
    ty: TensorType,
    sharding: Sharding,
    shards: Vec<Buffer>,
}

impl Client {
    /// Cuts the row-major host array `data` of dimensions `dims` by
    /// `sharding` and copies shard `i` to `devices[i]`.
    pub fn sharded_from_host<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        sharding: &Sharding,
        devices: &[Device],
    ) -> Result<ShardedBuffer> {
        let ty = TensorType::new(T::ELEMENT_TYPE, dims);
        let shard = sharding.shard_type_of("a host array", &ty, devices.len())?;
        let shards = sharding
            .shard_host(data, dims, devices.len())?
            .iter()
            .zip(devices)
            .map(|(part, device)| self.buffer_from_host(part, &shard.dims, device))
            .collect::<Result<_>>()?;
        ShardedBuffer::from_shards(ty, sharding.clone(), shards)
    }

    /// Zeros of type `ty` laid out by `sharding` over `devices` (fresh
    /// optimizer state): each device gets only its shard.
    pub fn sharded_zeros(&self, ty: &TensorType, sharding: &Sharding, devices: &[Device]) -> Result<ShardedBuffer> {
        let shard = sharding.shard_type_of("zeros", ty, devices.len())?;
        let zeros = vec![0u8; shard.byte_size()];
        let shards = devices
            .iter()
            .map(|device| self.buffer_from_host_bytes(&zeros, &shard, device))
            .collect::<Result<_>>()?;
        ShardedBuffer::from_shards(ty.clone(), sharding.clone(), shards)
    }
}

impl ShardedBuffer {
    /// The array of type `ty` whose shards under `sharding` are `shards`,
    /// one per device; each must have the shard's type.
    pub fn from_shards(ty: TensorType, sharding: Sharding, shards: Vec<Buffer>) -> Result<ShardedBuffer> {
        let shard = sharding.shard_type_of("a sharded buffer", &ty, shards.len())?;
        let problem = match shards.iter().find(|b| b.tensor_type() != &shard) {
            _ if shards.is_empty() => "it has no shards".to_string(),
            Some(bad) => format!("each shard must be {shard}, one is {}", bad.tensor_type()),
            None => return Ok(ShardedBuffer { ty, sharding, shards }),
        };
        Err(Error::Sharding {
            what: "a sharded buffer".to_string(),
            sharding: sharding.to_hlo(ty.dims.len()),
            ty,
            message: problem,
        })
    }

    /// The whole array's element type and dimensions.
    pub fn tensor_type(&self) -> &TensorType {
        &self.ty
    }

    /// How the array is laid out over the devices.
    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The per-device buffers, in device (partition) order.
    pub fn shards(&self) -> &[Buffer] {
        &self.shards
    }

    /// The per-device buffers, given up.
    pub fn into_shards(self) -> Vec<Buffer> {
        self.shards
    }

    /// Gathers the shards into the whole row-major host array as `T`.
    pub fn to_host<T: NativeType>(&self) -> Result<Vec<T>> {
        let shards = if self.sharding.is_replicated() {
            &self.shards[..self.shards.len().min(1)]
        } else {
            &self.shards[..]
        };
        let shards = shards.iter().map(Buffer::to_host).collect::<Result<Vec<Vec<T>>>>()?;
        self.sharding.gather_host(&self.ty.dims, &shards)
    }
}

impl From<Buffer> for ShardedBuffer {
    /// A whole array on one device (one replicated shard): what a program
    /// that is not partitioned takes through [`Executable::execute_sharded`].
    fn from(buffer: Buffer) -> ShardedBuffer {
        ShardedBuffer {
            ty: buffer.tensor_type().clone(),
            sharding: Sharding::replicated(),
            shards: vec![buffer],
        }
    }
}
