//! grpo-rollout: generation for GRPO rollouts and serving.
//!
//! - [`sampling`]: the traced token sampler (greedy, temperature, top-k,
//!   top-p, min-p, per-request seeds) returning each token's log-prob under
//!   the unmodified policy.
//! - [`engine`]: continuous-batching generation over a per-slot KV cache on
//!   the device (prefix sharing and live weight updates come next).

#![warn(missing_docs)]

pub mod engine;
mod error;
pub mod sampling;

pub use error::{Error, Result};
