//! The run config of `grpo sft`: its own `[data]`, `[trainer]` and
//! `[logging]`, and `grpo run`'s `[model]`, `[optimizer]` and
//! `[checkpoint]`. Unknown keys are refused naming them.

use std::path::{Path, PathBuf};

use grpo_xla::trace::Parallelism;
use serde::Deserialize;

use super::{
    CheckpointSection, ConfigFile, ModelSection, OptimizerSection, invalid, learner_parallelism, parallelism_kind,
};
use crate::error::Result;
use crate::sft::SftConfig;

/// The whole `grpo sft` run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftRunConfig {
    /// The model to fine-tune (as in `grpo run`).
    pub model: ModelSection,
    /// The prompt/completion pairs.
    pub data: SftDataSection,
    /// AdamW and the learning rate (as in `grpo run`; its default rate
    /// 1e-6 suits RL — SFT usually wants 1e-5 to 1e-4).
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Steps and batches.
    #[serde(default)]
    pub trainer: SftTrainerSection,
    /// Checkpoints (as in `grpo run`).
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Outputs.
    #[serde(default)]
    pub logging: SftLoggingSection,
}

/// `[data]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftDataSection {
    /// A JSONL file of rows, relative to the config file. Required.
    pub path: PathBuf,
    /// The column holding the prompt (text, or chat turns rendered with the
    /// chat template and its generation prompt). Default "prompt".
    #[serde(default = "default_prompt_column")]
    pub prompt_column: String,
    /// The column holding the completion (text, or assistant turns whose
    /// contents are joined). Default "completion".
    #[serde(default = "default_completion_column")]
    pub completion_column: String,
    /// Rows held out for the eval loss. Default 0.
    #[serde(default)]
    pub eval_size: usize,
    /// The seed of the split and of the example order. Default 0.
    #[serde(default)]
    pub seed: u64,
}

fn default_prompt_column() -> String {
    "prompt".to_string()
}

fn default_completion_column() -> String {
    "completion".to_string()
}

/// `[trainer]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftTrainerSection {
    /// Optimizer steps. Default 100.
    pub max_steps: usize,
    /// Sequences per step. Default 8.
    pub batch_size: usize,
    /// Sequences per micro-batch (gradients accumulate over
    /// `ceil(batch_size / micro_batch_size)` of them). Default 8.
    #[serde(alias = "per_device_train_batch_size")]
    pub micro_batch_size: usize,
    /// The eval loss on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    #[serde(alias = "eval_steps")]
    pub eval_every: usize,
    /// Longest prompt + completion in tokens; longer completions are cut
    /// (TRL's `max_length`), capped by the model's positions. Default 1024.
    pub max_length: usize,
    /// How the learner spans devices: "none" (default), "data" or "fsdp"
    /// (as in `grpo run`; [`learner_parallelism`]).
    pub parallelism: String,
    /// Devices of an SPMD learner (0: all the client's). Default 0.
    pub devices: usize,
}

impl SftTrainerSection {
    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        learner_parallelism(&self.parallelism, self.devices, available)
    }
}

impl Default for SftTrainerSection {
    fn default() -> Self {
        SftTrainerSection {
            max_steps: 100,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 10,
            max_length: 1024,
            parallelism: "none".to_string(),
            devices: 0,
        }
    }
}

/// `[logging]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftLoggingSection {
    /// The output folder (metrics.jsonl, final/), relative to the config
    /// file. Default "runs/sft".
    #[serde(alias = "output_dir")]
    pub out: PathBuf,
}

impl Default for SftLoggingSection {
    fn default() -> Self {
        SftLoggingSection {
            out: PathBuf::from("runs/sft"),
        }
    }
}

impl ConfigFile for SftRunConfig {
    fn validate(&self) -> Result<()> {
        self.sft().map(drop)
    }

    fn rebase(&mut self, base: &Path) {
        self.data.path = base.join(&self.data.path);
        self.logging.out = base.join(&self.logging.out);
    }
}

impl SftRunConfig {
    /// The loop's settings, checked.
    pub fn sft(&self) -> Result<SftConfig> {
        let t = &self.trainer;
        if t.batch_size == 0 || t.micro_batch_size == 0 {
            return Err(invalid(
                "trainer.batch_size",
                "batch_size and micro_batch_size must be ≥ 1".to_string(),
            ));
        }
        if t.max_length < 2 {
            return Err(invalid("trainer.max_length", format!("{}: at least 2", t.max_length)));
        }
        parallelism_kind(&t.parallelism)?;
        let config = SftConfig {
            batch_size: t.batch_size,
            micro_batch_rows: t.micro_batch_size.min(t.batch_size),
            max_length: t.max_length,
            schedule: self.optimizer.lr_schedule(t.max_steps)?,
            optimizer: self.optimizer.adamw(),
            max_grad_norm: self.optimizer.max_grad_norm(),
        };
        Ok(config)
    }
}
