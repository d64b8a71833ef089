//! grpo-env: multi-turn episodes.
//!
//! - [`environment`]: the [`environment::Environment`] trait — what
//!   answers a model's turns (messages it reads next, or the episode's
//!   end and reward) — and the built-in tool-calling environment.
//! - [`toolbox`]: the tools on offer in an episode, and the tool turns that
//!   answer an assistant turn's calls (results, or errors the model reads).
//! - [`calculate`]: the built-in `calculate` tool: exact arithmetic on the
//!   reward crate's expression parser.
//! - [`guess`]: the built-in number-guessing environment.
//! - [`plugin`]: environments outside the process — a subprocess speaking
//!   JSON lines, or an HTTP endpoint — and their protocol.
//! - [`guard`]: the fault policy (timeout, `on_error`) around any
//!   environment, and its fault counters.
//! - [`config`]: the `[environment]` table into a guarded environment.

#![warn(missing_docs)]

pub mod calculate;
pub mod config;
pub mod environment;
pub mod guard;
pub mod guess;
pub mod plugin;
pub mod toolbox;

use crate::environment::EnvironmentError;

/// Everything that can go wrong building an environment or under its
/// `on_error = "fail"` policy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `[environment]` table does not parse (an unknown key, a value of the wrong type).
    #[error("[environment]: {0}")]
    Parse(String),
    /// An `[environment]` key has a value that cannot be used.
    #[error("[environment] {key}: {message}")]
    Config {
        /// The key.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A plug-in environment could not start (it did not list its tools).
    #[error("environment {environment} did not start: {cause}")]
    Start {
        /// The environment's name.
        environment: String,
        /// What went wrong.
        cause: EnvironmentError,
    },
    /// A fault under `on_error = "fail"`: the run stops.
    #[error("environment {environment} failed on episode {episode}: {cause}")]
    Failed {
        /// The environment's name.
        environment: String,
        /// The episode's id.
        episode: u64,
        /// What went wrong.
        cause: EnvironmentError,
    },
}
