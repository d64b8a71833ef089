//! The GRPO graph trainer: per micro-batch, the policy's token log-probs,
//! the GRPO loss and its gradient are one XLA program; the global-norm
//! clipping and AdamW update follow in the same program when the batch is
//! one micro-batch, else in a third after the gradients accumulated
//! (grpo-xla's [`TrainStep`] / [`AccumulatingTrainStep`]; partitioned over
//! devices by XLA's SPMD partitioner under `[trainer] parallelism`, see
//! [`crate::placement`]).
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
//! With several micro-batches the accumulating step averages gradients, so
//! each micro-batch's normalizer is the batch's divided by their count
//! ([`micro_normalizer`]); the sum then equals the whole batch's loss.
//! The step's metrics, summed over micro-batches: low-clipped tokens,
//! high-clipped tokens, KL sum, entropy sum (divide by completion tokens).

use grpo_model::decoder::Decoder;
use grpo_xla::trace::{
    AccumulatingTrainStep, Optimizer, ShardedAccumulatingTrainStep, ShardedTrainStep, StepMetrics, Tensor, TrainStep,
    TrainStepSpec,
};
use grpo_xla::{Buffer, Client, ElementType, ShardedBuffer, TensorType};

use crate::error::Result;
use crate::loss::{GrpoLoss, LossInputs, grpo_loss};
use crate::placement::{BatchInputs, LearnerState, Placement};

/// The shape of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MicroBatchShape {
    /// Rows `R`: prompts, each with its completion slots.
    pub rows: usize,
    /// Prompt columns `P` (prompts right-aligned in them).
    pub prompt_tokens: usize,
    /// Completion slots `K` a row (samples sharing its prompt; 1: one sample a row).
    pub slots: usize,
    /// Columns `C` of each completion slot (completions left-aligned in them).
    pub completion_tokens: usize,
}

impl MicroBatchShape {
    /// Tokens per row, `P + K·C`.
    pub fn tokens(&self) -> usize {
        self.prompt_tokens + self.slots * self.completion_tokens
    }

    /// Samples, `R·K`.
    pub fn samples(&self) -> usize {
        self.rows * self.slots
    }
}

/// Log-probs and entropies `[R·K, C]` of the `slots` (`K`) completion slots
/// of `c` columns in token `ids` `[R, P + K·C]` with `attention`: one sample
/// a row through [`Decoder::token_logprobs`], shared prompts through
/// [`Decoder::shared_prompt_logprobs`].
pub fn completion_logprobs(
    decoder: &Decoder,
    params: &[Tensor],
    (ids, attention): (&Tensor, &Tensor),
    (slots, c): (i64, i64),
    temperature: f64,
) -> grpo_xla::Result<(Tensor, Tensor)> {
    if slots == 1 {
        return decoder.token_logprobs(params, ids, attention, c, temperature);
    }
    let prompt = ids.dims()[1] - slots * c;
    decoder.shared_prompt_logprobs(params, ids, attention, prompt, slots, temperature)
}

/// Whether the step's old log-probs come in as an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldLogprobs {
    /// The batch is used once: the policy's own log-probs, gradient stopped.
    OnPolicy,
    /// Computed before the first of several passes and passed in.
    Input,
}

/// The input types of a micro-batch, in order (see the module's list).
pub fn batch_types(shape: MicroBatchShape, old: OldLogprobs, with_reference: bool) -> Vec<TensorType> {
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
    if old == OldLogprobs::Input {
        types.push(per_completion.clone());
    }
    if with_reference {
        types.push(per_completion);
    }
    types
}

/// The normalizer each of `micro_batches` micro-batches gets, so that the
/// accumulating step's mean gradient is the whole batch's.
pub fn micro_normalizer(batch_normalizer: f32, micro_batches: usize) -> f32 {
    batch_normalizer / micro_batches.max(1) as f32
}

