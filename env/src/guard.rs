//! The fault policy of an environment: every step runs under a timeout,
//! and a fault — the environment's error, a step past its timeout, a
//! reply with no messages or a non-finite reward — ends its episode as
//! `on_error` says (the reward crate's [`OnError`], the same values as a
//! `[[reward]]` table's).
//!
//! [`GuardedEnvironment::step`] tells the caller one of four things:
//!
//! | answer                        | the episode                    | the sample                                  |
//! |-------------------------------|--------------------------------|---------------------------------------------|
//! | [`Answer::Continue`]          | goes on with these messages    |                                             |
//! | [`Answer::Done`]              | ended by the environment       | its reward, or none (the `[[reward]]` tables score it) |
//! | [`Answer::Faulted`]           | ended by a fault (`on_error = <score>`) | that score stands in for the environment's reward |
//! | [`Answer::Skipped`]           | ended by a fault (`on_error = "skip"`)  | left out of training                |
//!
//! and `Err(`[`Error::Failed`]`)` under `on_error = "fail"`: the run
//! stops with an error naming the environment and the episode. Every
//! fault is logged (`tracing::warn`) and counted in [`EnvironmentMetrics`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpo_model::chat::ChatMessage;
use grpo_model::tools::Tool;
use grpo_reward::OnError;
use grpo_rollout::guided::Guide;
use serde::Serialize;

use crate::Error;
use crate::environment::{Environment, EnvironmentError, EpisodeView, Reply};

/// What became of a turn once the fault policy is applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The episode goes on.
    Continue {
        /// The messages the model reads next (at least one).
        messages: Vec<ChatMessage>,
        /// Of the turn's tool calls, those that could not run.
        failed_calls: usize,
        /// What the next turn must be, if the environment said (see [`Reply::Continue`]).
        guide: Option<Guide>,
    },
    /// The environment ended the episode.
    Done {
        /// Its reward (`None`: the run's `[[reward]]` tables alone score it).
        reward: Option<f32>,
    },
    /// A fault ended the episode and `on_error` is a score.
    Faulted {
        /// The `on_error` score, standing in for the environment's reward.
        reward: f32,
        /// What went wrong.
        cause: EnvironmentError,
    },
    /// A fault ended the episode and `on_error` is "skip": the sample is
    /// left out of training.
    Skipped {
        /// What went wrong.
        cause: EnvironmentError,
    },
}

impl Answer {
    /// Whether the episode is over.
    pub fn ends(&self) -> bool {
        !matches!(self, Answer::Continue { .. })
    }
}

/// An environment under a timeout and a fault policy.
pub struct GuardedEnvironment {
    environment: Box<dyn Environment>,
    timeout: Duration,
    on_error: OnError,
    metrics: EnvironmentMetrics,
}

impl GuardedEnvironment {
    /// `environment` with each step limited to `timeout` and faults
    /// handled per `on_error` (a score should be finite: the config checks it).
    pub fn new(environment: Box<dyn Environment>, timeout: Duration, on_error: OnError) -> GuardedEnvironment {
        GuardedEnvironment {
            environment,
            timeout,
            on_error,
            metrics: EnvironmentMetrics::default(),
        }
    }

    /// The environment's name.
    pub fn name(&self) -> &str {
        self.environment.name()
    }

    /// The tools the model is offered.
    pub fn tools(&self) -> Vec<Tool> {
        self.environment.tools()
    }

    /// The environment itself, unguarded.
    pub fn environment(&self) -> &dyn Environment {
        self.environment.as_ref()
    }

    /// The limit on one step.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What a fault becomes.
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// The answer to the latest turn of `episode`, faults resolved per
    /// `on_error`; `Err` only under `on_error = "fail"`.
    pub async fn step(&self, episode: EpisodeView<'_>) -> Result<Answer, Error> {
        self.metrics.call();
        let reply = match self.environment.step_within(episode, self.timeout).await {
            None => {
                self.metrics.timeout();
                Err(EnvironmentError(format!(
                    "timed out after {} s",
                    self.timeout.as_secs_f64()
                )))
            }
            Some(Ok(Reply::Continue { messages, .. })) if messages.is_empty() => Err(EnvironmentError(
                "an answer with no messages (continue with at least one, or end the episode)".into(),
            )),
            Some(Ok(Reply::Done { reward: Some(reward) })) if !reward.is_finite() => {
                Err(EnvironmentError(format!("reward {reward} is not finite")))
            }
            Some(reply) => reply,
        };
        let cause = match reply {
            Ok(Reply::Continue {
                messages,
                failed_calls,
                guide,
            }) => {
                return Ok(Answer::Continue {
                    messages,
                    failed_calls,
                    guide,
                });
            }
            Ok(Reply::Done { reward }) => return Ok(Answer::Done { reward }),
            Err(cause) => cause,
        };
        self.metrics.fault();
        tracing::warn!(environment = %self.name(), episode = episode.id, "environment fault: {cause}");
        match self.on_error {
            OnError::Score(reward) => Ok(Answer::Faulted { reward, cause }),
            OnError::Skip => Ok(Answer::Skipped { cause }),
            OnError::Fail => Err(Error::Failed {
                environment: self.name().to_string(),
                episode: episode.id,
                cause,
            }),
        }
    }

    /// Episode `id` is over (the caller says so for every episode, however
    /// it ended): state kept for it may go. Best effort; the plug-ins bound
    /// it with their own timeout and log failures.
    pub async fn end(&self, id: u64) {
        self.environment.end(id).await
    }

    /// The fault counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }
}

/// Fault counters of an environment, shared by its concurrent steps.
#[derive(Debug, Default)]
pub struct EnvironmentMetrics {
    calls: AtomicU64,
    faults: AtomicU64,
    timeouts: AtomicU64,
}

/// A copy of [`EnvironmentMetrics`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Steps asked.
    pub calls: u64,
    /// Steps that faulted, timeouts included.
    pub faults: u64,
    /// Of the faults, steps past their timeout.
    pub timeouts: u64,
}

impl EnvironmentMetrics {
    /// Counts a step.
    pub fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a faulted step.
    pub fn fault(&self) {
        self.faults.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a step past its timeout (also counted as a fault).
    pub fn timeout(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsSnapshot {
            calls: get(&self.calls),
            faults: get(&self.faults),
            timeouts: get(&self.timeouts),
        }
    }
}
