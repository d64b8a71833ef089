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
//! through; its stdout carries only protocol lines, each at most
//! [`MAX_ANSWER_BYTES`]. Calls take turns on the one process, and a call's
//! timeout starts with its turn. A call that times out or is cancelled
//! kills the process; so does one that finds it dead or out of step (it
//! exited, closed its stdout, answered a line that is not UTF-8, too long,
//! not the protocol, or of the wrong id) — at once, with the reason. The
//! process leads its own process group, and the whole group is killed, so
//! nothing it started outlives it. The next call restarts it after a
//! backoff that doubles with each consecutive failure, from
//! `restart_backoff_s` to `max_restart_backoff_s`.
//!
//! `script = "my_reward.py"` runs the bundled Python helper
//! (`examples/rewards/grpo_reward_plugin.py`, embedded in this crate) on
//! that file; `command = ["prog", "arg", …]` runs any program that speaks
//! the protocol.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use super::MAX_ANSWER_BYTES;
use crate::config::{MAX_SECONDS, duration};
use crate::sample::within;
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

/// A running plug-in; dropping it kills its process group.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) with a negative pid signals the process group
            // the plug-in leads (it was started as its leader); it touches
            // no memory of this process.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            }
        }
    }
}

/// The next line of `reader` without its newline: `None` at the end of
/// the stream; an error for a line over [`MAX_ANSWER_BYTES`] or not UTF-8.
async fn read_answer(reader: &mut BufReader<ChildStdout>) -> Result<Option<String>> {
    let mut line = Vec::new();
    loop {
        let available = reader
            .fill_buf()
            .await
            .map_err(|e| crashed(format!("reading its answer: {e}")))?;
        if available.is_empty() {
            return Ok(None);
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        if line.len() > MAX_ANSWER_BYTES + 1 {
            return Err(Error::BadOutput(format!(
                "an answer line over {MAX_ANSWER_BYTES} bytes"
            )));
        }
        if done {
            line.pop();
            return String::from_utf8(line)
                .map(Some)
                .map_err(|e| Error::BadOutput(format!("an answer line that is not UTF-8 ({e})")));
        }
    }
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
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| crashed(format!("cannot start `{}`: {e}", self.argv[0])))?;
        let stdin = child.stdin.take().ok_or_else(|| crashed("no stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| crashed("no stdout"))?);
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
        let Some(answer) = read_answer(&mut process.stdout).await? else {
            let status = match process.child.try_wait() {
                Ok(Some(status)) => format!("exited ({status})"),
                _ => "closed its stdout".to_string(),
            };
            return Err(crashed(status));
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

impl CommandReward {
    /// One batch on the process, in this call's turn (`state` held):
    /// (re)starting it if needed, keeping it when it stays in step.
    async fn call(&self, state: &mut State, batch: &[Sample]) -> Result<Vec<Score>> {
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
    }
}

impl Reward for CommandReward {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move { self.call(&mut *self.state.lock().await, batch).await })
    }

    fn score_within<'a>(&'a self, batch: &'a [Sample], limit: Duration) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move {
            let mut state = self.state.lock().await;
            within(limit, self.call(&mut state, batch)).await
        })
    }
}
