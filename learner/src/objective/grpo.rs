//! The GRPO objective: the clipped policy loss of [`crate::loss`] over one
//! micro-batch of sampled completions.
//!
//! A micro-batch is `R` rows of `P + K·C` tokens: the prompt right-aligned
//! in the first `P` (left padding), then `K` completion slots of `C`
//! columns (right padding), each a sample of that prompt (`K` = 1: one
//! sample a row; `K` > 1: the samples of a group share one copy of their
//! prompt, see [`Decoder::shared_prompt_logprobs`]). Only completion tokens
//! reach the output head. With `N = R·K` samples, its inputs, in order:
//! `ids [R,P+K·C] s32`, `attention [R,P+K·C] pred` (real tokens),
//! `completion [N,C] f32` (1 where column `j` is a completion token of a
//! scored sample), `behaviour [N,C] f32` (the rollout engine's log-probs
//! of those tokens), `advantages [N] f32`, `normalizer [] f32`; then
//! `old [N,C]` unless the batch is used once (on-policy: the old log-probs
//! are the policy's own, gradient stopped) and `reference [N,C]` when β > 0.
//!
//! With several micro-batches the step averages gradients, so each
//! micro-batch's normalizer is the batch's divided by their count
//! ([`crate::batch::StepBatch::micro_normalizer`]); the sum then equals the
//! whole batch's loss. Its metrics, summed over micro-batches: low-clipped
//! tokens, high-clipped tokens, KL sum, entropy sum, the sum of
//! `|old − behaviour|` log-probs (divide by completion tokens).

use grpo_model::decoder::Decoder;
use grpo_xla::trace::Tensor;
use grpo_xla::{ElementType, TensorType};

use crate::batch::MicroBatchShape;
use crate::completion_logprobs::completion_logprobs;
use crate::loss::{GrpoLoss, LossInputs, grpo_loss};
use crate::objective::{MicroLoss, Objective};

/// Whether the step's old log-probs come in as an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldLogprobs {
    /// The batch is used once: the policy's own log-probs, gradient stopped.
    OnPolicy,
    /// Computed before the first of several passes and passed in.
    Input,
}

/// The GRPO loss with its settings.
#[derive(Debug, Clone, Copy)]
pub struct GrpoObjective {
    /// The loss (with the rollouts' sampling temperature).
    pub loss: GrpoLoss,
    /// Where the old log-probs come from.
    pub old: OldLogprobs,
}

impl GrpoObjective {
    /// How many metrics [`Objective::loss`] returns (see the module's docs).
    pub const METRICS: usize = 5;

    /// The loss of `loss`'s settings over batches used `iterations` times
    /// (more than once: the old log-probs are an input).
    pub fn new(loss: GrpoLoss, iterations: usize) -> GrpoObjective {
        let old = if iterations > 1 {
            OldLogprobs::Input
        } else {
            OldLogprobs::OnPolicy
        };
        GrpoObjective { loss, old }
    }
}

impl Objective for GrpoObjective {
    fn batch_types(&self, shape: MicroBatchShape) -> Vec<TensorType> {
        let (r, t) = (shape.rows as i64, shape.tokens() as i64);
        let (n, c) = (shape.samples() as i64, shape.completion_tokens as i64);
        let per_completion = TensorType::new(ElementType::F32, [n, c]);
        let mut types = vec![
            TensorType::new(ElementType::S32, [r, t]),
            TensorType::new(ElementType::Pred, [r, t]),
            per_completion.clone(),
            per_completion.clone(),
            TensorType::new(ElementType::F32, [n]),
            TensorType::new(ElementType::F32, []),
        ];
        if self.old == OldLogprobs::Input {
            types.push(per_completion.clone());
        }
        if self.loss.beta > 0.0 {
            types.push(per_completion);
        }
        types
    }

    fn loss(&self, decoder: &Decoder, params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<MicroLoss> {
        let to_xla = |e: crate::Error| match e {
            crate::Error::Xla(e) => e,
            other => grpo_xla::Error::Trace {
                op: "grpo_loss",
                message: other.to_string(),
            },
        };
        let (ids, attention, completion, behaviour, advantages, normalizer) =
            (&batch[0], &batch[1], &batch[2], &batch[3], &batch[4], &batch[5]);
        let temperature = f64::from(self.loss.temperature);
        // The slots a row: the samples (completion mask rows) over the token rows.
        let slots = completion.dims()[0] / ids.dims()[0].max(1);
        let layout = (slots, completion.dims()[1]);
        let scores = completion_logprobs(decoder, params, (ids, attention), layout, temperature)?;
        let (logprobs, entropy) = (scores.logprobs, scores.entropy);
        let mut extra = batch[6..].iter();
        let old_logprobs = match self.old {
            OldLogprobs::OnPolicy => logprobs.stop_gradient()?,
            OldLogprobs::Input => extra.next().cloned().ok_or_else(|| grpo_xla::Error::Trace {
                op: "grpo_loss",
                message: "the batch has no old log-probs (see batch_types)".to_string(),
            })?,
        };
        let reference = if self.loss.beta > 0.0 { extra.next() } else { None };
        let inputs = LossInputs {
            logprobs: &logprobs,
            old_logprobs: &old_logprobs,
            behaviour_logprobs: Some(behaviour),
            ref_logprobs: reference,
            advantages,
            mask: completion,
            normalizer,
        };
        let out = grpo_loss(&inputs, &self.loss).map_err(to_xla)?;
        let entropy_sum = entropy.mul(completion)?.sum_all()?.stop_gradient()?;
        let metrics: [Tensor; Self::METRICS] = [
            out.low_clipped,
            out.high_clipped,
            out.kl,
            entropy_sum,
            out.logp_difference,
        ];
        Ok(MicroLoss {
            loss: out.loss,
            metrics: metrics.into(),
            balance: scores.balance,
        })
    }
}
