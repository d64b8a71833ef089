//! Composition and fault policy: every entry scores each batch under its
//! timeout, faults become the entry's `on_error` (a score, a skip, or an
//! error naming the reward and sample), and the total is the weighted sum
//! of the entries that scored. A semaphore bounds how many batches score at
//! once, so scoring overlaps generation without unbounded work.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::config::OnError;
use crate::metrics::{MetricsSnapshot, RewardMetrics};
use crate::{Error, Result, Reward, Sample, Score};

/// One sample's combined reward.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Total {
    /// The weighted sum over the entries that scored; `None` when none did.
    pub reward: Option<f32>,
    /// Each scoring entry's unweighted score by name, and its sub-scores as `name/sub`.
    pub components: BTreeMap<String, f32>,
}

/// One configured reward: the function and its composition and fault settings.
pub struct Entry {
    /// The entry's name (its `name` key, else its type).
    pub name: String,
    /// Its weight in the total.
    pub weight: f32,
    /// The limit on one batch call.
    pub timeout: Duration,
    /// What a fault becomes.
    pub on_error: OnError,
    /// The reward function.
    pub reward: Arc<dyn Reward>,
    /// Its fault counters.
    pub metrics: RewardMetrics,
}

impl Entry {
    /// What a fault on `samples` becomes under `on_error`, logged with the sample ids.
    fn fault(&self, samples: &[Sample], cause: Error) -> Result<Vec<Score>> {
        let ids: Vec<u64> = samples.iter().map(|s| s.id).collect();
        tracing::warn!(reward = %self.name, samples = ?ids, "reward fault: {cause}");
        match self.on_error {
            OnError::Score(value) => Ok(vec![Score::new(value); samples.len()]),
            OnError::Skip => Ok(vec![Score::default(); samples.len()]),
            OnError::Fail => Err(Error::Failed {
                reward: self.name.clone(),
                sample: ids.first().copied().unwrap_or_default(),
                cause: Box::new(cause),
            }),
        }
    }

    /// Scores a batch with faults resolved.
    async fn run(&self, batch: &[Sample]) -> Result<Vec<Score>> {
        self.metrics.call(batch.len());
        let outcome = match self.reward.score_within(batch, self.timeout).await {
            Ok(scores) if scores.len() != batch.len() => Err(Error::BadOutput(format!(
                "{} scores for {} samples",
                scores.len(),
                batch.len()
            ))),
            result => result,
        };
        match outcome {
            Ok(scores) => scores
                .into_iter()
                .zip(batch)
                .map(|(score, sample)| match score.value {
                    Some(value) if !value.is_finite() => {
                        self.metrics.non_finite();
                        let cause = Error::BadOutput(format!("score {value}"));
                        self.fault(std::slice::from_ref(sample), cause)
                            .map(|mut one| one.remove(0))
                    }
                    _ => Ok(score),
                })
                .collect(),
            Err(cause) => {
                self.metrics.fault(&cause);
                self.fault(batch, cause)
            }
        }
    }
}

/// The configured rewards behind a bounded pool; cheap to clone and share.
#[derive(Clone)]
pub struct RewardPool {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Vec<Entry>,
    permits: Semaphore,
}

impl RewardPool {
    /// A pool scoring at most `concurrency` batches at once (at least 1).
    pub fn new(entries: Vec<Entry>, concurrency: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                entries,
                permits: Semaphore::new(concurrency.max(1)),
            }),
        }
    }

    /// Scores a batch with every entry concurrently; errors only where an entry's `on_error` is "fail".
    pub async fn score(&self, batch: &[Sample]) -> Result<Vec<Total>> {
        let _permit = self
            .inner
            .permits
            .acquire()
            .await
            .expect("the pool never closes its semaphore");
        let per_entry = futures::future::try_join_all(self.inner.entries.iter().map(|e| e.run(batch))).await?;
        let mut totals = vec![Total::default(); batch.len()];
        for (entry, scores) in self.inner.entries.iter().zip(per_entry) {
            for (total, score) in totals.iter_mut().zip(scores) {
                let Some(value) = score.value else { continue };
                *total.reward.get_or_insert(0.0) += entry.weight * value;
                total.components.insert(entry.name.clone(), value);
                for (sub, v) in score.components {
                    total.components.insert(format!("{}/{sub}", entry.name), v);
                }
            }
        }
        Ok(totals)
    }

    /// Scores a batch on the runtime in the background (the learner overlaps this with generation).
    pub fn spawn(&self, batch: Vec<Sample>) -> JoinHandle<Result<Vec<Total>>> {
        let pool = self.clone();
        tokio::spawn(async move { pool.score(&batch).await })
    }

    /// The entries' names, in configuration order.
    pub fn names(&self) -> Vec<String> {
        self.inner.entries.iter().map(|e| e.name.clone()).collect()
    }

    /// Each entry's name and fault counters.
    pub fn metrics(&self) -> Vec<(String, MetricsSnapshot)> {
        self.inner
            .entries
            .iter()
            .map(|e| (e.name.clone(), e.metrics.snapshot()))
            .collect()
    }
}
