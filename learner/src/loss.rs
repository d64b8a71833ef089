//! The GRPO policy loss, traced (TRL's `GRPOTrainer` and verl's formulas).
//!
//! Per completion token, with `ℓ` the policy's log-prob, `ℓ_old` the
//! log-prob under the policy that produced the batch (the same values,
//! gradient stopped, when each batch is used once), `A` the sample's
//! advantage and `r = exp(ℓ − ℓ_old)`:
//!
//! `loss_t = −min(r·A, clip(r, 1 − ε, 1 + ε_high)·A) + β·KL_t`,
//! `KL_t = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1` (the k3 estimator; only when
//! β ≠ 0), then multiplied by the importance weight `w_t` that corrects for
//! the rollout engine's numerics differing from the learner's (`ℓ_beh` are
//! the engine's log-probs):
//! - [`Importance::Token`]: `w_t = min(exp(ℓ_old − ℓ_beh), cap)` (truncated IS);
//! - [`Importance::Sequence`]: `w_t = 1` if `|Σ_t (ℓ_old − ℓ_beh)| ≤ ln cap`
//!   for the whole sequence, else 0 (the sequence is masked out).
//!
//! The loss is `Σ_{b,t} m_{b,t} · n_b · loss_{b,t} / N`, `m` the completion
//! mask; [`LossType`] sets the per-sequence factor `n_b` and the normalizer
//! `N`, which is a program input so that micro-batches of one batch add up
//! to exactly the full batch's loss and gradient:
//! - DAPO: `n_b = 1`, `N` = completion tokens in the batch (token mean);
//! - GRPO: `n_b = 1 / |sequence b|`, `N` = sequences in the batch;
//! - Dr. GRPO: `n_b = 1`, `N` = sequences · max completion length;
//! - BNPO: `n_b = 1`, a token mean within each micro-batch (TRL's "local
//!   batch"), averaged over the micro-batches: micro-batch `i`'s `N` is its
//!   own completion tokens (see [`crate::batch::StepBatch::micro_normalizer`]).

use grpo_xla::trace::Tensor;

use crate::error::{Error, Result};

/// How token losses are summed and normalized (TRL's `loss_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    /// Token mean over the whole batch. The default.
    #[default]
    Dapo,
    /// Mean over each sequence's tokens, then over sequences.
    Grpo,
    /// Sum over tokens divided by sequences × the maximum completion length.
    DrGrpo,
    /// Token mean within each micro-batch, averaged over the micro-batches.
    Bnpo,
}

impl LossType {
    /// The normalizer `N` of a batch: `tokens` completion tokens in
    /// `sequences` sequences, completions of at most `max_completion_len`.
    pub fn normalizer(self, tokens: usize, sequences: usize, max_completion_len: usize) -> f32 {
        let n = match self {
            LossType::Dapo | LossType::Bnpo => tokens,
            LossType::Grpo => sequences,
            LossType::DrGrpo => sequences * max_completion_len,
        };
        n.max(1) as f32
    }
}

/// The correction for rollout/learner mismatch, from the behaviour log-probs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Importance {
    /// None: the batch is taken as on-policy.
    Off,
    /// Token-level truncated importance sampling, weights capped at `cap`.
    Token {
        /// The largest weight (TRL's default 2.0).
        cap: f32,
    },
    /// Sequence-level masking: sequences whose ratio leaves `[1/cap, cap]` are dropped.
    Sequence {
        /// The bound of the sequence ratio.
        cap: f32,
    },
}

/// The loss's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrpoLoss {
    /// Normalization. Default DAPO.
    pub loss_type: LossType,
    /// Lower clip range ε. Default 0.2.
    pub epsilon: f32,
    /// Upper clip range (DAPO's clip-higher: 0.28). Default 0.2.
    pub epsilon_high: f32,
    /// Weight of the k3 KL to the reference policy. Default 0 (no reference).
    pub beta: f32,
    /// Rollout/learner mismatch correction. Default token-level, cap 2.
    pub importance: Importance,
    /// The rollouts' sampling temperature, at which the learner scores
    /// them: its log-probs and entropies are those of the logits divided
    /// by it (TRL's and verl's semantics; the engine returns behaviour
    /// log-probs at the same temperature). Default 1.
    pub temperature: f32,
}

impl Default for GrpoLoss {
    fn default() -> Self {
        GrpoLoss {
            loss_type: LossType::Dapo,
            epsilon: 0.2,
            epsilon_high: 0.2,
            beta: 0.0,
            importance: Importance::Token { cap: 2.0 },
            temperature: 1.0,
        }
    }
}

/// The tensors of one (micro-)batch; `[B, T]` f32 unless said otherwise.
pub struct LossInputs<'a> {
    /// The policy's log-probs of the completion tokens (differentiated).
    pub logprobs: &'a Tensor,
    /// The log-probs of the policy that produced the batch (constants).
    pub old_logprobs: &'a Tensor,
    /// The rollout engine's log-probs (used by [`Importance`]).
    pub behaviour_logprobs: Option<&'a Tensor>,
    /// The reference policy's log-probs (needed when β ≠ 0).
    pub ref_logprobs: Option<&'a Tensor>,
    /// One advantage per sequence, `[B]`.
    pub advantages: &'a Tensor,
    /// 1 on the completion tokens that count, 0 elsewhere.
    pub mask: &'a Tensor,
    /// `N` of [`LossType::normalizer`], a scalar.
    pub normalizer: &'a Tensor,
}

