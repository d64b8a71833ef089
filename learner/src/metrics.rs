//! The statistics of a step's metrics that TRL's `GRPOTrainer` logs under
//! names with a slash — completion lengths (`completions/…`) and each
//! reward function's mean and std (`rewards/<name>/…`) — and the names
//! grpo wrote before it took TRL's, which a resumed run's
//! `metrics.jsonl` is rewritten to ([`renamed`]); TRL's tool metrics and
//! grpo's `episode/…` for multi-turn runs ([`EpisodeStats`]); and reports as the
//! metrics of a line ([`metrics_of`], [`eval_names`]).

use std::collections::BTreeMap;

use grpo_reward::Total;

use crate::episode::{Episode, EpisodeEnd};
use grpo_rollout::output::{Completion, FinishReason};
use serde_json::{Map, Value};

/// Lengths in tokens of a batch of completions, under TRL's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompletionStats {
    /// Mean length.
    #[serde(rename = "completions/mean_length")]
    pub mean_length: f64,
    /// Shortest.
    #[serde(rename = "completions/min_length")]
    pub min_length: f64,
    /// Longest.
    #[serde(rename = "completions/max_length")]
    pub max_length: f64,
    /// Fraction cut off at the token limit.
    #[serde(rename = "completions/clipped_ratio")]
    pub clipped_ratio: f64,
    /// Mean length of those that ended on their own (0 when none did).
    #[serde(rename = "completions/mean_terminated_length")]
    pub mean_terminated_length: f64,
    /// Shortest of those (0 when none).
    #[serde(rename = "completions/min_terminated_length")]
    pub min_terminated_length: f64,
    /// Longest of those (0 when none).
    #[serde(rename = "completions/max_terminated_length")]
    pub max_terminated_length: f64,
}

impl CompletionStats {
    /// The statistics of `completions` (all zero for none).
    pub fn of<'a>(completions: impl IntoIterator<Item = &'a Completion>) -> CompletionStats {
        let mut all = Lengths::default();
        let mut terminated = Lengths::default();
        let mut clipped = 0usize;
        for completion in completions {
            let length = completion.tokens.len();
            all.add(length);
            if completion.finish_reason == FinishReason::Length {
                clipped += 1;
            } else {
                terminated.add(length);
            }
        }
        CompletionStats {
            mean_length: all.mean(),
            min_length: all.min(),
            max_length: all.max as f64,
            clipped_ratio: clipped as f64 / all.count.max(1) as f64,
            mean_terminated_length: terminated.mean(),
            min_terminated_length: terminated.min(),
            max_terminated_length: terminated.max as f64,
        }
    }
}

/// What a batch of multi-turn episodes did, under TRL's tool metric names
/// and grpo's `episode/…`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpisodeStats {
    /// Tool calls per episode (TRL's total calls over completions).
    #[serde(rename = "tools/call_frequency")]
    pub call_frequency: f64,
    /// Of the tool calls, the fraction that could not run (0 without calls).
    #[serde(rename = "tools/failure_frequency")]
    pub failure_frequency: f64,
    /// Model turns per episode.
    #[serde(rename = "episode/turns_mean")]
    pub turns_mean: f64,
    /// Fraction of episodes the environment ended.
    #[serde(rename = "episode/ended_done")]
    pub ended_done: f64,
    /// Fraction that used all `max_turns`.
    #[serde(rename = "episode/ended_max_turns")]
    pub ended_max_turns: f64,
    /// Fraction whose next turn would not fit `max_completion_tokens`.
    #[serde(rename = "episode/ended_token_budget")]
    pub ended_token_budget: f64,
    /// Fraction an environment fault ended.
    #[serde(rename = "episode/ended_fault")]
    pub ended_fault: f64,
}

