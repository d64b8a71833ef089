//! grpo-reward: reward functions for GRPO.
//!
//! - [`sample`]: what a reward sees per sample (prompt text and messages,
//!   completion text and token ids, group id, the dataset row's other
//!   columns) and what it returns ([`Score`]: a value or `None`, plus named
//!   sub-scores).
//! - [`Reward`]: the async, batched trait every reward implements;
//!   [`SampleReward`] is the per-sample shortcut the built-ins use.
//! - [`builtin`]: `math`, `exact`, `contains`, `regex`, `format`, `length`
//!   (with DAPO overlong shaping), `countdown` and `arithmetic`.
//! - [`plugin`]: the `command` (JSON lines over a subprocess) and `http`
//!   (JSON batch POSTed to a URL) plug-ins.
//! - [`config`]: `[[reward]]` tables (standalone or inside a full run
//!   config) into a [`RewardPool`]; [`Registry`] adds Rust rewards by name.
//! - [`pool`]: the weighted composition, the per-call timeout, the
//!   `on_error` policy and the bounded pool that scores batches concurrently.
//! - [`metrics`]: per-reward fault counters.
//! - [`rational`] and [`expr`]: exact rationals and the safe arithmetic
//!   parser behind `math`, `countdown` and `arithmetic`.

#![warn(missing_docs)]

pub mod builtin;
pub mod config;
mod error;
pub mod expr;
pub mod metrics;
pub mod plugin;
pub mod pool;
pub mod rational;
pub mod sample;

pub use config::{OnError, Registry, RewardConfig, RewardsConfig};
pub use error::{Error, Result};
pub use pool::{RewardPool, Total};
pub use sample::{BoxFuture, Message, Reward, Sample, SampleReward, Score};
