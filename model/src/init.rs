//! Random models for tests and experiments (`grpo init-model`): a small
//! config per family and weights drawn as transformers initializes them
//! (normal(0, 0.02) matrices, unit norms, zero biases), from a seed.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};

use crate::config::{Experts, Family, GemmaStyle, ModelConfig};
use crate::error::{Error, Result};
use crate::names::parameters;
use crate::weights::HostTensor;

/// Sizes of a random model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// 2 layers, hidden 64, 4 heads of 16 (2 key/value heads), SwiGLU 128.
    Tiny,
    /// SmolLM2-135M's shape: 30 layers, hidden 576, 9 heads of 64 (3
    /// key/value heads), SwiGLU 1536 — for speed measurements where the
    /// pretrained weights cannot travel.
    Smollm2_135m,
    /// Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 heads of 64 (8
    /// key/value heads), SwiGLU 8192.
    Llama1b,
}

/// Every preset with its name.
const PRESETS: [(&str, Preset); 3] = [
    ("tiny", Preset::Tiny),
    ("smollm2-135m", Preset::Smollm2_135m),
    ("llama-1b", Preset::Llama1b),
];

impl std::str::FromStr for Preset {
    type Err = Error;

    fn from_str(name: &str) -> Result<Preset> {
        PRESETS
            .iter()
            .find(|(known, _)| *known == name)
            .map(|&(_, preset)| preset)
            .ok_or_else(|| Error::Config {
                field: "preset".to_string(),
                message: format!(
                    "`{name}` is not a preset: choose one of {}",
                    PRESETS.map(|(known, _)| known).join(", ")
                ),
            })
    }
}

/// The sizes a preset fixes.
struct Shape {
    hidden_size: usize,
    intermediate_size: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    max_positions: usize,
}

impl Preset {
    fn shape(self) -> Shape {
        match self {
            Preset::Tiny => Shape {
                hidden_size: 64,
                intermediate_size: 128,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                max_positions: 2048,
            },
            Preset::Smollm2_135m => Shape {
                hidden_size: 576,
                intermediate_size: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                max_positions: 8192,
            },
            Preset::Llama1b => Shape {
                hidden_size: 2048,
                intermediate_size: 8192,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                head_dim: 64,
                max_positions: 8192,
            },
        }
    }
}

/// The config of a `preset` model of `family` over a vocabulary of `vocab_size`.
pub fn preset_config(family: Family, preset: Preset, vocab_size: usize, bos: Option<u32>, eos: u32) -> ModelConfig {
    let shape = preset.shape();
    let gemma2 = family == Family::Gemma2;
    let gemma = family.is_gemma().then_some(GemmaStyle {
        query_pre_attn_scalar: shape.head_dim as f64,
        local_rope_theta: if gemma2 { 1_000_000.0 } else { 10_000.0 },
        // Gemma 2's caps.
        attention_softcap: gemma2.then_some(50.0),
        final_softcap: gemma2.then_some(30.0),
    });
    // Gemma 2 slides every other layer, Gemma 3 five of every six.
    let pattern = if gemma2 { 2 } else { 6 };
    ModelConfig {
        family,
        vocab_size,
        hidden_size: shape.hidden_size,
        intermediate_size: shape.intermediate_size,
        layers: shape.layers,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        rope_theta: if family == Family::Llama { 10_000.0 } else { 1_000_000.0 },
        rope_scaling: None,
        rms_norm_eps: 1e-6,
        max_positions: shape.max_positions,
        // Gemma's layout: a 512-token window, every `pattern`-th layer global.
        sliding_window: gemma.map(|_| 512),
        sliding_layers: (0..shape.layers)
            .map(|i| gemma.is_some() && (i + 1) % pattern != 0)
            .collect(),
        gemma,
        // Qwen3-MoE: 8 experts a quarter as wide as the dense MLP, 2 per token, in every layer.
        experts: (family == Family::Qwen3Moe).then(|| Experts {
            count: 8,
            top_k: 2,
            intermediate_size: shape.intermediate_size / 4,
            normalize_top_k: true,
            sparse_layers: vec![true; shape.layers],
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
        }),
        fused_projections: family == Family::Phi3,
        tie_embeddings: matches!(family, Family::Llama | Family::Qwen2) || family.is_gemma(),
        qkv_bias: family == Family::Qwen2,
        qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3),
        bos_token_id: bos,
        eos_token_ids: vec![eos],
    }
}

/// Weights for `config` from `seed`: matrices (and stacked experts' matrices) normal(0, 0.02), norm
/// weights 1 (0 where they are offsets from 1, Gemma's), biases 0.
pub fn random_weights(config: &ModelConfig, seed: u64) -> Result<BTreeMap<String, HostTensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    parameters(config)
        .into_iter()
        .map(|spec| {
            let count: usize = spec.dims.iter().product();
            let data: Vec<f32> = if spec.dims.len() >= 2 {
                (0..count).map(|_| 0.02 * standard_normal(&mut rng)).collect()
            } else if spec.name.ends_with(".bias") || config.gemma.is_some() {
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
