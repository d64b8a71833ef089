//! grpo-rollout: generation for GRPO rollouts and serving.
//!
//! - [`request`]: what a caller asks for (prompt, `n`, sampling settings)
//!   and the checks that refuse what the engine cannot serve.
//! - [`output`]: per-step sample updates and finished completions (tokens,
//!   raw log-probs, top log-probs, policy versions, finish reasons).
//! - [`sampling`]: the traced token sampler (penalties, greedy,
//!   temperature, top-k, top-p, min-p, per-request seeds) returning each
//!   token's log-prob under the unmodified policy.
//! - [`guided`]: guided decoding (JSON schema, regex, choice, Lark
//!   grammar) with llguidance: per-sample token masks.
//! - [`adapters`]: LoRA adapters an engine serves side by side, each
//!   request picking its own.
//! - [`engine`]: continuous-batching generation over a per-slot KV cache on
//!   the device, one prefill per group, aborts, live weight updates.
//! - [`host_weights`]: new parameter values on the host (f32, or bf16 for a
//!   bf16 engine), as weight updates hand them to an engine.
//! - [`handle`]: the engine as an async service (an actor thread, a
//!   stream of updates per request, pause / resume, weight updates).
//! - [`worker`]: the rollout worker gRPC service (generation, checksummed
//!   weight updates in three phases, pause / resume, health, stats) and its
//!   client.
//! - [`detokenize`]: the incremental detokenizer streaming a sequence's text.
//! - [`stop`]: stop strings over streamed text, and the tail to hold back.

#![warn(missing_docs)]

pub mod adapters;
pub mod detokenize;
pub mod engine;
mod error;
pub mod guided;
pub mod handle;
pub mod host_weights;
mod inputs;
pub mod output;
mod programs;
pub mod request;
pub mod sampling;
pub mod stop;
mod text;

pub use error::{Error, Result};
