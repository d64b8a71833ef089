//! `[trainer]`, `[checkpoint]` and `[logging]`: steps and batches, the
//! learner's devices, checkpoints and the output folder.

use grpo_model::weights::{SaveDtype, SaveOptions};
use grpo_xla::trace::Parallelism;
use serde::Deserialize;

use super::values::{check_epochs, require, run_steps};
use super::{ActivationCheckpointing, Dtype, DtypeSetting, MAX_BATCH, ParallelismKind};
use crate::error::{Error, Result};

/// `[trainer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// Steps of the run (0: only the evaluation and the final folder); given,
    /// it overrides `num_train_epochs`. Default: from `num_train_epochs`, else 100.
    pub max_steps: Option<usize>,
    /// Passes over the training prompts (`prompts_per_step` a step), when
    /// `max_steps` is not given (TRL's key; fractions allowed). Default none.
    pub num_train_epochs: Option<f64>,
    /// Samples per micro-batch, 1 to [`MAX_BATCH`]. Default 16.
    #[serde(alias = "per_device_train_batch_size")]
    pub micro_batch_size: usize,
    /// Let a group's samples share one copy of their prompt in a row of the
    /// train step when that costs fewer FLOPs (see [`crate::batch`]).
    /// Default true.
    pub share_prompts: bool,
    /// The train step's forward/backward dtype: "auto" (default: the
    /// faster on this machine, measured), "f32" or "bf16" (mixed
    /// precision: f32 master weights and AdamW state).
    pub compute_dtype: DtypeSetting,
    /// Greedy eval on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    #[serde(alias = "eval_steps")]
    pub eval_every: usize,
    /// How the learner spans devices: "none" (one device; default), "data"
    /// or "fsdp" ([`ParallelismKind`]).
    pub parallelism: ParallelismKind,
    /// Devices of an SPMD learner (0: all the client's). Default 0.
    pub devices: usize,
    /// What a train step keeps for its backward pass: "none" (every
    /// intermediate; default) or "layer" (each decoder layer's input, the
    /// layer computed again; TRL's `gradient_checkpointing = true` too).
    #[serde(alias = "gradient_checkpointing")]
    pub activation_checkpointing: ActivationCheckpointing,
    /// The load-balancing loss's coefficient for a mixture-of-experts
    /// model (transformers' `router_aux_loss_coef`; 0 turns the loss off).
    /// Default: the model's `router_aux_loss_coef` when its config sets
    /// `output_router_logits`, else no loss. Refused for a model without
    /// sparse layers.
    pub router_aux_loss_coef: Option<f64>,
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection {
            max_steps: None,
            num_train_epochs: None,
            micro_batch_size: 16,
            share_prompts: true,
            compute_dtype: DtypeSetting::Auto,
            eval_every: 10,
            parallelism: ParallelismKind::None,
            devices: 0,
            activation_checkpointing: ActivationCheckpointing::None,
            router_aux_loss_coef: None,
        }
    }
}

impl TrainerSection {
    /// Checks the section's values.
    pub(crate) fn validate(&self) -> Result<()> {
        check_epochs(self.num_train_epochs)?;
        require(
            "trainer.micro_batch_size",
            (1..=MAX_BATCH).contains(&self.micro_batch_size),
            self.micro_batch_size,
            &format!("1 to {MAX_BATCH} samples"),
        )
    }

    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        self.parallelism.layout(self.devices, available)
    }

    /// The run's steps over `rows` training prompts, `prompts_per_step` a step.
    pub fn steps(&self, rows: usize, prompts_per_step: usize) -> usize {
        run_steps(self.max_steps, self.num_train_epochs, rows, prompts_per_step)
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Write `OUT/checkpoint-<step>/` every this many steps and after the
    /// last (0: only the final policy). Default 20.
    #[serde(alias = "save_steps")]
    pub every: usize,
    /// Keep the newest this many checkpoints, deleting older ones (0: all). Default 3.
    #[serde(alias = "save_total_limit")]
    pub keep_last: usize,
    /// The dtype of the final folder's weights: "f32" or "bf16" (half the
    /// bytes). Checkpoints stay f32, so that a resumed run is exact. Default "f32".
    pub save_dtype: Dtype,
    /// Largest weights file of a saved model (transformers'
    /// `max_shard_size`): bytes, or a size such as "5GB", "500MB", "2GiB";
    /// above it the weights are sharded with an index. Default "5GB".
    max_shard_size: toml::Value,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 20,
            keep_last: 3,
            save_dtype: Dtype::F32,
            max_shard_size: toml::Value::String("5GB".to_string()),
        }
    }
}

impl CheckpointSection {
    /// How the final folder is written (checkpoints: the same, in f32).
    pub fn save_options(&self) -> Result<SaveOptions> {
        Ok(SaveOptions {
            dtype: match self.save_dtype {
                Dtype::F32 => SaveDtype::F32,
                Dtype::Bf16 => SaveDtype::Bf16,
            },
            max_shard_bytes: shard_bytes(&self.max_shard_size)?,
        })
    }

    /// Checks the section's values.
    pub(crate) fn validate(&self) -> Result<()> {
        self.save_options().map(drop)
    }
}

/// `max_shard_size` in bytes, as transformers reads it: a number of bytes,
/// or a number with a decimal (`KB`, `MB`, `GB`, `TB`) or binary (`KiB`,
/// `MiB`, `GiB`, `TiB`) unit.
fn shard_bytes(size: &toml::Value) -> Result<u64> {
    let bad = || Error::Config {
        field: "checkpoint.max_shard_size",
        message: format!("{size}: give bytes (at least 1), or a size such as \"5GB\", \"500MB\" or \"2GiB\""),
    };
    let bytes = match size {
        toml::Value::Integer(bytes) if *bytes > 0 => *bytes as f64,
        toml::Value::String(text) => {
            let text = text.trim();
            let split = text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len());
            let (number, unit) = text.split_at(split);
            let number: f64 = number.trim().parse().map_err(|_| bad())?;
            let scale = match unit.to_ascii_uppercase().as_str() {
                "" | "B" => 1.0,
                "KB" => 1e3,
                "MB" => 1e6,
                "GB" => 1e9,
                "TB" => 1e12,
                "KIB" => 1024.0,
                "MIB" => 1024.0 * 1024.0,
                "GIB" => 1024.0 * 1024.0 * 1024.0,
                "TIB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
                _ => return Err(bad()),
            };
            number * scale
        }
        _ => return Err(bad()),
    };
    match (1.0..=1e18).contains(&bytes) {
        true => Ok(bytes as u64),
        false => Err(bad()),
    }
}
