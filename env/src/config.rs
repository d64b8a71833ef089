//! The `[environment]` table of a run config into a [`GuardedEnvironment`].
//!
//! ```toml
//! [environment]
//! type = "tools"              # tools (default) | guess | command | http
//! tools = ["calculate"]       # type tools: built-in tools by name (default ["calculate"])
//! # script = "my_env.py"      # type command: a Python file defining step(messages, **row)
//! # command = ["prog", "arg"] # type command: or any program speaking the protocol
//! # python = "python3"        # type command with script: the interpreter (default "python3")
//! # restart_backoff_s = 0.1   # type command: first restart delay (default 0.1)
//! # max_restart_backoff_s = 10.0 # type command: longest restart delay (default 10)
//! # url = "http://…/env"      # type http: the endpoint (required)
//! # bearer_token_env = "VAR"  # type http: a bearer token from this environment variable (default none)
//! timeout_s = 30.0            # limit on one step, and on asking for tools (default 30)
//! on_error = "skip"           # what a fault becomes: a score (e.g. 0.0) | "skip" (default) | "fail"
//! max_turns = 4               # most model turns per episode (default 4)
//! max_turn_tokens = 256       # most tokens in one model turn (default 256)
//! ```
//!
//! An episode's whole length after its prompt (the model's tokens and the
//! environment's) is `[rollout] max_completion_tokens`, as TRL's
//! `max_completion_length` bounds a multi-turn completion.
//!
//! Relative paths (`script`, and a `command` program or `python` written
//! with a `/`) are resolved against the config file's folder. Unknown keys,
//! keys of another type, and values that cannot be used are refused with
//! an error naming the key and what to do. The protocol of the plug-ins
//! is in [`crate::plugin`]; the fault policy in [`crate::guard`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use grpo_reward::OnError;
use grpo_reward::config::{MAX_SECONDS, duration};
use serde::Deserialize;

use crate::Error;
use crate::calculate::Calculate;
use crate::environment::{Environment, ToolEnvironment};
use crate::guard::GuardedEnvironment;
use crate::guess::GuessEnvironment;
use crate::plugin::command::{CommandEnvironment, CommandSpec, PYTHON_HELPER};
use crate::plugin::http::HttpEnvironment;
use crate::toolbox::Toolbox;

/// What answers the model's turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvironmentKind {
    /// Built-in tools ([`ToolEnvironment`]); a turn without calls ends the episode.
    #[default]
    Tools,
    /// The built-in number-guessing game ([`GuessEnvironment`]).
    Guess,
    /// A subprocess plug-in ([`CommandEnvironment`]).
    Command,
    /// An HTTP plug-in ([`HttpEnvironment`]).
    Http,
}

impl EnvironmentKind {
    /// The name `type` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvironmentKind::Tools => "tools",
            EnvironmentKind::Guess => "guess",
            EnvironmentKind::Command => "command",
            EnvironmentKind::Http => "http",
        }
    }
}

/// The built-in tools, by the names `tools` takes.
pub const BUILT_IN_TOOLS: [&str; 1] = ["calculate"];

/// The `[environment]` table.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentConfig {
    /// What answers the turns: "tools", "guess", "command" or "http". Default "tools".
    #[serde(rename = "type", default)]
    pub kind: EnvironmentKind,
    /// Type tools: the built-in tools offered, by name (see
    /// [`BUILT_IN_TOOLS`]). Default `["calculate"]`.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Type command: a Python file defining `step(messages, **row)` (run by
    /// the bundled helper), relative to the config's folder. Give it or
    /// `command`. Default none.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// Type command: a program and its arguments that speak the protocol.
    /// Give it or `script`. Default none.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Type command with `script`: the Python interpreter. Default "python3".
    #[serde(default)]
    pub python: Option<String>,
    /// Type command: the first restart delay after a failure, in seconds. Default 0.1.
    #[serde(default)]
    pub restart_backoff_s: Option<f64>,
    /// Type command: the longest restart delay, in seconds. Default 10.
    #[serde(default)]
    pub max_restart_backoff_s: Option<f64>,
    /// Type http: the endpoint every request is POSTed to. Required for http.
    #[serde(default)]
    pub url: Option<String>,
    /// Type http: an environment variable holding a bearer token. Default
    /// none (no `Authorization` header).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// The limit on one step (and on asking a plug-in for its tools or
    /// ending an episode), in seconds, above 0. Default 30.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// What a fault becomes: a finite score, "skip" or "fail". Default "skip".
    #[serde(default)]
    pub on_error: OnError,
    /// The most model turns in an episode, at least 1. Default 4.
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    /// The most tokens in one model turn, at least 1. Default 256.
    #[serde(default = "default_max_turn_tokens")]
    pub max_turn_tokens: usize,
}

