//! Random models for tests and experiments (`grpo init-model`): a small
//! config per family and weights drawn as transformers initializes them
//! (normal(0, 0.02) matrices, unit norms, zero biases), from a seed.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};

use crate::config::{Family, ModelConfig};
use crate::error::{Error, Result};
use crate::names::parameters;
use crate::weights::HostTensor;

/// Sizes of a random model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// 2 layers, hidden 64, 4 heads of 16 (2 key/value heads), SwiGLU 128.
    Tiny,
}

impl std::str::FromStr for Preset {
    type Err = Error;

    fn from_str(name: &str) -> Result<Preset> {
        match name {
            "tiny" => Ok(Preset::Tiny),
            other => Err(Error::Config {
                field: "preset".to_string(),
                message: format!("`{other}` is not a preset (tiny is)"),
            }),
        }
    }
}

/// The config of a `preset` model of `family` over a vocabulary of `vocab_size`.
pub fn preset_config(family: Family, preset: Preset, vocab_size: usize, bos: Option<u32>, eos: u32) -> ModelConfig {
    match preset {
        Preset::Tiny => ModelConfig {
            family,
            vocab_size,
            hidden_size: 64,
            intermediate_size: 128,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            rope_theta: if family == Family::Llama { 10_000.0 } else { 1_000_000.0 },
            rope_scaling: None,
            rms_norm_eps: 1e-6,
            max_positions: 2048,
            tie_embeddings: family != Family::Qwen3,
            qkv_bias: family == Family::Qwen2,
            qk_norm: family == Family::Qwen3,
            bos_token_id: bos,
            eos_token_ids: vec![eos],
        },
    }
}

/// Weights for `config` from `seed`: rank-2 tensors normal(0, 0.02), norm
/// weights 1, biases 0.
pub fn random_weights(config: &ModelConfig, seed: u64) -> Result<BTreeMap<String, HostTensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    parameters(config)
        .into_iter()
        .map(|spec| {
            let count: usize = spec.dims.iter().product();
            let data: Vec<f32> = if spec.dims.len() == 2 {
                (0..count).map(|_| 0.02 * standard_normal(&mut rng)).collect()
            } else if spec.name.ends_with(".bias") {
                vec![0.0; count]
            } else {
                vec![1.0; count]
            };
            Ok((spec.name, HostTensor::new(spec.dims, data)?))
        })
        .collect()
}

/// One standard normal draw (Box–Muller).
fn standard_normal(rng: &mut impl Rng) -> f32 {
    let u: f32 = rng.random_range(f32::EPSILON..1.0);
    let v: f32 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}