/// The loss and its statistics (scalars; the counts are sums over the
/// masked tokens, to be divided by the batch's token count).
pub struct LossOutputs {
    /// The loss to differentiate.
    pub loss: Tensor,
    /// Tokens whose ratio was clipped from below with `A < 0` (TRL's `clip_ratio/low`).
    pub low_clipped: Tensor,
    /// Tokens whose ratio was clipped from above with `A > 0` (TRL's `clip_ratio/high`).
    pub high_clipped: Tensor,
    /// Sum of the per-token KL (0 without a reference).
    pub kl: Tensor,
    /// Sum of `|old − behaviour|` log-probs over the tokens: how far the
    /// rollout engine's log-probs are from the learner's (0 without them).
    pub logp_difference: Tensor,
}

/// The GRPO loss of `inputs` under `settings` (see the module's formulas).
pub fn grpo_loss(inputs: &LossInputs<'_>, settings: &GrpoLoss) -> Result<LossOutputs> {
    let lp = inputs.logprobs;
    let (b, t) = (lp.dims()[0], lp.dims()[1]);
    let mask = inputs.mask;
    let advantage = inputs.advantages.reshape(&[b, 1])?.broadcast_to(&[b, t])?;
    let ratio = lp.sub(inputs.old_logprobs)?.exp()?;
    let low = 1.0 - f64::from(settings.epsilon);
    let high = 1.0 + f64::from(settings.epsilon_high);
    let clipped = ratio
        .maximum(&ratio.full_like(low)?)?
        .minimum(&ratio.full_like(high)?)?;
    let mut token_loss = ratio.mul(&advantage)?.minimum(&clipped.mul(&advantage)?)?.neg()?;
    let zero = ratio.zeros_like()?;
    let kl = match (settings.beta, inputs.ref_logprobs) {
        (0.0, _) => zero.clone(),
        (beta, Some(reference)) => {
            let d = reference.sub(lp)?;
            let kl = d.exp()?.sub(&d)?.add_scalar(-1.0)?;
            token_loss = token_loss.add(&kl.mul_scalar(f64::from(beta))?)?;
            kl
        }
        (_, None) => {
            return Err(Error::Config {
                field: "beta",
                message: "a KL term (beta > 0) needs the reference policy's log-probs".to_string(),
            });
        }
    };
    let weight = importance_weights(inputs, settings.importance)?;
    let weighted_mask = match &weight {
        Some(w) => mask.mul(w)?,
        None => mask.clone(),
    };
    let per_sequence = match settings.loss_type {
        LossType::Grpo => {
            let length = mask.sum(&[1])?.maximum(&inputs.advantages.ones_like()?)?;
            weighted_mask.div(&length.reshape(&[b, 1])?.broadcast_to(&[b, t])?)?
        }
        LossType::Dapo | LossType::DrGrpo | LossType::Bnpo => weighted_mask,
    };
    let loss = token_loss.mul(&per_sequence)?.sum_all()?.div(inputs.normalizer)?;
    let counted = |condition: Tensor| -> Result<Tensor> { Ok(condition.select(mask, &zero)?.sum_all()?) };
    // Sums `values` over the masked tokens.
    let summed = |values: Tensor| -> Result<Tensor> { Ok(mask.gt(&zero)?.select(&values, &zero)?.sum_all()?) };
    let low_clipped = counted(ratio.lt(&ratio.full_like(low)?)?.and(&advantage.lt(&zero)?)?)?;
    let high_clipped = counted(ratio.gt(&ratio.full_like(high)?)?.and(&advantage.gt(&zero)?)?)?;
    let logp_difference = match inputs.behaviour_logprobs {
        Some(behaviour) => summed(inputs.old_logprobs.sub(behaviour)?.abs()?)?,
        None => zero.sum_all()?,
    };
    Ok(LossOutputs {
        loss,
        low_clipped,
        high_clipped,
        kl: kl.mul(mask)?.sum_all()?.stop_gradient()?,
        logp_difference: logp_difference.stop_gradient()?,
    })
}

/// The importance weights `[B, T]` of [`Importance`] (constants), if any.
fn importance_weights(inputs: &LossInputs<'_>, importance: Importance) -> Result<Option<Tensor>> {
    let (cap, per_sequence) = match importance {
        Importance::Off => return Ok(None),
        Importance::Token { cap } => (f64::from(cap), false),
        Importance::Sequence { cap } => (f64::from(cap), true),
    };
    let behaviour = inputs.behaviour_logprobs.ok_or_else(|| Error::Config {
        field: "importance",
        message: "importance correction needs the rollout engine's log-probs".to_string(),
    })?;
    let log_ratio = inputs.old_logprobs.sub(behaviour)?.stop_gradient()?;
    let (b, t) = (log_ratio.dims()[0], log_ratio.dims()[1]);
    if !per_sequence {
        return Ok(Some(log_ratio.exp()?.minimum(&log_ratio.full_like(cap)?)?));
    }
    let total = log_ratio.mul(inputs.mask)?.sum(&[1])?.abs()?;
    let kept = total.le(&total.full_like(cap.ln())?)?;
    let weights = kept.select(&total.ones_like()?, &total.zeros_like()?)?;
    Ok(Some(weights.reshape(&[b, 1])?.broadcast_to(&[b, t])?))
}