/// Traces the GRPO loss of one micro-batch and its metrics.
pub fn traced_loss(
    decoder: &Decoder,
    settings: &GrpoLoss,
    old: OldLogprobs,
    params: &[Tensor],
    batch: &[Tensor],
) -> grpo_xla::Result<(Tensor, Vec<Tensor>)> {
    let to_xla = |e: crate::Error| match e {
        crate::Error::Xla(e) => e,
        other => grpo_xla::Error::Trace {
            op: "grpo_loss",
            message: other.to_string(),
        },
    };
    let (ids, attention, completion, behaviour, advantages, normalizer) =
        (&batch[0], &batch[1], &batch[2], &batch[3], &batch[4], &batch[5]);
    let temperature = f64::from(settings.temperature);
    // The slots a row: the samples (completion mask rows) over the token rows.
    let slots = completion.dims()[0] / ids.dims()[0].max(1);
    let layout = (slots, completion.dims()[1]);
    let (logprobs, entropy) = completion_logprobs(decoder, params, (ids, attention), layout, temperature)?;
    let mut extra = batch[6..].iter();
    let old_logprobs = match old {
        OldLogprobs::OnPolicy => logprobs.stop_gradient()?,
        OldLogprobs::Input => extra.next().cloned().ok_or_else(|| grpo_xla::Error::Trace {
            op: "grpo_loss",
            message: "the batch has no old log-probs (see batch_types)".to_string(),
        })?,
    };
    let reference = if settings.beta > 0.0 { extra.next() } else { None };
    let inputs = LossInputs {
        logprobs: &logprobs,
        old_logprobs: &old_logprobs,
        behaviour_logprobs: Some(behaviour),
        ref_logprobs: reference,
        advantages,
        mask: completion,
        normalizer,
    };
    let out = grpo_loss(&inputs, settings).map_err(to_xla)?;
    let entropy_sum = entropy.mul(completion)?.sum_all()?.stop_gradient()?;
    Ok((out.loss, vec![out.low_clipped, out.high_clipped, out.kl, entropy_sum]))
}

/// How the step is compiled.
pub struct StepConfig<'a> {
    /// Parameter dtype (f32 master weights by default).
    pub dtype: ElementType,
    /// The dtype the forward and backward run in: the parameters are
    /// converted to it inside the program (bf16 with f32 master weights is
    /// mixed precision; gradients flow back through the conversion).
    pub compute: ElementType,
    /// The loss.
    pub loss: GrpoLoss,
    /// Where the old log-probs come from.
    pub old: OldLogprobs,
    /// The optimizer traced into the update.
    pub optimizer: &'a dyn Optimizer,
    /// Global gradient-norm clipping; `None` disables it.
    pub max_grad_norm: Option<f64>,
}

/// `params` converted to `dtype` where they are in another.
pub fn in_dtype(params: &[Tensor], dtype: ElementType) -> grpo_xla::Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| {
            if p.dtype() == dtype {
                Ok(p.clone())
            } else {
                p.convert(dtype)
            }
        })
        .collect()
}

