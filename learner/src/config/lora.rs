//! `[lora]`: train LoRA adapters instead of the whole model, with PEFT's
//! settings (and TRL's `peft_config` names as aliases). The section's
//! presence turns adapters on; without it the whole model trains.

use grpo_model::lora::{LoraConfig, Targets};
use serde::Deserialize;

use super::Dtype;
use super::values::require;
use crate::error::{Error, Result};

/// Largest adapter rank a config may ask for.
pub const MAX_RANK: usize = 4096;

/// `[lora]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// r, the adapters' rank, 1 to [`MAX_RANK`]. Default 8.
    #[serde(alias = "r")]
    pub rank: usize,
    /// α: the adapters' product is scaled by α/r (α/√r with rsLoRA),
    /// above 0 and at most 1e6. Default 16.
    #[serde(alias = "lora_alpha")]
    pub alpha: f64,
    /// The probability of dropping each value of an adapter's input while
    /// training (PEFT's `lora_dropout`; kept values scaled by 1/(1−p)),
    /// in [0, 1). Each micro-batch of each update draws its own masks
    /// from `seed`; log-probs outside the train step use none. Default 0.
    #[serde(alias = "lora_dropout")]
    pub dropout: f64,
    /// Which linear layers get adapters: "all-linear" (default: every
    /// projection of every layer, not the output head), a list of names
    /// (`["q_proj", "v_proj"]`, matched as PEFT does: the name or its
    /// ending after a dot), or one regular expression over whole names.
    pub target_modules: TargetModules,
    /// rsLoRA's scaling α/√r. Default false.
    pub use_rslora: bool,
    /// The seed of the adapters' initialization (A Kaiming-uniform, B zero)
    /// and of their dropout masks. Default 0.
    pub seed: u64,
    /// The dtype the learner holds the frozen base model in: "f32"
    /// (default) or "bf16" (half its memory; the train step reads it in
    /// the compute dtype, the adapters and their AdamW state stay f32).
    pub base_dtype: Dtype,
    /// Push the policy with the adapters merged in, as whole weights, to
    /// engines and workers, which otherwise take the adapters alone and
    /// apply them beside the base weights they hold. Default false.
    pub merge_on_push: bool,
}

/// `target_modules`: one string ("all-linear" or a pattern) or a list of names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// "all-linear", or a regular expression over whole layer names.
    One(String),
    /// Layer names, matched by suffix.
    List(Vec<String>),
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: TargetModules::One("all-linear".to_string()),
            use_rslora: false,
            seed: 0,
            base_dtype: Dtype::F32,
            merge_on_push: false,
        }
    }
}

impl LoraSection {
    /// Checks the section's values.
    pub(crate) fn validate(&self) -> Result<()> {
        require(
            "lora.rank",
            (1..=MAX_RANK).contains(&self.rank),
            self.rank,
            &format!("1 to {MAX_RANK}"),
        )?;
        require(
            "lora.alpha",
            self.alpha > 0.0 && self.alpha <= 1e6,
            self.alpha,
            "above 0 and at most 1e6",
        )?;
        require(
            "lora.dropout",
            (0.0..1.0).contains(&self.dropout),
            self.dropout,
            "at least 0 and below 1",
        )?;
        if matches!(&self.target_modules, TargetModules::List(names) if names.is_empty()) {
            return Err(Error::Config {
                field: "lora.target_modules",
                message: "an empty list adapts nothing: name layers or use \"all-linear\"".to_string(),
            });
        }
        Ok(())
    }

    /// The adapters' settings.
    pub fn lora(&self) -> LoraConfig {
        LoraConfig {
            rank: self.rank,
            alpha: self.alpha,
            targets: match &self.target_modules {
                TargetModules::One(name) if name == "all-linear" => Targets::AllLinear,
                TargetModules::One(pattern) => Targets::Pattern(pattern.clone()),
                TargetModules::List(names) => Targets::Modules(names.clone()),
            },
            use_rslora: self.use_rslora,
        }
    }
}
