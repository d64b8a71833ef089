//! grpo-env: multi-turn episodes.
//!
//! - [`toolbox`]: the tools on offer in an episode, and the tool turns that
//!   answer an assistant turn's calls (results, or errors the model reads).
//! - [`calculate`]: the built-in `calculate` tool: exact arithmetic on the
//!   reward crate's expression parser.

#![warn(missing_docs)]

pub mod calculate;
pub mod toolbox;
