//! The `command` environment: a long-running subprocess speaking the
//! protocol of [`crate::plugin`] in JSON lines, one request at a time.
//!
//! The process is the reward crate's
//! [`JsonLinesProcess`]: it starts on the first call, calls take
//! turns on it, a step's timeout starts with its turn, and a process that
//! times out, dies or answers out of step (not JSON, another id, a line
//! over the size limit) is killed with its whole process group and
//! restarted on the next call after a backoff doubling from
//! `restart_backoff_s` to `max_restart_backoff_s`. An answer that is in
//! step but out of protocol (bad messages, an `error`) is a fault of its
//! step only; the process stays.
//!
//! Building the environment starts the process once to ask for its tools
//! (on a runtime of its own, within the timeout); steps then start it again
//! on the caller's runtime.
//!
//! `script = "my_env.py"` runs the bundled Python helper
//! (`examples/environments/grpo_env_plugin.py`, embedded in this crate) on
//! that file; `command = ["prog", "arg", …]` runs any program that speaks
//! the protocol.

use std::time::Duration;

use grpo_model::tools::Tool;
use grpo_reward::BoxFuture;
use grpo_reward::plugin::process::JsonLinesProcess;

use super::{Request, check_end, on_own_runtime, parse_step, parse_tools};
use crate::environment::{Environment, EnvironmentError, EpisodeView, Reply};

/// The Python helper that runs a user's `step(messages, **row)`.
pub const PYTHON_HELPER: &str = include_str!("../../../examples/environments/grpo_env_plugin.py");

/// How to run a `command` environment.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// Its name in logs and errors.
    pub name: String,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The first restart delay after a failure.
    pub restart_backoff: Duration,
    /// The longest restart delay.
    pub max_restart_backoff: Duration,
    /// The limit on asking for the tools and on ending an episode (the
    /// guard bounds steps).
    pub timeout: Duration,
}

/// The `command` environment.
pub struct CommandEnvironment {
    name: String,
    process: JsonLinesProcess,
    tools: Vec<Tool>,
    timeout: Duration,
}

/// A plug-in process's fault as an environment error.
fn fault(error: grpo_reward::Error) -> EnvironmentError {
    EnvironmentError(error.to_string())
}

impl CommandEnvironment {
    /// Asks the plug-in of `spec` for its tools (a process of its own,
    /// stopped once it answered) and returns the environment, whose process
    /// starts on its first step. Works inside or outside a runtime.
    pub fn start(spec: CommandSpec) -> Result<CommandEnvironment, EnvironmentError> {
        let new_process = || JsonLinesProcess::new(spec.argv.clone(), spec.restart_backoff, spec.max_restart_backoff);
        let asking = new_process();
        let tools = on_own_runtime(async move {
            let answer = asking.call_within(&Request::Tools, spec.timeout).await.map_err(fault)?;
            parse_tools(&answer)
        })??;
        Ok(CommandEnvironment {
            process: new_process(),
            name: spec.name,
            tools,
            timeout: spec.timeout,
        })
    }
}

impl Environment for CommandEnvironment {
    fn name(&self) -> &str {
        &self.name
    }

    fn tools(&self) -> Vec<Tool> {
        self.tools.clone()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        Box::pin(async move { parse_step(&self.process.call(&Request::step(episode)).await.map_err(fault)?) })
    }

    fn step_within<'a>(
        &'a self,
        episode: EpisodeView<'a>,
        limit: Duration,
    ) -> BoxFuture<'a, Option<Result<Reply, EnvironmentError>>> {
        Box::pin(async move {
            match self.process.call_within(&Request::step(episode), limit).await {
                Ok(answer) => Some(parse_step(&answer)),
                Err(grpo_reward::Error::Timeout { .. }) => None,
                Err(error) => Some(Err(fault(error))),
            }
        })
    }

    fn end(&self, id: u64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ended = match self
                .process
                .call_within(&Request::End { episode: id }, self.timeout)
                .await
            {
                Ok(answer) => check_end(&answer),
                Err(error) => Err(fault(error)),
            };
            if let Err(error) = ended {
                tracing::warn!(environment = %self.name, episode = id, "ending the episode: {error}");
            }
        })
    }
}