impl EpisodeStats {
    /// The statistics of `episodes` (`None` for none: a single-turn batch).
    pub fn of<'a>(episodes: impl IntoIterator<Item = &'a Episode>) -> Option<EpisodeStats> {
        let (mut count, mut calls, mut failed, mut turns) = (0usize, 0usize, 0usize, 0usize);
        let mut ends = [0usize; 4];
        for e in episodes {
            count += 1;
            calls += e.tool_calls;
            failed += e.failed_tool_calls;
            turns += e.turns;
            ends[match e.end {
                EpisodeEnd::Done => 0,
                EpisodeEnd::MaxTurns => 1,
                EpisodeEnd::TokenBudget => 2,
                EpisodeEnd::Fault => 3,
            }] += 1;
        }
        let per = |n: usize, of: usize| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        (count > 0).then(|| EpisodeStats {
            call_frequency: per(calls, count),
            failure_frequency: per(failed, calls),
            turns_mean: per(turns, count),
            ended_done: per(ends[0], count),
            ended_max_turns: per(ends[1], count),
            ended_token_budget: per(ends[2], count),
            ended_fault: per(ends[3], count),
        })
    }
}

/// A running count, sum, min and max of lengths.
#[derive(Default)]
struct Lengths {
    count: usize,
    sum: usize,
    min: usize,
    max: usize,
}

impl Lengths {
    fn add(&mut self, length: usize) {
        self.min = if self.count == 0 { length } else { self.min.min(length) };
        self.max = self.max.max(length);
        self.sum += length;
        self.count += 1;
    }

    fn mean(&self) -> f64 {
        self.sum as f64 / self.count.max(1) as f64
    }

    fn min(&self) -> f64 {
        self.min as f64
    }
}

/// `rewards/<name>/mean` and `rewards/<name>/std` for each reward function
/// in `names` and each sub-score (`<name>/<sub>`) in `totals`: over the
/// samples it scored (population std, as TRL's), `null` when it scored none.
pub fn reward_breakdown(names: &[String], totals: &[Total]) -> BTreeMap<String, Option<f64>> {
    let mut scores: BTreeMap<&str, Vec<f64>> = names.iter().map(|n| (n.as_str(), Vec::new())).collect();
    for total in totals {
        for (name, score) in &total.components {
            scores.entry(name).or_default().push(f64::from(*score));
        }
    }
    let mut breakdown = BTreeMap::new();
    for (name, values) in scores {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let present = !values.is_empty();
        breakdown.insert(format!("rewards/{name}/mean"), present.then_some(mean));
        breakdown.insert(format!("rewards/{name}/std"), present.then_some(std));
    }
    breakdown
}

/// The keys grpo's `metrics.jsonl` used before it took TRL's names, and
/// their names now.
pub const RENAMED: &[(&str, &str)] = &[
    ("mean_length", "completions/mean_length"),
    ("clipped_ratio", "completions/clipped_ratio"),
    ("clip_ratio_low", "clip_ratio/low_mean"),
    ("clip_ratio_high", "clip_ratio/high_mean"),
    ("eval_mean_length", "eval_completions/mean_length"),
    ("eval_time", "eval_runtime"),
];

/// `line` with the keys of [`RENAMED`] under their new names.
pub fn renamed(line: Map<String, Value>) -> Map<String, Value> {
    line.into_iter()
        .map(|(key, value)| match RENAMED.iter().find(|(old, _)| *old == key) {
            Some((_, new)) => (new.to_string(), value),
            None => (key, value),
        })
        .collect()
}

/// A report (a struct of named numbers) as the metrics of a JSON line.
pub fn metrics_of(report: &impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(report) {
        Ok(Value::Object(metrics)) => metrics,
        _ => unreachable!("a report serializes to a JSON object"),
    }
}

/// `metrics` with every key prefixed `eval_` (TRL's names of evaluation metrics).
pub fn eval_names(metrics: Map<String, Value>) -> Map<String, Value> {
    metrics
        .into_iter()
        .map(|(key, value)| (format!("eval_{key}"), value))
        .collect()
}
