//! Learning-rate schedules (transformers' `get_*_schedule_with_warmup`):
//! a linear warm-up from 0 over `warmup` steps, then
//! - `Constant`: the peak rate;
//! - `Linear`: down to 0 at `total` steps, `(total − s) / (total − warmup)`;
//! - `Cosine`: `½ (1 + cos(π · progress))`, progress from 0 after the
//!   warm-up to 1 at `total`.
//!
//! A run shorter than its warm-up is cut short, as transformers' schedulers
//! are: the rate only ramps for the steps that run ([`Schedule::cut_short`]
//! says so, for a warning). The rate is an input of the train step, so a
//! schedule never recompiles.

/// The shape of the schedule after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decay {
    /// The peak rate until the end. The default.
    #[default]
    Constant,
    /// Linear decay to 0.
    Linear,
    /// Half a cosine down to 0.
    Cosine,
}

/// A learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The peak rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Steps of the run (the decay ends there).
    pub total: usize,
    /// What follows the warm-up.
    pub decay: Decay,
}

impl Schedule {
    /// What is wrong with a run shorter than its warm-up (its rate never
    /// reaches the peak), for a warning; `None` when the schedule fits or
    /// the run trains no step (an evaluation only).
    pub fn cut_short(&self) -> Option<String> {
        (self.total > 0 && self.warmup > self.total).then(|| {
            format!(
                "{} warm-up steps are more than the run's {}: the schedule is cut short, its last step's rate \
                 {:.3e} of the peak {:.3e}",
                self.warmup,
                self.total,
                self.at(self.total - 1),
                self.lr
            )
        })
    }

    /// The rate of (0-based) step `step`.
    pub fn at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * step as f64 / self.warmup.max(1) as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let done = (step - self.warmup) as f64;
        let factor = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => ((span - done) / span).max(0.0),
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * (done / span).min(1.0)).cos()),
        };
        self.lr * factor
    }
}
