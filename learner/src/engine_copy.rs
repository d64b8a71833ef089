//! The in-process engine's weights made where the learner keeps its own:
//! one compiled program copies every f32 parameter (converting it for a
//! bf16 engine) and tells, per parameter, whether all its values are
//! finite — so a weight sync on a device the engine shares never goes
//! through the host. It reads the f32 parameters once and writes the
//! engine's copies once; the copies are new buffers, which the next train
//! step (donating the learner's parameters) cannot touch.
//!
//! A decoder with LoRA adapters copies into a plain model: each adapted
//! layer's weight leaves as `W + s·B·A`, computed in f32 before the
//! conversion, so engines run the policy without knowing of adapters.

use grpo_model::decoder::Decoder;
use grpo_xla::trace::{Graph, Tensor};
use grpo_xla::{Buffer, Client, ElementType, Executable};

use crate::error::{Error, Result};

/// The compiled copy for one decoder and engine dtype.
pub struct EngineCopy {
    dtype: ElementType,
    names: Vec<String>,
    program: Executable,
}

impl EngineCopy {
    /// Compiles the copy of `decoder`'s parameters (in `inputs`' dtypes,
    /// the decoder's order; adapters merged in) into `dtype` (f32 or bf16).
    pub fn compile(
        client: &Client,
        decoder: &Decoder,
        inputs: &[ElementType],
        dtype: ElementType,
    ) -> Result<EngineCopy> {
        let graph = Graph::new("engine_weights");
        let params = decoder
            .parameters()
            .iter()
            .zip(inputs)
            .map(|(spec, &input)| graph.parameter(input, &spec.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
            .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
        let specs = decoder.base_parameters();
        let merged = specs
            .iter()
            .zip(&params)
            .map(|(spec, p)| merged(decoder, &params, &spec.name, p))
            .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
        let mut outputs = merged
            .iter()
            .map(|p| p.convert(dtype))
            .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
        // x · 0 is 0 for finite x and NaN for ±inf and NaN, so each sum is 0
        // exactly when the parameter is finite.
        let checks = merged
            .iter()
            .map(|p| p.mul_scalar(0.0)?.sum_all()?.reshape(&[1]))
            .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
        outputs.push(Tensor::concatenate(&checks.iter().collect::<Vec<_>>(), 0)?);
        let program = graph.build(&outputs.iter().collect::<Vec<_>>())?.compile(client)?;
        Ok(EngineCopy {
            dtype,
            names: specs.iter().map(|s| s.name.clone()).collect(),
            program,
        })
    }

    /// The engine dtype it copies into.
    pub fn dtype(&self) -> ElementType {
        self.dtype
    }

    /// Copies of `params` (the decoder's order, f32, on one device) in the
    /// engine's dtype on the same device, one per base parameter; refuses
    /// weights with a non-finite value, naming the parameter.
    pub fn run(&self, params: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut outputs = self.program.execute(params)?;
        let checks = outputs.pop().expect("the program's last output is the check");
        let sums: Vec<f32> = checks.to_host()?;
        if let Some(bad) = sums.iter().position(|&s| s != 0.0) {
            return Err(Error::Fleet {
                message: format!(
                    "the learner's `{}` holds a non-finite value: the weights were not synced",
                    self.names[bad]
                ),
            });
        }
        Ok(outputs)
    }
}

/// Base parameter `name` (`weight`) in f32, with its layer's adapter
/// merged in when `decoder` adapts that layer: `W + s·B·A`.
fn merged(decoder: &Decoder, params: &[Tensor], name: &str, weight: &Tensor) -> grpo_xla::Result<Tensor> {
    let weight = match weight.dtype() {
        ElementType::F32 => weight.clone(),
        _ => weight.convert(ElementType::F32)?,
    };
    let (Some(lora), Some(layer)) = (decoder.lora(), name.strip_suffix(".weight")) else {
        return Ok(weight);
    };
    let find = |suffix: &str| {
        let wanted = format!("{layer}.{suffix}");
        decoder
            .parameters()
            .iter()
            .position(|p| p.name == wanted)
            .map(|i| &params[i])
    };
    match (find("lora_A.weight"), find("lora_B.weight")) {
        (Some(a), Some(b)) => {
            let product = b.dot_general(a, &[], &[], &[1], &[0])?;
            weight.add(&product.mul_scalar(lora.scaling())?)
        }
        _ => Ok(weight),
    }
}
