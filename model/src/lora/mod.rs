//! LoRA adapters, as PEFT defines them: a linear layer `y = x·Wᵀ` becomes
//! `y = x·Wᵀ + (x·Aᵀ)·Bᵀ · s` with `A` `[r, in]`, `B` `[out, r]` and the
//! scaling `s = α / r` (`α / √r` with rsLoRA). `A` starts Kaiming-uniform
//! (PEFT's `kaiming_uniform_(a = √5)`: uniform in ±1/√in), `B` at zero, so
//! a new adapter leaves the model as it is.
//!
//! Adapter tensors are named after the layer they adapt
//! (`model.layers.0.self_attn.q_proj.lora_A.weight`). This module holds the
//! layout (which layers, what rank and scaling); `peft` reads and writes
//! PEFT folders; `sources` presents adapters as weights: beside a base
//! model, or merged into it.

mod peft;
mod sources;

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::names::{ParamSpec, parameters};
use crate::weights::HostTensor;

pub use peft::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterFolder, PEFT_PREFIX, peft_name};
pub use sources::{Merged, WithAdapters};

/// Which linear layers carry adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Every linear layer of the decoder layers (not the output head), PEFT's `"all-linear"`.
    AllLinear,
    /// The layers named by one of these or ending in `.` and one of them,
    /// PEFT's rule for a list (`q_proj` adapts every layer's query
    /// projection, `model.layers.0.mlp.down_proj` one layer).
    Modules(Vec<String>),
    /// The layers whose whole name matches this regular expression, PEFT's
    /// rule for a single string.
    Pattern(String),
}

impl Targets {
    /// Whether the layer called `name` is a target.
    fn matches(&self, name: &str, pattern: Option<&regex::Regex>) -> bool {
        match self {
            Targets::AllLinear => true,
            Targets::Modules(targets) => targets.iter().any(|t| name_matches(name, t)),
            Targets::Pattern(_) => pattern.is_some_and(|p| p.is_match(name)),
        }
    }
}

/// PEFT's rule for one target of a list: the name itself or its ending after a dot.
fn name_matches(name: &str, target: &str) -> bool {
    name == target || name.strip_suffix(target).is_some_and(|head| head.ends_with('.'))
}

/// A LoRA configuration (PEFT's `LoraConfig`, the fields grpo supports).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// r, the adapters' rank.
    pub rank: usize,
    /// α, the numerator of the scaling.
    pub alpha: f64,
    /// Which layers are adapted.
    pub targets: Targets,
    /// rsLoRA's scaling `α / √r` instead of `α / r`.
    pub use_rslora: bool,
}

/// A linear layer that carries an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptedLayer {
    /// The layer's name, e.g. `model.layers.0.self_attn.q_proj`.
    pub name: String,
    /// Its input features.
    pub inputs: usize,
    /// Its output features.
    pub outputs: usize,
}

