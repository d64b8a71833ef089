//! grpo-learner: the learning side of GRPO.
//!
//! - [`advantage`]: group-relative advantages from rewards (scaled by the
//!   group's std, the batch's, or not at all) and dynamic-sampling filters.
//! - [`loss`]: the GRPO policy loss as traced code — clipped ratios with
//!   separate low/high epsilons, optional k3 KL to a reference, importance
//!   correction for rollout/learner mismatch, and the DAPO / GRPO /
//!   Dr. GRPO normalizations — with its clip and KL statistics.
//! - [`checkpoint`]: atomic checkpoints (HF folder, optimizer state,
//!   loop state) and finding the newest for resume.
//! - [`collect`]: rows → prompts (chat through the template) → the
//!   engine's completions → rewards; shared by training and evaluation.
//! - [`completion_logprobs`]: completion log-probs under given weights (the
//!   old policy of μ > 1 passes, the KL's frozen reference).
//! - [`config`]: the run config of `grpo run` (TOML sections, documented
//!   defaults, unknown keys and bad values refused naming them).
//! - [`data`]: prompts from JSONL (text or chat), an eval split, a seeded
//!   resumable sampler over epochs.
//! - [`batch`]: scored rollouts packed into micro-batches of one token
//!   bucket, with the batch's loss normalizer.
//! - [`rollouts`]: the loop's rollout side (draw, generate, score), inline
//!   or on a thread that runs up to `max_staleness` steps ahead.
//! - [`schedule`]: learning-rate schedules (constant, linear, cosine; warm-up).
//! - [`record`]: the rollout log, `OUT/rollouts.parquet` — a Parquet
//!   dataset folder of one atomically written part per step, truncated
//!   on resume.
//! - [`plot`]: a PNG of training reward and eval accuracy by step from
//!   `OUT/metrics.jsonl`, with an embedded font.
//! - [`fleet`]: where rollouts come from — the in-process engine (weights
//!   in memory) or rollout workers over gRPC (weights pushed in chunks).
//! - [`grpo`]: one on-policy GRPO iteration in one process (engine →
//!   rewards → advantages → train step → weights back to the engine).
//! - [`sft`]: supervised fine-tuning for warm starts — TRL SFTTrainer's
//!   completion-only loss (mean NLL of completion tokens) on the trainer's
//!   machinery, its `grpo sft` config, a seeded loop and the eval loss.
//! - [`trainer`]: the GRPO train step over a decoder as one XLA program
//!   (or micro-batch gradients accumulated, then the update).

#![warn(missing_docs)]

pub mod advantage;
pub mod batch;
pub mod checkpoint;
pub mod collect;
pub mod completion_logprobs;
pub mod config;
pub mod data;
mod error;
pub mod fleet;
pub mod grpo;
pub mod loss;
pub mod placement;
pub mod plot;
pub mod record;
pub mod rollouts;
pub mod schedule;
pub mod sft;
pub mod trainer;

pub use error::{Error, Result};
