//! What a reward sees and returns, and the [`Reward`] trait.
//!
//! The TRL contract `reward(prompts, completions, completion_ids, **columns)
//! -> list[float | None]` maps one to one: a batch of [`Sample`]s in, one
//! [`Score`] per sample out, `None` meaning "skip this sample".

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A boxed, sendable future (what [`Reward::score`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One chat message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// One sample to score.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// The sample's id, used in logs and errors.
    pub id: u64,
    /// The group (prompt) the sample belongs to.
    pub group_id: u64,
    /// The prompt as text (the rendered chat, or the raw prompt).
    pub prompt: String,
    /// The prompt as chat messages; empty when the prompt was plain text.
    pub messages: Vec<Message>,
    /// The completion text.
    pub completion: String,
    /// The completion's token ids; empty when unknown (e.g. `grpo reward` input without them).
    pub completion_ids: Vec<u32>,
    /// The dataset row's other columns (`answer`, `metadata`, …).
    pub row: serde_json::Map<String, serde_json::Value>,
}

impl Sample {
    /// A sample from a JSONL row: `{"prompt": text | messages, "completion": text | messages,
    /// "completion_ids"?: [int], "group_id"?: int, <other columns>}`. The group id defaults to `id`;
    /// messages' text is their contents joined by newlines.
    pub fn from_row(id: u64, mut row: serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let bad = |what: String| crate::Error::BadSample { sample: id, what };
        let mut take = |key: &str| row.remove(key).ok_or_else(|| bad(format!("no `{key}`")));
        let text_and_messages = |key: &str, value: serde_json::Value| match value {
            serde_json::Value::String(text) => Ok((text, Vec::new())),
            messages => {
                let messages: Vec<Message> = serde_json::from_value(messages)
                    .map_err(|e| bad(format!("`{key}` must be text or a list of {{role, content}}: {e}")))?;
                Ok((
                    messages
                        .iter()
                        .map(|m| m.content.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    messages,
                ))
            }
        };
        let (prompt, messages) = text_and_messages("prompt", take("prompt")?)?;
        let (completion, _) = text_and_messages("completion", take("completion")?)?;
        let completion_ids = match row.remove("completion_ids") {
            Some(ids) => serde_json::from_value(ids).map_err(|e| bad(format!("`completion_ids`: {e}")))?,
            None => Vec::new(),
        };
        let group_id = match row.remove("group_id") {
            Some(group) => group
                .as_u64()
                .ok_or_else(|| bad("`group_id` must be a non-negative integer".into()))?,
            None => id,
        };
        Ok(Self {
            id,
            group_id,
            prompt,
            messages,
            completion,
            completion_ids,
            row,
        })
    }

    /// The column `name` as text: strings as they are, numbers and others as JSON.
    pub fn column(&self, name: &str) -> Result<String> {
        match self.row.get(name) {
            Some(serde_json::Value::String(text)) => Ok(text.clone()),
            Some(value) => Ok(value.to_string()),
            None => Err(crate::Error::BadSample {
                sample: self.id,
                what: format!("no column `{name}`"),
            }),
        }
    }
}

/// One reward's verdict on one sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// The score, or `None` to skip the sample for this reward.
    pub value: Option<f32>,
    /// Named sub-scores, for logging only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub components: BTreeMap<String, f32>,
}

impl Score {
    /// A plain score without sub-scores.
    pub fn new(value: f32) -> Self {
        Self {
            value: Some(value),
            components: BTreeMap::new(),
        }
    }

    /// 1 when `hit`, else 0.
    pub fn hit(hit: bool) -> Self {
        Self::new(if hit { 1.0 } else { 0.0 })
    }
}

/// A reward function: async and batched.
///
/// Returns one [`Score`] per sample of `batch`, in order. An `Err` (or a
/// list of the wrong length) is a fault of the whole batch, handled by the
/// entry's `on_error`; NaN or infinite values are faults of their sample.
pub trait Reward: Send + Sync {
    /// Scores a batch.
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>>;

    /// Scores a batch within `limit` of the reward's own time, or fails
    /// with [`Error::Timeout`]. A reward that makes calls wait their turn
    /// (one subprocess, a bounded connection pool) starts the clock when
    /// the turn comes, so that waiting is never counted as its fault.
    fn score_within<'a>(&'a self, batch: &'a [Sample], limit: Duration) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(within(limit, self.score(batch)))
    }
}

/// `work` within `limit`, or [`Error::Timeout`].
pub async fn within<T>(limit: Duration, work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, work).await.unwrap_or(Err(Error::Timeout {
        seconds: limit.as_secs_f64(),
    }))
}

/// A reward computed sample by sample, synchronously (the built-ins).
pub trait SampleReward: Send + Sync {
    /// Scores one sample.
    fn score_sample(&self, sample: &Sample) -> Result<Score>;
}

impl<T: SampleReward> Reward for T {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(std::future::ready(batch.iter().map(|s| self.score_sample(s)).collect()))
    }
}