fn default_timeout() -> f64 {
    30.0
}

fn default_max_turns() -> usize {
    4
}

fn default_max_turn_tokens() -> usize {
    256
}

const DEFAULT_PYTHON: &str = "python3";
const DEFAULT_RESTART_BACKOFF_S: f64 = 0.1;
const DEFAULT_MAX_RESTART_BACKOFF_S: f64 = 10.0;

impl Default for EnvironmentConfig {
    fn default() -> Self {
        EnvironmentConfig {
            kind: EnvironmentKind::default(),
            tools: None,
            script: None,
            command: None,
            python: None,
            restart_backoff_s: None,
            max_restart_backoff_s: None,
            url: None,
            bearer_token_env: None,
            timeout_s: default_timeout(),
            on_error: OnError::default(),
            max_turns: default_max_turns(),
            max_turn_tokens: default_max_turn_tokens(),
        }
    }
}

/// A refused value of `key`.
fn refuse(key: &str, message: impl Into<String>) -> Error {
    Error::Config {
        key: key.to_string(),
        message: message.into(),
    }
}

/// `path` resolved against `base_dir` when relative.
fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

/// A program name: resolved against `base_dir` when it is a relative path
/// (has a `/`), else left for the `PATH` search.
fn program(base_dir: &Path, name: &str) -> String {
    if name.contains('/') {
        resolve(base_dir, Path::new(name)).display().to_string()
    } else {
        name.to_string()
    }
}

/// The last component of `path`, for names.
fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |name| name.to_string_lossy().into_owned())
}

impl EnvironmentConfig {
    /// The `[environment]` table of a run config's TOML text (other tables
    /// are left to their own loaders); `None` when there is none.
    pub fn from_toml_str(text: &str) -> Result<Option<EnvironmentConfig>, Error> {
        #[derive(Deserialize)]
        struct RunConfig {
            environment: Option<EnvironmentConfig>,
        }
        toml::from_str::<RunConfig>(text)
            .map(|run| run.environment)
            .map_err(|e| Error::Parse(e.to_string()))
    }

    /// Checks every key and builds the environment under its fault
    /// policy; relative paths are resolved against `base_dir` (the config
    /// file's folder). A plug-in is asked for its tools here: an error then
    /// is [`Error::Start`], naming the environment.
    pub fn build(&self, base_dir: &Path) -> Result<GuardedEnvironment, Error> {
        self.check_keys_of_type()?;
        let timeout = duration(self.timeout_s)
            .filter(|_| self.timeout_s > 0.0)
            .ok_or_else(|| {
                refuse(
                    "timeout_s",
                    format!(
                        "{} is not a number of seconds above 0 and at most {MAX_SECONDS}",
                        self.timeout_s
                    ),
                )
            })?;
        if let OnError::Score(score) = self.on_error
            && !score.is_finite()
        {
            return Err(refuse(
                "on_error",
                format!("{score} is not a finite score: give one, \"skip\" or \"fail\""),
            ));
        }
        for (key, value) in [("max_turns", self.max_turns), ("max_turn_tokens", self.max_turn_tokens)] {
            if value == 0 {
                return Err(refuse(key, "must be at least 1"));
            }
        }
        let environment: Box<dyn Environment> = match self.kind {
            EnvironmentKind::Tools => Box::new(self.tool_environment()?),
            EnvironmentKind::Guess => Box::new(GuessEnvironment::new()),
            EnvironmentKind::Command => {
                let spec = self.command_spec(base_dir, timeout)?;
                let name = spec.name.clone();
                Box::new(CommandEnvironment::start(spec).map_err(|cause| Error::Start {
                    environment: name,
                    cause,
                })?)
            }
            EnvironmentKind::Http => Box::new(self.http_environment(timeout)?),
        };
        Ok(GuardedEnvironment::new(environment, timeout, self.on_error))
    }

