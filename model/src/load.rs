//! Moving a checkpoint's weights onto a device in the decoder's parameter
//! order, one tensor at a time (host memory holds at most one f32 tensor
//! beyond the memory-mapped file).

use grpo_xla::{Buffer, Client, Device, ElementType};
use half::bf16;

use crate::decoder::Decoder;
use crate::error::{Error, Result};
use crate::names::ParamSpec;
use crate::weights::WeightSource;

/// Uploads every parameter of `decoder` from `source` as `dtype` (f32 or
/// bf16), checking each shape; a missing or misshapen tensor is an error
/// naming it.
pub fn upload_parameters(
    client: &Client,
    device: &Device,
    decoder: &Decoder,
    source: &dyn WeightSource,
    dtype: ElementType,
) -> Result<Vec<Buffer>> {
    upload_tensors(client, device, decoder.parameters(), source, dtype)
}

/// Uploads the tensors `specs` names from `source` as `dtype` (f32 or
/// bf16), in their order, checking each shape.
pub fn upload_tensors(
    client: &Client,
    device: &Device,
    specs: &[ParamSpec],
    source: &dyn WeightSource,
    dtype: ElementType,
) -> Result<Vec<Buffer>> {
    specs
        .iter()
        .map(|spec| {
            let tensor = source.tensor(&spec.name)?;
            if tensor.dims != spec.dims {
                return Err(Error::Tensor {
                    path: source.location(),
                    tensor: spec.name.clone(),
                    message: format!("has shape {:?}, the config needs {:?}", tensor.dims, spec.dims),
                });
            }
            upload_values(client, device, &tensor.data, &tensor.dims_i64(), dtype)
        })
        .collect()
}

/// `values` of dimensions `dims` on `device` as `dtype`: f32 as they are,
/// bf16 rounded to nearest even; other dtypes are refused.
pub fn upload_values(
    client: &Client,
    device: &Device,
    values: &[f32],
    dims: &[i64],
    dtype: ElementType,
) -> Result<Buffer> {
    Ok(match dtype {
        ElementType::F32 => client.buffer_from_host(values, dims, device)?,
        ElementType::Bf16 => {
            let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            client.buffer_from_host(&halves, dims, device)?
        }
        other => {
            return Err(Error::Config {
                field: "dtype".to_string(),
                message: format!("parameters can be f32 or bf16, not {other}"),
            });
        }
    })
}
