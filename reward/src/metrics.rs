//! Per-reward fault counters, shared by the pool's concurrent calls and
//! read by whoever logs them (the learner, `grpo reward`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::Error;

/// Counters of one reward entry.
#[derive(Debug, Default)]
pub struct RewardMetrics {
    calls: AtomicU64,
    samples: AtomicU64,
    timeouts: AtomicU64,
    crashes: AtomicU64,
    bad_outputs: AtomicU64,
    non_finite: AtomicU64,
    errors: AtomicU64,
}

/// A copy of [`RewardMetrics`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Batches scored.
    pub calls: u64,
    /// Samples scored.
    pub samples: u64,
    /// Calls past their timeout.
    pub timeouts: u64,
    /// Calls whose plug-in process could not start or died.
    pub crashes: u64,
    /// Calls answered with garbage or the wrong number of scores.
    pub bad_outputs: u64,
    /// Samples scored NaN or infinite.
    pub non_finite: u64,
    /// Other failed calls (HTTP errors, bad samples).
    pub errors: u64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl RewardMetrics {
    /// Counts a call over `samples` samples.
    pub fn call(&self, samples: usize) {
        bump(&self.calls, 1);
        bump(&self.samples, samples as u64);
    }

    /// Counts a failed call by its kind.
    pub fn fault(&self, error: &Error) {
        bump(
            match error {
                Error::Timeout { .. } => &self.timeouts,
                Error::Crashed(_) => &self.crashes,
                Error::BadOutput(_) => &self.bad_outputs,
                _ => &self.errors,
            },
            1,
        );
    }

    /// Counts a NaN or infinite score.
    pub fn non_finite(&self) {
        bump(&self.non_finite, 1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            calls: get(&self.calls),
            samples: get(&self.samples),
            timeouts: get(&self.timeouts),
            crashes: get(&self.crashes),
            bad_outputs: get(&self.bad_outputs),
            non_finite: get(&self.non_finite),
            errors: get(&self.errors),
        }
    }
}
