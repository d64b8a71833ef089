//! The `command` plug-in: a long-running subprocess speaking JSON lines.
//!
//! Protocol, one exchange per batch, one at a time per process:
//!
//! ```text
//! → {"id": 7, "samples": [{"id": 0, "group_id": 0, "prompt": "…", "messages": [], "completion": "…",
//!                          "completion_ids": [], "row": {"answer": "…"}}, …]}
//! ← {"id": 7, "scores": [1.0, null, …]}        or   {"id": 7, "error": "what went wrong"}
//! ```
//!
//! Scores are as in [`crate::plugin`]. The process, its restarts, timeouts
//! and faults are [`super::process`]'s: calls take turns on the one
//! process, a call's timeout starts with its turn, and a process that
//! times out, dies or answers out of step is killed with its whole process
//! group and restarted on the next call after a doubling backoff, from
//! `restart_backoff_s` to `max_restart_backoff_s`. An `error` answer fails
//! its batch and keeps the process.
//!
//! `script = "my_reward.py"` runs the bundled Python helper
//! (`examples/rewards/grpo_reward_plugin.py`, embedded in this crate) on
//! that file; `command = ["prog", "arg", …]` runs any program that speaks
//! the protocol.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::process::JsonLinesProcess;
use crate::config::{MAX_SECONDS, duration};
use crate::{BoxFuture, Error, Result, Reward, Sample, Score};

/// The Python helper that runs a user's `reward(prompt, completion, **row)`.
pub const PYTHON_HELPER: &str = include_str!("../../../examples/rewards/grpo_reward_plugin.py");

/// `[[reward]] type = "command"` keys; give exactly one of `script` and `command`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// A Python file defining `reward(prompt, completion, **row)` or a batched
    /// `rewards(prompts, completions, **columns)`, relative to the working directory.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// A program and its arguments that speak the protocol. Default: none.
    #[serde(default)]
    pub command: Vec<String>,
    /// The Python interpreter for `script`. Default `"python3"`.
    #[serde(default = "default_python")]
    pub python: String,
    /// First restart delay after a failure, in seconds. Default 0.1.
    #[serde(default = "default_backoff")]
    pub restart_backoff_s: f64,
    /// Longest restart delay, in seconds. Default 10.
    #[serde(default = "default_max_backoff")]
    pub max_restart_backoff_s: f64,
}

fn default_python() -> String {
    "python3".into()
}

fn default_backoff() -> f64 {
    0.1
}

fn default_max_backoff() -> f64 {
    10.0
}

impl CommandConfig {
    /// Builds the plug-in (the process starts on the first call); `name` labels errors.
    pub fn build(&self, name: &str) -> Result<CommandReward> {
        let argv = match (&self.script, self.command.is_empty()) {
            (Some(script), true) => {
                vec![
                    self.python.clone(),
                    "-c".into(),
                    PYTHON_HELPER.into(),
                    script.display().to_string(),
                ]
            }
            (None, false) => self.command.clone(),
            _ => {
                return Err(Error::Config(format!(
                    "reward {name}: give exactly one of `script` and `command`"
                )));
            }
        };
        let (backoff, max_backoff) = match (duration(self.restart_backoff_s), duration(self.max_restart_backoff_s)) {
            (Some(backoff), Some(max)) if backoff <= max => (backoff, max),
            _ => {
                return Err(Error::Config(format!(
                    "reward {name}: need 0 <= restart_backoff_s <= max_restart_backoff_s <= {MAX_SECONDS}, not {} and {}",
                    self.restart_backoff_s, self.max_restart_backoff_s
                )));
            }
        };
        Ok(CommandReward {
            process: JsonLinesProcess::new(argv, backoff, max_backoff),
        })
    }
}

/// The `command` plug-in.
pub struct CommandReward {
    process: JsonLinesProcess,
}

#[derive(Serialize)]
struct Request<'a> {
    samples: &'a [Sample],
}

/// The scores of an answer to `batch`, or the fault it reports.
fn scores(answer: &Map<String, Value>, batch: &[Sample]) -> Result<Vec<Score>> {
    match (answer.get("scores"), answer.get("error")) {
        (_, Some(Value::String(error))) => Err(Error::BadOutput(format!("the plug-in reported: {error}"))),
        (_, Some(error)) => Err(Error::BadOutput(format!("the plug-in reported: {error}"))),
        (Some(scores), None) => super::parse_scores(scores, batch),
        (None, None) => Err(Error::BadOutput("an answer with neither `scores` nor `error`".into())),
    }
}

impl Reward for CommandReward {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move { scores(&self.process.call(&Request { samples: batch }).await?, batch) })
    }

    fn score_within<'a>(&'a self, batch: &'a [Sample], limit: Duration) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move {
            let answer = self.process.call_within(&Request { samples: batch }, limit).await?;
            scores(&answer, batch)
        })
    }
}
