//! The run config of `grpo run`: one TOML file whose sections compose the
//! components' settings. Every field has a documented default; unknown keys
//! are refused naming them, and invalid values are refused before any work
//! starts. The `[[reward]]` and `[reward_pool]` tables belong to
//! grpo-reward and are read there, the `[environment]` table to grpo-env. `grpo sft`'s config ([`sft`]) shares
//! the `[model]`, `[optimizer]`, `[checkpoint]` and `[lora]` sections.

mod algorithm;
mod data;
mod file;
mod logging;
mod lora;
mod optimizer;
mod rollout;
pub mod sft;
mod trainer;
mod values;

use std::path::Path;

use serde::Deserialize;

use crate::error::Result;

pub use algorithm::AlgorithmSection;
pub use data::{DataSection, ModelSection};
pub use file::{ConfigFile, with_overrides};
pub use logging::{DefaultOut, GrpoOut, LoggingSection, SftOut, Tracker};
pub use lora::{LoraSection, TargetModules};
pub use optimizer::OptimizerSection;
pub use rollout::RolloutSection;
pub use trainer::{CheckpointSection, TrainerSection};
pub use values::{ActivationCheckpointing, Dtype, DtypeSetting, ImportanceMode, ParallelismKind, Seconds};

/// The whole run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The policy.
    pub model: ModelSection,
    /// The prompts.
    pub data: DataSection,
    /// Generation.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// The GRPO objective.
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// AdamW and the learning rate.
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Steps and batches.
    #[serde(default)]
    pub trainer: TrainerSection,
    /// Checkpoints.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Outputs.
    #[serde(default)]
    pub logging: LoggingSection,
    /// LoRA adapters (absent: the whole model trains).
    pub lora: Option<LoraSection>,
}

/// Most samples per prompt.
pub const MAX_GROUP_SIZE: usize = 1024;
/// Most prompts per step, samples per micro-batch or sequences per SFT step.
pub const MAX_BATCH: usize = 65536;
/// Longest prompt + completion a config may ask for, in tokens (the
/// model's positions cap it further).
pub const MAX_MODEL_LEN: usize = 1 << 20;
/// Most in-process engines, versions of staleness or passes per batch.
pub const MAX_COUNT: usize = 1024;

impl ConfigFile for RunConfig {
    const FOREIGN_TABLES: &[&str] = &["reward", "reward_pool", "environment"];

    fn validate(&self) -> Result<()> {
        self.rollout.validate()?;
        self.algorithm.validate()?;
        self.optimizer.validate()?;
        self.trainer.validate()?;
        self.checkpoint.validate()?;
        self.logging.validate()?;
        self.lora.as_ref().map_or(Ok(()), LoraSection::validate)
    }

    fn rebase(&mut self, base: &Path) {
        self.model.rebase(base);
        self.data.path = base.join(&self.data.path);
        if let Some(path) = &self.data.eval_path {
            self.data.eval_path = Some(base.join(path));
        }
        let rollout = &mut self.rollout;
        for file in [
            &mut rollout.worker_token_file,
            &mut rollout.tls_ca,
            &mut rollout.tls_cert,
            &mut rollout.tls_key,
        ]
        .into_iter()
        .flatten()
        {
            *file = base.join(&*file);
        }
        self.logging.rebase(base);
    }
}
