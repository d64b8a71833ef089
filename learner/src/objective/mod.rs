//! What the learner trains toward. An [`Objective`] names the input
//! tensors of one micro-batch and traces its loss over them; the
//! [`crate::learner::Learner`] turns that into the whole train step
//! (forward, loss, backward, clipping, AdamW; accumulated over
//! micro-batches when a batch has several; on one device or partitioned)
//! and owns everything else: weights, optimizer state, the compiled-step
//! cache, checkpoints and host copies.
//!
//! - [`grpo::GrpoObjective`]: the clipped GRPO policy loss over sampled
//!   completions and their advantages.
//! - [`sft::SftObjective`]: the mean NLL of completion tokens.
//!
//! Adding a third (DPO, reward-model training, …) takes one file for the
//! objective and one for its task, plus its config section:
//! - `objective/dpo.rs`: its micro-batch inputs and traced loss as an
//!   [`Objective`] (as [`sft::SftObjective`] is);
//! - `dpo.rs`: the [`crate::trainer::Task`] that makes its batches each
//!   step and evaluates (as [`crate::sft::SftTask`] packs prompt/completion
//!   pairs), and its `Trainer::dpo` constructor;
//! - `config/dpo.rs`: its [`crate::config::ConfigFile`];
//! - `Run::dpo` in [`crate::run`], built like `Run::sft` (the model or the
//!   checkpoint, the data, the mesh, then `Run::assemble`);
//! - the CLI: a subcommand that parses the config and calls `train(Run::dpo(…)?)`.
//!
//! The learner, checkpoints and `--resume`, SPMD, the hooks and the metrics
//! log come with it.

pub mod grpo;
pub mod sft;

use grpo_model::decoder::Decoder;
use grpo_xla::TensorType;
use grpo_xla::trace::Tensor;

use crate::batch::MicroBatchShape;

/// One micro-batch's traced loss.
pub struct MicroLoss {
    /// The scalar whose gradient the step takes.
    pub loss: Tensor,
    /// Scalar metrics (gradient stopped, summed over a batch's micro-batches).
    pub metrics: Vec<Tensor>,
    /// The forward's load-balancing loss of a model with sparse layers
    /// ([`grpo_model::decoder::TokenScores::balance`]): the learner adds it
    /// with the run's coefficient.
    pub balance: Option<Tensor>,
}

/// A loss over micro-batches of token rows, traced into the learner's train step.
pub trait Objective {
    /// The types of one micro-batch's inputs, in the order [`Objective::loss`]
    /// receives them.
    fn batch_types(&self, shape: MicroBatchShape) -> Vec<TensorType>;

    /// Traces the loss of one micro-batch over `params` in the decoder's
    /// order and the compute dtype.
    fn loss(&self, decoder: &Decoder, params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<MicroLoss>;
}
