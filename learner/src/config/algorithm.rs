//! `[algorithm]`: the GRPO objective.

use serde::Deserialize;

use super::values::require;
use super::{ImportanceMode, MAX_COUNT};
use crate::advantage::ScaleRewards;
use crate::error::Result;
use crate::loss::{GrpoLoss, Importance, LossType};

/// `[algorithm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    /// "dapo" (token mean; default), "grpo" (sequence mean), "dr_grpo".
    pub loss_type: LossType,
    /// Lower clip range ε, in (0, 1). Default 0.2.
    pub epsilon: f32,
    /// Upper clip range, above 0 and at most 10; default = epsilon.
    pub epsilon_high: Option<f32>,
    /// Weight of the k3 KL to the frozen starting policy, 0 to 100 (0:
    /// none, and no reference is held). Default 0.
    pub beta: f32,
    /// "group" (default), "batch" or "none".
    pub scale_rewards: ScaleRewards,
    /// "token" (truncated IS; default), "sequence" (masking) or "none".
    pub importance: ImportanceMode,
    /// The IS cap, above 1 and at most 1e6. Default 2.0.
    pub importance_cap: f32,
    /// Drop groups whose rewards are all equal before the update (DAPO's
    /// dynamic sampling, without re-sampling). Default false.
    pub dynamic_sampling: bool,
    /// Train on no token of a completion cut by `max_completion_tokens`
    /// (an episode's last turn cut by its budget), as TRL's
    /// `mask_truncated_completions`; its group's advantages still count
    /// it. Default false.
    pub mask_truncated_completions: bool,
    /// Optimizer steps per generated batch, μ (TRL's name), 1 to
    /// [`MAX_COUNT`]. Default 1.
    pub num_iterations: usize,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        AlgorithmSection {
            loss_type: LossType::Dapo,
            epsilon: 0.2,
            epsilon_high: None,
            beta: 0.0,
            scale_rewards: ScaleRewards::Group,
            importance: ImportanceMode::Token,
            importance_cap: 2.0,
            dynamic_sampling: false,
            mask_truncated_completions: false,
            num_iterations: 1,
        }
    }
}

impl AlgorithmSection {
    /// Checks the section's values.
    pub(crate) fn validate(&self) -> Result<()> {
        require(
            "algorithm.epsilon",
            self.epsilon > 0.0 && self.epsilon < 1.0,
            self.epsilon,
            "in (0, 1)",
        )?;
        if let Some(high) = self.epsilon_high {
            require(
                "algorithm.epsilon_high",
                high > 0.0 && high <= 10.0,
                high,
                "above 0 and at most 10",
            )?;
        }
        require(
            "algorithm.beta",
            (0.0..=100.0).contains(&self.beta),
            self.beta,
            "0 to 100",
        )?;
        require(
            "algorithm.importance_cap",
            self.importance_cap > 1.0 && self.importance_cap <= 1e6,
            self.importance_cap,
            "above 1 and at most 1e6",
        )?;
        require(
            "algorithm.num_iterations",
            (1..=MAX_COUNT).contains(&self.num_iterations),
            self.num_iterations,
            &format!("1 to {MAX_COUNT} optimizer steps per batch"),
        )
    }

    /// The loss, scoring at sampling temperature `temperature`.
    pub fn loss(&self, temperature: f32) -> GrpoLoss {
        let cap = self.importance_cap;
        GrpoLoss {
            loss_type: self.loss_type,
            epsilon: self.epsilon,
            epsilon_high: self.epsilon_high.unwrap_or(self.epsilon),
            beta: self.beta,
            importance: match self.importance {
                ImportanceMode::None => Importance::Off,
                ImportanceMode::Token => Importance::Token { cap },
                ImportanceMode::Sequence => Importance::Sequence { cap },
            },
            temperature,
        }
    }
}
