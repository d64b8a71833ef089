//! The SFT objective, TRL `SFTTrainer`'s completion-only loss: over a
//! batch of prompt/completion pairs, the mean negative log-likelihood of
//! the completion tokens,
//!
//! `loss = −Σ_b Σ_j m_bj · log π(y_bj | x_b, y_b<j) / Σ_b Σ_j m_bj`,
//!
//! where `m_bj` is 1 on completion tokens (the completion text's tokens and
//! the EOS token appended after them, as TRL appends it) and 0 on prompt and
//! padding positions. Rows are laid out as [`crate::batch`] packs them
//! (prompt right-aligned in `P` columns, the completion in the last `C`,
//! one sample a row); with several micro-batches each one's normalizer is
//! the batch's token count divided by their number, so the accumulated
//! update equals the whole batch's.
//!
//! Inputs, in order: `ids [B,P+C] s32`, `attention [B,P+C] pred`,
//! `completion [B,C] f32`, `normalizer [] f32`. Its one metric is the NLL
//! sum (gradient stopped).

use grpo_model::decoder::Decoder;
use grpo_xla::trace::Tensor;
use grpo_xla::{ElementType, TensorType};

use crate::batch::MicroBatchShape;
use crate::objective::{MicroLoss, Objective};

/// The mean completion NLL.
#[derive(Debug, Clone, Copy, Default)]
pub struct SftObjective;

impl Objective for SftObjective {
    fn batch_types(&self, shape: MicroBatchShape) -> Vec<TensorType> {
        let (b, t, c) = (shape.rows as i64, shape.tokens() as i64, shape.completion_tokens as i64);
        vec![
            TensorType::new(ElementType::S32, [b, t]),
            TensorType::new(ElementType::Pred, [b, t]),
            TensorType::new(ElementType::F32, [b, c]),
            TensorType::new(ElementType::F32, []),
        ]
    }

    fn loss(&self, decoder: &Decoder, params: &[Tensor], batch: &[Tensor]) -> grpo_xla::Result<MicroLoss> {
        let (ids, attention, completion, normalizer) = (&batch[0], &batch[1], &batch[2], &batch[3]);
        let scores = decoder.token_logprobs(params, ids, attention, completion.dims()[1], 1.0)?;
        let nll = scores.logprobs.mul(completion)?.sum_all()?.neg()?;
        Ok(MicroLoss {
            loss: nll.div(normalizer)?,
            metrics: vec![nll.stop_gradient()?],
            balance: scores.balance,
        })
    }
}
