//! grpo-rollout: generation for GRPO rollouts and serving.
//!
//! So far: [`sampling`], the traced token sampler (greedy, temperature,
//! top-k, top-p, min-p, per-request seeds) returning each token's log-prob
//! under the unmodified policy. The engine (KV cache, continuous batching,
//! weight updates) and the worker service build on it.

#![warn(missing_docs)]

pub mod sampling;
