//! `[optimizer]`: AdamW and the learning-rate schedule.

use grpo_xla::trace::AdamW;
use serde::Deserialize;

use super::values::require;
use crate::error::Result;
use crate::schedule::{Decay, Schedule};

/// `[optimizer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSection {
    /// Peak learning rate, above 0 and at most 1. Default 1e-6.
    #[serde(alias = "learning_rate")]
    pub lr: f64,
    /// AdamW weight decay, 0 to 10. Default 0.0.
    pub weight_decay: f64,
    /// Warm-up steps (a run shorter than them has its schedule cut short,
    /// with a warning). Default 0.
    pub warmup_steps: usize,
    /// "constant" (default), "linear" or "cosine".
    #[serde(alias = "lr_scheduler_type")]
    pub schedule: Decay,
    /// Global gradient-norm clipping, 0 (off) to 1e6. Default 1.0.
    pub max_grad_norm: f64,
}

impl OptimizerSection {
    /// Checks the section's values.
    pub(crate) fn validate(&self) -> Result<()> {
        require(
            "optimizer.lr",
            self.lr > 0.0 && self.lr <= 1.0,
            self.lr,
            "above 0 and at most 1",
        )?;
        require(
            "optimizer.weight_decay",
            (0.0..=10.0).contains(&self.weight_decay),
            self.weight_decay,
            "0 to 10",
        )?;
        require(
            "optimizer.max_grad_norm",
            (0.0..=1e6).contains(&self.max_grad_norm),
            self.max_grad_norm,
            "0 (no clipping) to 1e6",
        )
    }

    /// The learning-rate schedule over a run of `max_steps` steps.
    pub fn schedule(&self, max_steps: usize) -> Schedule {
        Schedule {
            lr: self.lr,
            warmup: self.warmup_steps,
            total: max_steps,
            decay: self.schedule,
        }
    }

    /// AdamW with this weight decay (PyTorch's other defaults).
    pub fn adamw(&self) -> AdamW {
        AdamW {
            weight_decay: self.weight_decay,
            ..AdamW::default()
        }
    }

    /// The clipping threshold (`None` for 0).
    pub fn max_grad_norm(&self) -> Option<f64> {
        (self.max_grad_norm > 0.0).then_some(self.max_grad_norm)
    }
}

impl Default for OptimizerSection {
    fn default() -> Self {
        OptimizerSection {
            lr: 1e-6,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: Decay::Constant,
            max_grad_norm: 1.0,
        }
    }
}
