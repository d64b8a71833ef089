//! Group-relative advantages (TRL's `GRPOTrainer` formulas).
//!
//! The rewards of one step come as consecutive groups of `G` samples of
//! the same prompt. With `r` a sample's reward and `μ_g`, `σ_g` its group's
//! mean and (unbiased, `N − 1`) standard deviation:
//!
//! - `ScaleRewards::Group`: `A = (r − μ_g) / (σ_g + 1e-4)`;
//! - `ScaleRewards::Batch`: `A = (r − μ_g) / (σ + 1e-4)`, `σ` the std of
//!   every reward of the step;
//! - `ScaleRewards::None`: `A = r − μ_g` (Dr. GRPO).
//!
//! A sample whose reward is `None` (the reward skipped it) takes no part
//! in its group's statistics and gets advantage 0 and `valid = false`, so
//! the loss leaves it out. Dynamic sampling (DAPO) drops whole groups
//! whose rewards are all equal: they carry no signal.

use crate::error::{Error, Result};

/// The std added below every division, as TRL does.
const STD_EPSILON: f64 = 1e-4;

/// What advantages are divided by (TRL's `scale_rewards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// The group's std (the original GRPO). The default.
    #[default]
    Group,
    /// The std of the whole step's rewards.
    Batch,
    /// Nothing (Dr. GRPO).
    None,
}

/// The advantages of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// One per sample, in input order (0 for skipped samples).
    pub values: Vec<f32>,
    /// Whether the sample takes part in the loss (its reward was not `None`).
    pub valid: Vec<bool>,
    /// Per group: whether all its valid rewards are equal (TRL's
    /// `frac_reward_zero_std` is the mean of this).
    pub zero_std: Vec<bool>,
}

impl Advantages {
    /// The fraction of groups whose rewards are all equal.
    pub fn frac_zero_std(&self) -> f64 {
        if self.zero_std.is_empty() {
            return 0.0;
        }
        self.zero_std.iter().filter(|&&z| z).count() as f64 / self.zero_std.len() as f64
    }

    /// The groups to keep under dynamic sampling: those whose rewards vary.
    pub fn informative_groups(&self) -> Vec<usize> {
        (0..self.zero_std.len()).filter(|&g| !self.zero_std[g]).collect()
    }
}

/// Mean and unbiased std of `values` (std 0 below two values).
fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The advantages of `rewards`, consecutive groups of `group_size`.
pub fn advantages(rewards: &[Option<f32>], group_size: usize, scale: ScaleRewards) -> Result<Advantages> {
    if group_size < 2 {
        return Err(Error::Config {
            field: "group_size",
            message: format!("{group_size}: GRPO needs at least 2 samples per prompt"),
        });
    }
    if !rewards.len().is_multiple_of(group_size) {
        return Err(Error::Groups {
            message: format!("{} rewards do not split into groups of {group_size}", rewards.len()),
        });
    }
    if let Some(bad) = rewards.iter().flatten().find(|r| !r.is_finite()) {
        return Err(Error::Groups {
            message: format!("a reward is {bad}; rewards must be finite (or None to skip a sample)"),
        });
    }
    let valid_values = |group: &[Option<f32>]| -> Vec<f64> { group.iter().flatten().map(|&r| f64::from(r)).collect() };
    let (_, batch_std) = mean_std(&valid_values(rewards));
    let mut values = Vec::with_capacity(rewards.len());
    let mut zero_std = Vec::with_capacity(rewards.len() / group_size);
    for group in rewards.chunks(group_size) {
        let present = valid_values(group);
        let (mean, std) = mean_std(&present);
        zero_std.push(present.windows(2).all(|w| w[0] == w[1]));
        let divisor = match scale {
            ScaleRewards::Group => std + STD_EPSILON,
            ScaleRewards::Batch => batch_std + STD_EPSILON,
            ScaleRewards::None => 1.0,
        };
        values.extend(
            group
                .iter()
                .map(|r| r.map_or(0.0, |r| ((f64::from(r) - mean) / divisor) as f32)),
        );
    }
    Ok(Advantages {
        values,
        valid: rewards.iter().map(Option::is_some).collect(),
        zero_std,
    })
}
