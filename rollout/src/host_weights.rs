//! New parameter values on the host, on their way into an engine: f32 (the
//! learner's copies, shared by every in-process engine) or bf16 (a rollout
//! worker's staged update when its engine runs in bf16, so the worker
//! never holds an f32 copy it does not need).

use std::sync::Arc;

use grpo_model::weights::HostTensor;
use grpo_xla::{Buffer, Client, Device, ElementType};
use half::bf16;

use crate::error::Result;
use crate::programs::upload;

/// A dense row-major bf16 tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Bf16Tensor {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Values.
    pub data: Vec<bf16>,
}

/// Host values an engine can install as one parameter.
pub trait ParameterValues {
    /// Dimensions, outermost first.
    fn dims(&self) -> &[usize];
    /// The first value that is NaN or infinite, as f32.
    fn first_non_finite(&self) -> Option<f32>;
    /// The values on `device` in `dtype` (bf16 or f32), converted one
    /// tensor at a time when their own dtype differs.
    fn upload(&self, client: &Client, device: &Device, dtype: ElementType) -> Result<Buffer>;
}

impl ParameterValues for HostTensor {
    fn dims(&self) -> &[usize] {
        &self.dims
    }

    fn first_non_finite(&self) -> Option<f32> {
        self.data.iter().copied().find(|v| !v.is_finite())
    }

    fn upload(&self, client: &Client, device: &Device, dtype: ElementType) -> Result<Buffer> {
        let dims = self.dims_i64();
        match dtype {
            ElementType::Bf16 => {
                let values: Vec<bf16> = self.data.iter().map(|&v| bf16::from_f32(v)).collect();
                upload(client, device, &values, &dims)
            }
            _ => upload(client, device, &self.data, &dims),
        }
    }
}

impl ParameterValues for Bf16Tensor {
    fn dims(&self) -> &[usize] {
        &self.dims
    }

    fn first_non_finite(&self) -> Option<f32> {
        self.data.iter().find(|v| !v.is_finite()).map(|v| v.to_f32())
    }

    fn upload(&self, client: &Client, device: &Device, dtype: ElementType) -> Result<Buffer> {
        let dims: Vec<i64> = self.dims.iter().map(|&d| d as i64).collect();
        match dtype {
            ElementType::Bf16 => upload(client, device, &self.data, &dims),
            _ => {
                let values: Vec<f32> = self.data.iter().map(|v| v.to_f32()).collect();
                upload(client, device, &values, &dims)
            }
        }
    }
}

/// A whole weight update's tensors, by Hugging Face name, as the engine's
/// thread receives them (shared, so one f32 copy serves every engine).
#[derive(Debug, Clone)]
pub enum IncomingWeights {
    /// f32 values.
    F32(Arc<[(String, HostTensor)]>),
    /// bf16 values.
    Bf16(Arc<[(String, Bf16Tensor)]>),
}

impl From<Arc<[(String, HostTensor)]>> for IncomingWeights {
    fn from(tensors: Arc<[(String, HostTensor)]>) -> Self {
        IncomingWeights::F32(tensors)
    }
}

impl From<Vec<(String, HostTensor)>> for IncomingWeights {
    fn from(tensors: Vec<(String, HostTensor)>) -> Self {
        IncomingWeights::F32(tensors.into())
    }
}

impl From<Vec<(String, Bf16Tensor)>> for IncomingWeights {
    fn from(tensors: Vec<(String, Bf16Tensor)>) -> Self {
        IncomingWeights::Bf16(tensors.into())
    }
}
