//! grpo-learner: the learning side of grpo, and whole runs composed from
//! their configs.
//!
//! The run and its loop:
//! - [`run`]: `Run::grpo` / `Run::sft` build a run from its config (model
//!   or checkpoint, data, fleet, learner mesh); `Run::train` runs its steps
//!   with hooks around them.
//! - [`hooks`]: evaluation, the metrics and rollout logs, checkpoints, the
//!   final folder and the plot, as callbacks of the loop.
//! - [`trainer`]: one [`trainer::Trainer`] for every objective: a learner,
//!   the [`trainer::Task`] that feeds it, the step counter, checkpoints.
//! - [`learner`]: the policy's weights and AdamW state on a device mesh,
//!   the compiled train steps of its objective, host copies.
//! - [`objective`]: what the learner trains toward — the GRPO loss, SFT's
//!   completion NLL — as traced losses over micro-batches.
//!
//! Tasks (what feeds the learner each step):
//! - [`grpo`]: rollouts on the fleet → rewards → group advantages → the
//!   GRPO step → new weights to the fleet.
//! - [`sft`]: seeded batches of prompt/completion pairs (multi-turn
//!   completions with loss on the assistant's turns), the eval loss.
//!
//! Their parts:
//! - [`advantage`]: group-relative advantages from rewards (scaled by the
//!   group's std, the batch's, or not at all) and dynamic-sampling filters.
//! - [`loss`]: the GRPO policy loss as traced code — clipped ratios with
//!   separate low/high epsilons, optional k3 KL to a reference, importance
//!   correction for rollout/learner mismatch, and the DAPO / GRPO /
//!   Dr. GRPO normalizations — with its clip and KL statistics.
//! - [`batch`]: scored rollouts packed into micro-batches of one token
//!   bucket, with the batch's loss normalizer.
//! - [`completion_logprobs`]: completion log-probs under given weights (the
//!   old policy of μ > 1 passes, the KL's frozen reference).
//! - [`collect`]: rows → prompts (chat through the template) → the
//!   engine's completions → rewards; shared by training and evaluation.
//! - [`rollouts`]: the loop's rollout side (draw, generate, score), inline
//!   or on a thread that runs up to `max_staleness` steps ahead.
//! - [`fleet`]: where rollouts come from — the in-process engine (weights
//!   in memory) or rollout workers over gRPC (weights pushed in chunks).
//! - [`episode`]: multi-turn episodes — the model's turns, an
//!   environment's answers, appended as token ids with a loss mask.
//! - [`conversation`]: a chat rendered turn by turn, each turn's ids
//!   appended (several turns trained at once, loss on the assistant's).
//! - [`data`]: prompts from JSONL (text or chat), an eval split, a seeded
//!   resumable sampler over epochs.
//! - [`schedule`]: learning-rate schedules (constant, linear, cosine; warm-up).
//! - [`config`]: the run configs of `grpo run` and `grpo sft` (TOML
//!   sections, documented defaults, unknown keys and bad values refused
//!   naming them).
//! - [`checkpoint`]: atomic checkpoint folders (HF folder, optimizer state,
//!   loop state) and finding the newest for resume.
//! - [`record`]: the rollout log, `OUT/rollouts.parquet` — a Parquet
//!   dataset folder of one atomically written part per step, truncated
//!   on resume.
//! - [`metrics`]: TRL's completion-length and per-reward statistics, and
//!   the metric names grpo used before it took TRL's.
//! - [`plot`]: a PNG of training reward and eval accuracy by step from
//!   `OUT/metrics.jsonl`, with an embedded font.
//! - [`tracking`]: reports beyond the metrics log at TRL's cadence
//!   (TensorBoard through [`tensorboard`], completions tables), and the
//!   run's Prometheus page ([`prometheus`]).

#![warn(missing_docs)]

pub mod advantage;
pub mod batch;
pub mod checkpoint;
pub mod choices;
pub mod collect;
pub mod completion_logprobs;
pub mod config;
pub mod conversation;
pub mod data;
pub mod dataset;
mod engine_copy;
pub mod episode;
mod error;
mod files;
pub mod fleet;
pub mod grpo;
pub mod hooks;
pub mod learner;
pub mod loss;
pub mod metrics;
pub mod objective;
pub mod plot;
pub mod probe;
pub mod prometheus;
pub mod record;
pub mod rollouts;
pub mod run;
pub mod schedule;
pub mod sft;
pub mod tensorboard;
pub mod tracking;
pub mod trainer;

pub use error::{Error, Result};
