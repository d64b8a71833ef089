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
    /// AdamW's β₁, in [0, 1). Default 0.9.
    #[serde(alias = "adam_beta1")]
    pub beta1: f64,
    /// AdamW's β₂, in [0, 1). Default 0.999.
    #[serde(alias = "adam_beta2")]
    pub beta2: f64,
    /// AdamW's ε, above 0 and at most 1. Default 1e-8.
    #[serde(alias = "adam_epsilon")]
    pub eps: f64,
    /// Warm-up steps (a run shorter than them has its schedule cut short,
    /// with a warning). Default 0.
    pub warmup_steps: usize,
    /// Warm-up as a fraction of `max_steps`, in [0, 1], rounded up to
    /// whole steps (transformers' rule); instead of `warmup_steps`, not
    /// beside it. Default 0.
    pub warmup_ratio: f64,
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
        for (key, value) in [("optimizer.beta1", self.beta1), ("optimizer.beta2", self.beta2)] {
            require(
                key,
                (0.0..1.0).contains(&value),
                value,
                "in [0, 1) (TRL: adam_beta1, adam_beta2)",
            )?;
        }
        require(
            "optimizer.eps",
            self.eps > 0.0 && self.eps <= 1.0,
            self.eps,
            "above 0 and at most 1 (TRL: adam_epsilon)",
        )?;
        require(
            "optimizer.warmup_ratio",
            (0.0..=1.0).contains(&self.warmup_ratio),
            self.warmup_ratio,
            "a fraction of max_steps, 0 to 1",
        )?;
        require(
            "optimizer.warmup_ratio",
            self.warmup_ratio == 0.0 || self.warmup_steps == 0,
            self.warmup_ratio,
            "either warmup_ratio or warmup_steps, not both: set the other to 0",
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
        let warmup = if self.warmup_ratio > 0.0 {
            (self.warmup_ratio * max_steps as f64).ceil() as usize
        } else {
            self.warmup_steps
        };
        Schedule {
            lr: self.lr,
            warmup,
            total: max_steps,
            decay: self.schedule,
        }
    }

    /// AdamW with these settings.
    pub fn adamw(&self) -> AdamW {
        AdamW {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
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
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            warmup_steps: 0,
            warmup_ratio: 0.0,
            schedule: Decay::Constant,
            max_grad_norm: 1.0,
        }
    }
}