impl LoraConfig {
    /// The factor the adapter's product is scaled by.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// The layers of the model of `config` that carry adapters, in
    /// parameter order; refuses a rank of 0 and a target the model lacks.
    pub fn layers(&self, config: &ModelConfig) -> Result<Vec<AdaptedLayer>> {
        let bad = |message: String| Error::Config {
            field: "lora".to_string(),
            message,
        };
        if self.rank == 0 {
            return Err(bad("the rank must be at least 1".to_string()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(bad(format!("alpha must be a positive number, got {}", self.alpha)));
        }
        let linear = linear_layers(config);
        let mut kinds: Vec<String> = Vec::new();
        for layer in &linear {
            let kind = leaf(&layer.name).to_string();
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let choices = || format!("choose among {} or \"all-linear\"", kinds.join(", "));
        let pattern = match &self.targets {
            Targets::Pattern(p) => Some(
                regex::Regex::new(&format!("^(?:{p})$"))
                    .map_err(|e| bad(format!("target_modules `{p}` is not a regular expression: {e}")))?,
            ),
            Targets::Modules(names) if names.is_empty() => {
                return Err(bad(format!("target_modules names no layer: {}", choices())));
            }
            Targets::Modules(names) => {
                if let Some(name) = names.iter().find(|t| !linear.iter().any(|l| name_matches(&l.name, t))) {
                    return Err(bad(format!(
                        "target module `{name}` is not a linear layer of this model: {}",
                        choices()
                    )));
                }
                None
            }
            Targets::AllLinear => None,
        };
        let adapted: Vec<AdaptedLayer> = linear
            .into_iter()
            .filter(|l| self.targets.matches(&l.name, pattern.as_ref()))
            .collect();
        if adapted.is_empty() {
            return Err(bad(format!(
                "target_modules matches no layer of this model: {}",
                choices()
            )));
        }
        Ok(adapted)
    }

    /// Whether `other` makes the same adapters on the model of `config`:
    /// the same layers, rank and scaling, however the targets are written.
    pub fn same_adapters(&self, other: &LoraConfig, config: &ModelConfig) -> bool {
        let layers = |lora: &LoraConfig| lora.layers(config).ok();
        self.rank == other.rank
            && self.scaling() == other.scaling()
            && self.use_rslora == other.use_rslora
            && layers(self) == layers(other)
    }

    /// A short description: rank, α and the kinds of layers adapted on the
    /// model of `config` (`rank 8, alpha 16 on q_proj, v_proj`).
    pub fn describe(&self, config: &ModelConfig) -> String {
        let mut kinds: Vec<String> = self
            .layers(config)
            .unwrap_or_default()
            .iter()
            .map(|l| leaf(&l.name).to_string())
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        let rslora = if self.use_rslora { " (rsLoRA)" } else { "" };
        format!(
            "rank {}, alpha {}{rslora} on {}",
            self.rank,
            self.alpha,
            kinds.join(", ")
        )
    }
}

/// The last part of a layer's name (`q_proj`).
fn leaf(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// Every linear layer of the decoder layers of `config` (the output head
/// and embeddings excluded), in parameter order.
pub fn linear_layers(config: &ModelConfig) -> Vec<AdaptedLayer> {
    parameters(config)
        .into_iter()
        .filter(|p| p.name.starts_with("model.layers.") && p.name.ends_with("_proj.weight") && p.dims.len() == 2)
        .map(|p| AdaptedLayer {
            name: p.name.trim_end_matches(".weight").to_string(),
            inputs: p.dims[1],
            outputs: p.dims[0],
        })
        .collect()
}

/// The adapter tensors of `layers` at `rank`: per layer `lora_A` `[r, in]`
/// then `lora_B` `[out, r]`.
pub fn adapter_parameters(layers: &[AdaptedLayer], rank: usize) -> Vec<ParamSpec> {
    layers
        .iter()
        .flat_map(|l| {
            [
                ParamSpec {
                    name: format!("{}.lora_A.weight", l.name),
                    dims: vec![rank, l.inputs],
                },
                ParamSpec {
                    name: format!("{}.lora_B.weight", l.name),
                    dims: vec![l.outputs, rank],
                },
            ]
        })
        .collect()
}

/// New adapters for `layers` from `seed`, as PEFT initializes them: `A`
/// uniform in ±1/√in, `B` zero.
pub fn new_adapters(layers: &[AdaptedLayer], rank: usize, seed: u64) -> Result<BTreeMap<String, HostTensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    adapter_parameters(layers, rank)
        .into_iter()
        .map(|spec| {
            let count: usize = spec.dims.iter().product();
            let data = if spec.name.ends_with(".lora_A.weight") {
                let bound = 1.0 / (spec.dims[1] as f32).sqrt();
                (0..count).map(|_| rng.random_range(-bound..bound)).collect()
            } else {
                vec![0.0; count]
            };
            Ok((spec.name, HostTensor::new(spec.dims, data)?))
        })
        .collect()
}
