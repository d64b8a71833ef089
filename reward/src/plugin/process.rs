//! A long-running subprocess speaking JSON lines: the machinery under the
//! reward `command` plug-in and grpo-env's environment plug-in.
//!
//! Each call writes one request line — the caller's JSON object with an
//! `"id"` added — and reads one answer line, a JSON object carrying the same
//! `"id"`. The process's stderr is passed through; its stdout carries only
//! protocol lines, each at most [`MAX_ANSWER_BYTES`].
//!
//! The process starts on the first call. Calls take turns on it, and a
//! timed call's clock starts with its turn ([`JsonLinesProcess::call_within`]).
//! A call that times out or is cancelled kills the process; so does one
//! that finds it dead or out of step (it could not start, exited, closed
//! its stdout, answered a line that is not UTF-8, too long, not a JSON
//! object with an integer `id`, or of another id) — at once, with the
//! reason. The process leads its own process group, and the whole group is
//! killed, so nothing it started outlives it. The next call restarts it
//! after a backoff that doubles with each consecutive failure, from the
//! minimum to the maximum given. An answer in step keeps the process,
//! whatever the caller then makes of it.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use super::MAX_ANSWER_BYTES;
use crate::sample::within;
use crate::{Error, Result};

/// How long a process whose stdout closed gets to show its exit status.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// A JSON-lines subprocess, started lazily and restarted after failures.
pub struct JsonLinesProcess {
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

/// A running process; dropping it kills its process group.
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

/// A request line: the caller's object with the call's id.
#[derive(Serialize)]
struct Line<'a, T: ?Sized> {
    id: u64,
    #[serde(flatten)]
    body: &'a T,
}

/// A protocol failure that leaves the process in an unknown state.
fn crashed(what: impl std::fmt::Display) -> Error {
    Error::Crashed(what.to_string())
}

/// The first 100 characters of `text`, for messages.
fn excerpt(text: &str) -> String {
    text.chars().take(100).collect()
}

impl JsonLinesProcess {
    /// A process running `argv` (program first) once called; after a
    /// failure the next call waits `backoff`, doubling with each
    /// consecutive failure up to `max_backoff`, before restarting it.
    pub fn new(argv: Vec<String>, backoff: Duration, max_backoff: Duration) -> JsonLinesProcess {
        JsonLinesProcess {
            argv,
            backoff,
            max_backoff,
            state: Mutex::new(State::default()),
        }
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Sends `body` (a serializable object without an `id` key) as one
    /// request line once the process is free, and returns the answer
    /// object with its `id` removed.
    pub async fn call<T: Serialize + Sync + ?Sized>(&self, body: &T) -> Result<Map<String, Value>> {
        let mut state = self.state.lock().await;
        self.exchange_in_turn(&mut state, body).await
    }

    /// [`JsonLinesProcess::call`] within `limit` from the moment the
    /// process is free, or [`Error::Timeout`] (the process is killed).
    pub async fn call_within<T: Serialize + Sync + ?Sized>(
        &self,
        body: &T,
        limit: Duration,
    ) -> Result<Map<String, Value>> {
        let mut state = self.state.lock().await;
        within(limit, self.exchange_in_turn(&mut state, body)).await
    }

    /// One exchange in this call's turn (`state` held): (re)starting the
    /// process if needed, keeping it when it stays in step.
    async fn exchange_in_turn<T: Serialize + Sync + ?Sized>(
        &self,
        state: &mut State,
        body: &T,
    ) -> Result<Map<String, Value>> {
        let id = state.next_id;
        let mut line = serde_json::to_vec(&Line { id, body }).map_err(|e| Error::BadOutput(e.to_string()))?;
        line.push(b'\n');
        // Counted before the exchange so that a cancelled (timed out) call counts as a failure too.
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
        state.next_id += 1;
        let answer = exchange(&mut process, id, &line).await?;
        state.failures = 0;
        state.process = Some(process);
        Ok(answer)
    }

    fn spawn(&self) -> Result<Process> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(crashed("cannot start an empty command"));
        };
        let mut child = Command::new(program)
            .args(args)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| crashed(format!("cannot start `{program}`: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| crashed("no stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| crashed("no stdout"))?);
        Ok(Process { child, stdin, stdout })
    }
}

/// Writes `line` (request `id`) and reads its answer; any error leaves the
/// process out of step.
async fn exchange(process: &mut Process, id: u64, line: &[u8]) -> Result<Map<String, Value>> {
    let written = async {
        process.stdin.write_all(line).await?;
        process.stdin.flush().await
    };
    if let Err(e) = written.await {
        return Err(crashed(format!("writing the request: {e}")));
    }
    let Some(answer) = read_answer(&mut process.stdout).await? else {
        // A process that exits closes its stdout a moment before its exit is seen.
        let status = match tokio::time::timeout(EXIT_GRACE, process.child.wait()).await {
            Ok(Ok(status)) => format!("exited ({status})"),
            _ => "closed its stdout".to_string(),
        };
        return Err(crashed(status));
    };
    let not_protocol = |why: String| Error::BadOutput(format!("not a protocol line ({why}): {}", excerpt(&answer)));
    let mut object = match serde_json::from_str::<Value>(&answer) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return Err(not_protocol("not a JSON object".into())),
        Err(e) => return Err(not_protocol(e.to_string())),
    };
    match object.remove("id") {
        Some(Value::Number(n)) if n.as_u64() == Some(id) => Ok(object),
        Some(Value::Number(n)) => Err(Error::BadOutput(format!(
            "answer to request {n} while waiting for {id}"
        ))),
        Some(other) => Err(not_protocol(format!("`id` is {other}, not an integer"))),
        None => Err(not_protocol("no `id`".into())),
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn python(script: &str) -> JsonLinesProcess {
        let argv = vec!["python3".into(), "-c".into(), script.into()];
        JsonLinesProcess::new(argv, Duration::from_millis(20), Duration::from_millis(40))
    }

    #[tokio::test]
    async fn requests_carry_ids_and_answers_come_back_without_them() {
        let echo = "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
                    print(json.dumps({'id': r['id'], 'got': r}), flush=True)\n";
        let process = python(echo);
        for id in 0..2 {
            let answer = process.call(&json!({"method": "ping"})).await.unwrap();
            assert_eq!(Value::Object(answer), json!({"got": {"id": id, "method": "ping"}}));
        }
    }

    #[tokio::test]
    async fn out_of_step_answers_are_bad_output_and_the_process_restarts() {
        let wrong = "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
                     print(json.dumps({'id': r['id'] + 1}) if r['id'] == 0 else '[1]', flush=True)\n";
        let process = python(wrong);
        let first = process.call(&json!({})).await.unwrap_err().to_string();
        assert!(first.contains("answer to request 1 while waiting for 0"), "{first}");
        let second = process.call(&json!({})).await.unwrap_err().to_string();
        assert!(second.contains("not a JSON object"), "{second}");
        let empty = JsonLinesProcess::new(Vec::new(), Duration::ZERO, Duration::ZERO);
        assert!(matches!(empty.call(&json!({})).await, Err(Error::Crashed(_))));
    }
}
