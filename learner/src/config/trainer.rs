//! `[trainer]`, `[checkpoint]` and `[logging]`: steps and batches, the
//! learner's devices, checkpoints and the output folder.

use grpo_xla::trace::Parallelism;
use serde::Deserialize;

use super::values::{check_epochs, require, run_steps};
use super::{DtypeSetting, MAX_BATCH, ParallelismKind};
use crate::error::Result;

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
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 20,
            keep_last: 3,
        }
    }
}
