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
//! Scores are as in [`crate::plugin`]. The process's stderr is passed
//! through; its stdout carries only protocol lines. A call that times out
//! or is cancelled drops (and so kills) the process; one that finds it dead
//! (exited, closed its pipes, answered garbage or the wrong id) kills it
//! too. The next call restarts it after a backoff that doubles with each
//! consecutive failure, from `restart_backoff_s` to `max_restart_backoff_s`.
//!
//! `script = "my_reward.py"` runs the bundled Python helper
//! (`examples/rewards/grpo_reward_plugin.py`, embedded in this crate) on
//! that file; `command = ["prog", "arg", …]` runs any program that speaks
//! the protocol.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

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
            argv,
            backoff,
            max_backoff,
            state: Mutex::new(State::default()),
        })
    }
}

/// The `command` plug-in.
pub struct CommandReward {
    argv: Vec<String>,
    backoff: Duration,
    max_backoff: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    process: Option<Process>,
    next_id: u64,
    failures: u32,
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

#[derive(Serialize)]
struct Request<'a> {
    id: u64,
    samples: &'a [Sample],
}

#[derive(Deserialize)]
struct Response {
    id: u64,
    #[serde(default)]
    scores: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
}

/// A protocol failure that leaves the process in an unknown state.
fn crashed(what: impl std::fmt::Display) -> Error {
    Error::Crashed(what.to_string())
}

impl CommandReward {
    fn spawn(&self) -> Result<Process> {
        let mut child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| crashed(format!("cannot start `{}`: {e}", self.argv[0])))?;
        let stdin = child.stdin.take().ok_or_else(|| crashed("no stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| crashed("no stdout"))?).lines();
        Ok(Process { child, stdin, stdout })
    }

    /// One request and its answer; `Err` with the process to keep when it is still in step.
    async fn exchange(process: &mut Process, id: u64, batch: &[Sample]) -> Result<Result<Vec<Score>>> {
        let mut line =
            serde_json::to_vec(&Request { id, samples: batch }).map_err(|e| Error::BadOutput(e.to_string()))?;
        line.push(b'\n');
        let written = async {
            process.stdin.write_all(&line).await?;
            process.stdin.flush().await
        };
        if let Err(e) = written.await {
            return Err(crashed(format!("writing the request: {e}")));
        }
        let answer = match process.stdout.next_line().await {
            Ok(Some(answer)) => answer,
            Ok(None) | Err(_) => {
                let status = process.child.wait().await.map(|s| s.to_string()).unwrap_or_default();
                return Err(crashed(format!("process exited ({status})")));
            }
        };
        let response: Response = serde_json::from_str(&answer).map_err(|e| {
            Error::BadOutput(format!(
                "not a protocol line ({e}): {}",
                answer.chars().take(100).collect::<String>()
            ))
        })?;
        if response.id != id {
            return Err(Error::BadOutput(format!(
                "answer to request {} while waiting for {id}",
                response.id
            )));
        }
        Ok(match (response.scores, response.error) {
            (_, Some(error)) => Err(Error::BadOutput(format!("the plug-in reported: {error}"))),
            (Some(scores), None) => super::parse_scores(&scores, batch),
            (None, None) => Err(Error::BadOutput("an answer with neither `scores` nor `error`".into())),
        })
    }
}

impl Reward for CommandReward {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move {
            let mut state = self.state.lock().await;
            // Counted before the call so that a cancelled (timed out) call counts as a failure too.
            state.failures += 1;
            let mut process = match state.process.take() {
                Some(process) => process,
                None => {
                    if state.failures > 1 {
                        let delay = self.backoff.saturating_mul(1 << (state.failures - 2).min(16));
                        tokio::time::sleep(delay.min(self.max_backoff)).await;
                    }
                    self.spawn()?
                }
            };
            let id = state.next_id;
            state.next_id += 1;
            let answer = Self::exchange(&mut process, id, batch).await?;
            state.failures = 0;
            state.process = Some(process);
            answer
        })
    }
}
