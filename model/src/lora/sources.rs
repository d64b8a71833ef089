//! Adapters presented as weights: beside a base model's tensors (what a
//! decoder with adapters uploads) or merged into them (a plain model).

use std::collections::BTreeMap;

use super::LoraConfig;
use crate::error::{Error, Result};
use crate::weights::{HostTensor, WeightSource};

/// A base model's weights with adapter tensors beside them: what a decoder
/// with adapters uploads.
pub struct WithAdapters<'a> {
    /// The base model's weights.
    pub base: &'a dyn WeightSource,
    /// The adapter tensors, named as [`adapter_parameters`] names them.
    pub adapters: &'a BTreeMap<String, HostTensor>,
}

impl WeightSource for WithAdapters<'_> {
    fn location(&self) -> std::path::PathBuf {
        self.base.location()
    }

    fn names(&self) -> Vec<String> {
        let mut names = self.base.names();
        names.extend(self.adapters.keys().cloned());
        names.sort();
        names
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self.adapters.get(name) {
            Some(tensor) => Ok(tensor.clone()),
            None => self.base.tensor(name),
        }
    }
}

/// A base model's weights with adapters merged in: each adapted layer's
/// weight becomes `W + s·B·A` (summed in f64, stored f32), the rest as the
/// base has them — a plain model with the adapters' behaviour, for engines
/// that take whole weights and for merged folders.
pub struct Merged<'a> {
    /// The base model's weights.
    pub base: &'a dyn WeightSource,
    /// The adapters' settings.
    pub lora: &'a LoraConfig,
    /// The adapter tensors, named as [`adapter_parameters`] names them.
    pub adapters: &'a BTreeMap<String, HostTensor>,
}

impl WeightSource for Merged<'_> {
    fn location(&self) -> std::path::PathBuf {
        self.base.location()
    }

    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let mut weight = self.base.tensor(name)?;
        let Some(layer) = name.strip_suffix(".weight") else {
            return Ok(weight);
        };
        let (Some(a), Some(b)) = (
            self.adapters.get(&format!("{layer}.lora_A.weight")),
            self.adapters.get(&format!("{layer}.lora_B.weight")),
        ) else {
            return Ok(weight);
        };
        merge_into(&mut weight, a, b, self.lora.scaling()).map_err(|message| Error::Tensor {
            path: self.base.location(),
            tensor: name.to_string(),
            message,
        })?;
        Ok(weight)
    }
}

/// `weight` `[out, in]` += `scaling`·`b`·`a` for `a` `[r, in]`, `b` `[out, r]`.
fn merge_into(
    weight: &mut HostTensor,
    a: &HostTensor,
    b: &HostTensor,
    scaling: f64,
) -> std::result::Result<(), String> {
    let (outputs, inputs) = match weight.dims[..] {
        [o, i] => (o, i),
        _ => return Err(format!("shape {:?} is not a linear layer's", weight.dims)),
    };
    let rank = a.dims.first().copied().unwrap_or(0);
    if a.dims != [rank, inputs] || b.dims != [outputs, rank] {
        return Err(format!(
            "adapters of shapes {:?} and {:?} do not fit a [{outputs}, {inputs}] weight",
            a.dims, b.dims
        ));
    }
    if b.data.iter().all(|&v| v == 0.0) {
        return Ok(()); // new adapters: nothing to add
    }
    for o in 0..outputs {
        let b_row = &b.data[o * rank..(o + 1) * rank];
        for (i, w) in weight.data[o * inputs..(o + 1) * inputs].iter_mut().enumerate() {
            let update: f64 = b_row
                .iter()
                .enumerate()
                .map(|(k, &bk)| f64::from(bk) * f64::from(a.data[k * inputs + i]))
                .sum();
            *w = (f64::from(*w) + scaling * update) as f32;
        }
    }
    Ok(())
}
