//! grpo-env: multi-turn episodes.
//!
//! - [`environment`]: the [`environment::Environment`] trait — what
//!   answers a model's turns (messages it reads next, or the episode's
//!   end and reward) — and the built-in tool-calling environment.
//! - [`toolbox`]: the tools on offer in an episode, and the tool turns that
//!   answer an assistant turn's calls (results, or errors the model reads).
//! - [`calculate`]: the built-in `calculate` tool: exact arithmetic on the
//!   reward crate's expression parser.

#![warn(missing_docs)]

pub mod calculate;
pub mod environment;
pub mod toolbox;