/// The types of `decoder`'s parameters in `dtype`, in its order.
pub fn param_types(decoder: &Decoder, dtype: ElementType) -> Vec<TensorType> {
    decoder
        .parameters()
        .iter()
        .map(|p| TensorType::new(dtype, p.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
        .collect()
}

/// A compiled train step of any loss: one program when a batch is one
/// micro-batch, else gradient accumulation (first, accumulate, apply); on
/// one device or partitioned over the learner's [`Placement`]. The GRPO
/// step and the SFT step ([`crate::sft`]) are both one.
pub enum TrainProgram {
    /// Forward, loss, backward, clipping and the update in one program.
    Whole(TrainStep),
    /// Micro-batch gradients accumulated, then the update.
    Accumulating(AccumulatingTrainStep),
    /// [`TrainProgram::Whole`] partitioned over devices.
    ShardedWhole(ShardedTrainStep),
    /// [`TrainProgram::Accumulating`] partitioned over devices.
    ShardedAccumulating(ShardedAccumulatingTrainStep),
}

impl TrainProgram {
    /// Traces `loss` (a scalar and its metrics) and compiles the step for
    /// `micro_batches` micro-batches of `spec.batch` on `placement`.
    pub fn compile(
        client: &Client,
        spec: &TrainStepSpec<'_>,
        placement: &Placement,
        micro_batches: usize,
        loss: impl Fn(&[Tensor], &[Tensor]) -> grpo_xla::Result<(Tensor, Vec<Tensor>)>,
    ) -> Result<TrainProgram> {
        Ok(match (placement.parallelism(), micro_batches <= 1) {
            (None, true) => TrainProgram::Whole(TrainStep::compile_with_metrics(client, spec, loss)?),
            (None, false) => {
                TrainProgram::Accumulating(AccumulatingTrainStep::compile_with_metrics(client, spec, loss)?)
            }
            (Some(parallelism), true) => {
                TrainProgram::ShardedWhole(ShardedTrainStep::compile_with_metrics(client, spec, parallelism, loss)?)
            }
            (Some(parallelism), false) => TrainProgram::ShardedAccumulating(
                ShardedAccumulatingTrainStep::compile_with_metrics(client, spec, parallelism, loss)?,
            ),
        })
    }

    /// One optimizer step over `micro_batches` (each the step's batch
    /// inputs, on the placement the step was compiled for).
    pub fn step(&self, state: &mut LearnerState, micro_batches: &[BatchInputs], lr: f32) -> Result<StepMetrics> {
        let one_device = || -> Result<Vec<Vec<&Buffer>>> {
            micro_batches
                .iter()
                .map(|m| match m {
                    BatchInputs::OneDevice(inputs) => Ok(inputs.iter().collect()),
                    BatchInputs::Sharded(_) => Err(misplaced()),
                })
                .collect()
        };
        let sharded = || -> Result<Vec<Vec<&ShardedBuffer>>> {
            micro_batches
                .iter()
                .map(|m| match m {
                    BatchInputs::Sharded(inputs) => Ok(inputs.iter().collect()),
                    BatchInputs::OneDevice(_) => Err(misplaced()),
                })
                .collect()
        };
        Ok(match (self, state, micro_batches) {
            (TrainProgram::Whole(step), LearnerState::OneDevice(state), [_]) => {
                step.step(state, &one_device()?[0], lr)?
            }
            (TrainProgram::Accumulating(step), LearnerState::OneDevice(state), _) => {
                step.step(state, &one_device()?, lr)?
            }
            (TrainProgram::ShardedWhole(step), LearnerState::Sharded(state), [_]) => {
                step.step(state, &sharded()?[0], lr)?
            }
            (TrainProgram::ShardedAccumulating(step), LearnerState::Sharded(state), _) => {
                step.step(state, &sharded()?, lr)?
            }
            (TrainProgram::Whole(_) | TrainProgram::ShardedWhole(_), _, [_]) => return Err(misplaced()),
            (TrainProgram::Whole(_) | TrainProgram::ShardedWhole(_), _, _) => {
                return Err(crate::Error::Config {
                    field: "micro_batches",
                    message: format!(
                        "this step was compiled for one micro-batch, given {}",
                        micro_batches.len()
                    ),
                });
            }
            _ => return Err(misplaced()),
        })
    }
}

/// The error of a state or batch on another placement than the step's.
fn misplaced() -> crate::Error {
    crate::Error::Config {
        field: "trainer.parallelism",
        message: "the step, its state and its batch are on different placements".to_string(),
    }
}

/// A compiled GRPO step (a [`TrainProgram`] of [`traced_loss`]).
pub struct GrpoStep(TrainProgram);

impl GrpoStep {
    /// Compiles the step for `micro_batches` micro-batches of `shape` on `placement`.
    pub fn compile(
        client: &Client,
        decoder: &Decoder,
        config: &StepConfig<'_>,
        placement: &Placement,
        shape: MicroBatchShape,
        micro_batches: usize,
    ) -> Result<GrpoStep> {
        config.loss.validate()?;
        let spec = TrainStepSpec {
            params: param_types(decoder, config.dtype),
            batch: batch_types(shape, config.old, config.loss.beta > 0.0),
            optimizer: config.optimizer,
            max_grad_norm: config.max_grad_norm,
        };
        let loss = |params: &[Tensor], batch: &[Tensor]| {
            let params = in_dtype(params, config.compute)?;
            traced_loss(decoder, &config.loss, config.old, &params, batch)
        };
        Ok(GrpoStep(TrainProgram::compile(
            client,
            &spec,
            placement,
            micro_batches,
            loss,
        )?))
    }

    /// One optimizer step over `micro_batches` (inputs as [`batch_types`]).
    pub fn step(&self, state: &mut LearnerState, micro_batches: &[BatchInputs], lr: f32) -> Result<StepMetrics> {
        self.0.step(state, micro_batches, lr)
    }
}