    /// Refuses keys that belong to another type.
    fn check_keys_of_type(&self) -> Result<(), Error> {
        use EnvironmentKind::{Command, Http, Tools};
        for (key, given, owner) in [
            ("tools", self.tools.is_some(), Tools),
            ("script", self.script.is_some(), Command),
            ("command", self.command.is_some(), Command),
            ("python", self.python.is_some(), Command),
            ("restart_backoff_s", self.restart_backoff_s.is_some(), Command),
            ("max_restart_backoff_s", self.max_restart_backoff_s.is_some(), Command),
            ("url", self.url.is_some(), Http),
            ("bearer_token_env", self.bearer_token_env.is_some(), Http),
        ] {
            if given && self.kind != owner {
                return Err(refuse(
                    key,
                    format!(
                        "only type = \"{}\" takes it, and this environment's type is \"{}\": remove the key or change `type`",
                        owner.as_str(),
                        self.kind.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn tool_environment(&self) -> Result<ToolEnvironment, Error> {
        let default = BUILT_IN_TOOLS.map(String::from).to_vec();
        let names = self.tools.as_ref().unwrap_or(&default);
        if names.is_empty() {
            return Err(refuse(
                "tools",
                format!(
                    "no tools: name at least one of {} (or use another type)",
                    BUILT_IN_TOOLS.join(", ")
                ),
            ));
        }
        let mut toolbox = Toolbox::new();
        for name in names {
            toolbox = match name.as_str() {
                "calculate" => toolbox.with(Calculate::new()),
                unknown => {
                    return Err(refuse(
                        "tools",
                        format!(
                            "there is no built-in tool `{unknown}`; the built-in tools are: {}",
                            BUILT_IN_TOOLS.join(", ")
                        ),
                    ));
                }
            }
            .map_err(|e| refuse("tools", e))?;
        }
        Ok(ToolEnvironment::new(toolbox))
    }

    fn command_spec(&self, base_dir: &Path, timeout: Duration) -> Result<CommandSpec, Error> {
        let (name, argv) = match (&self.script, &self.command) {
            (Some(script), None) => {
                let path = resolve(base_dir, script);
                if !path.is_file() {
                    return Err(refuse(
                        "script",
                        format!(
                            "there is no file {} (relative paths start at the config's folder)",
                            path.display()
                        ),
                    ));
                }
                let python = self.python.as_deref().unwrap_or(DEFAULT_PYTHON);
                if python.is_empty() {
                    return Err(refuse("python", "is empty: name the interpreter, e.g. \"python3\""));
                }
                let path = path.display().to_string();
                let argv = vec![
                    program(base_dir, python),
                    "-c".into(),
                    PYTHON_HELPER.into(),
                    path.clone(),
                ];
                (file_name(&path), argv)
            }
            (None, Some(command)) => {
                let Some(first) = command.first().filter(|p| !p.is_empty()) else {
                    return Err(refuse(
                        "command",
                        "give the program and its arguments, e.g. [\"./my_env\"]",
                    ));
                };
                if self.python.is_some() {
                    return Err(refuse(
                        "python",
                        "only `script` uses it: put the interpreter in `command`",
                    ));
                }
                let mut argv = command.clone();
                argv[0] = program(base_dir, first);
                (file_name(first), argv)
            }
            _ => {
                return Err(refuse(
                    "script",
                    "type = \"command\" needs exactly one of `script` (a Python file) and `command` (a program)",
                ));
            }
        };
        let seconds = |key: &str, value: Option<f64>, default: f64| {
            let value = value.unwrap_or(default);
            duration(value).ok_or_else(|| {
                refuse(
                    key,
                    format!("{value} is not a number of seconds from 0 to {MAX_SECONDS}"),
                )
            })
        };
        let restart_backoff = seconds("restart_backoff_s", self.restart_backoff_s, DEFAULT_RESTART_BACKOFF_S)?;
        let max_restart_backoff = seconds(
            "max_restart_backoff_s",
            self.max_restart_backoff_s,
            DEFAULT_MAX_RESTART_BACKOFF_S,
        )?;
        if restart_backoff > max_restart_backoff {
            return Err(refuse(
                "max_restart_backoff_s",
                format!(
                    "{} s is below restart_backoff_s ({} s): raise it",
                    max_restart_backoff.as_secs_f64(),
                    restart_backoff.as_secs_f64()
                ),
            ));
        }
        Ok(CommandSpec {
            name,
            argv,
            restart_backoff,
            max_restart_backoff,
            timeout,
        })
    }

    fn http_environment(&self, timeout: Duration) -> Result<HttpEnvironment, Error> {
        let Some(url) = &self.url else {
            return Err(refuse("url", "type = \"http\" needs the endpoint's URL"));
        };
        match reqwest::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
            Ok(_) => return Err(refuse("url", format!("{url:?} is not an http:// or https:// URL"))),
            Err(e) => return Err(refuse("url", format!("{url:?} is not a URL ({e})"))),
        }
        let token = match &self.bearer_token_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                refuse(
                    "bearer_token_env",
                    format!("the environment variable {var} is not set: set it to the token"),
                )
            })?),
            None => None,
        };
        HttpEnvironment::start(url, token, timeout).map_err(|cause| Error::Start {
            environment: url.clone(),
            cause,
        })
    }
}
