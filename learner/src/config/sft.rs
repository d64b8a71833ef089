//! The run config of `grpo sft`: its own `[data]` and `[trainer]`, and
//! `grpo run`'s `[model]`, `[optimizer]`, `[checkpoint]`, `[logging]` (its
//! output folder by default `runs/sft`) and `[lora]`. Unknown keys are refused naming them.

use std::path::{Path, PathBuf};

use grpo_xla::trace::Parallelism;
use serde::Deserialize;

use super::values::{check_epochs, require, run_steps};
use super::{
    ActivationCheckpointing, CheckpointSection, ConfigFile, LoggingSection, LoraSection, MAX_BATCH, MAX_MODEL_LEN,
    ModelSection, OptimizerSection, ParallelismKind, SftOut,
};
use crate::error::Result;

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
    pub logging: LoggingSection<SftOut>,
    /// LoRA adapters (as in `grpo run`; absent: the whole model trains).
    pub lora: Option<LoraSection>,
}

/// `[data]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftDataSection {
    /// The rows, relative to the config file: a JSONL, Parquet or Arrow
    /// file, or a Hugging Face dataset folder ([`crate::dataset`]). Required.
    pub path: PathBuf,
    /// The split of `path` when it is a dataset folder (TRL's
    /// `dataset_train_split`). Default "train".
    #[serde(default = "super::data::default_split", alias = "dataset_train_split")]
    pub split: String,
    /// The column holding the prompt (text, or chat turns rendered with the
    /// chat template and its generation prompt). Default "prompt".
    #[serde(default = "default_prompt_column")]
    pub prompt_column: String,
    /// The column holding the completion: text, or chat turns (after a
    /// chat prompt rendered turn by turn, loss on the assistant's turns
    /// only; after a text prompt their contents joined). Default "completion".
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
    /// Optimizer steps (0: only the evaluation and the final folder); given,
    /// it overrides `num_train_epochs`. Default: from `num_train_epochs`, else 100.
    pub max_steps: Option<usize>,
    /// Passes over the training rows (`batch_size` a step), when
    /// `max_steps` is not given (TRL's key; fractions allowed). Default none.
    pub num_train_epochs: Option<f64>,
    /// Sequences per step, 1 to [`MAX_BATCH`]. Default 8.
    pub batch_size: usize,
    /// Sequences per micro-batch, 1 to [`MAX_BATCH`] (gradients accumulate
    /// over `ceil(batch_size / micro_batch_size)` of them). Default 8.
    #[serde(alias = "per_device_train_batch_size")]
    pub micro_batch_size: usize,
    /// The eval loss on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    #[serde(alias = "eval_steps")]
    pub eval_every: usize,
    /// Longest prompt + completion in tokens; longer completions are cut
    /// (TRL's `max_length`), 2 to [`MAX_MODEL_LEN`], capped by the model's
    /// positions. Default 1024.
    pub max_length: usize,
    /// How the learner spans devices: "none" (default), "data" or "fsdp"
    /// (as in `grpo run`; [`ParallelismKind`]).
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

impl SftTrainerSection {
    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        self.parallelism.layout(self.devices, available)
    }

    /// The run's steps over `rows` training rows.
    pub fn steps(&self, rows: usize) -> usize {
        run_steps(self.max_steps, self.num_train_epochs, rows, self.batch_size)
    }

    /// Checks the section's values.
    fn validate(&self) -> Result<()> {
        check_epochs(self.num_train_epochs)?;
        for (field, value) in [
            ("trainer.batch_size", self.batch_size),
            ("trainer.micro_batch_size", self.micro_batch_size),
        ] {
            require(
                field,
                (1..=MAX_BATCH).contains(&value),
                value,
                &format!("1 to {MAX_BATCH} sequences"),
            )?;
        }
        require(
            "trainer.max_length",
            (2..=MAX_MODEL_LEN).contains(&self.max_length),
            self.max_length,
            &format!("2 to {MAX_MODEL_LEN} tokens"),
        )
    }
}

impl Default for SftTrainerSection {
    fn default() -> Self {
        SftTrainerSection {
            max_steps: None,
            num_train_epochs: None,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 10,
            max_length: 1024,
            parallelism: ParallelismKind::None,
            devices: 0,
            activation_checkpointing: ActivationCheckpointing::None,
            router_aux_loss_coef: None,
        }
    }
}

impl ConfigFile for SftRunConfig {
    fn validate(&self) -> Result<()> {
        self.optimizer.validate()?;
        self.trainer.validate()?;
        self.checkpoint.validate()?;
        self.logging.validate()?;
        self.lora.as_ref().map_or(Ok(()), LoraSection::validate)
    }

    fn rebase(&mut self, base: &Path) {
        self.model.rebase(base);
        self.data.path = base.join(&self.data.path);
        self.logging.rebase(base);
    }
}
