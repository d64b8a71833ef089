//! From scored rollouts to the train step's micro-batches: each row is the
//! prompt right-aligned in `P` columns and the completion after it in `C`
//! columns (see [`crate::trainer`]), `P` and `C` one token bucket each for
//! the whole step (see [`token_bucket`]: a run compiles a handful of
//! programs), cut into micro-batches of a fixed number of rows (the last
//! one padded with empty rows that count for nothing).

use grpo_xla::{Client, Pred};

use crate::error::{Error, Result};
use crate::loss::LossType;
use crate::placement::{BatchInputs, Placement};
use crate::trainer::MicroBatchShape;

/// The smallest token bucket.
const MIN_TOKENS: usize = 16;

/// One scored sample, as the learner trains on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The completion's token ids.
    pub completion: Vec<u32>,
    /// The rollout engine's log-prob of each completion token.
    pub behaviour_logprobs: Vec<f32>,
    /// The sample's advantage.
    pub advantage: f32,
    /// Whether it counts (its reward was not skipped).
    pub valid: bool,
}

/// The host tensors of one micro-batch, in the order of
/// [`crate::trainer::batch_types`] (without the normalizer).
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    /// Its shape.
    pub shape: MicroBatchShape,
    /// `[rows, P + C]` token ids (0 as padding).
    pub ids: Vec<i32>,
    /// `[rows, P + C]` real tokens.
    pub attention: Vec<bool>,
    /// `[rows, C]`: 1 where column `j` is a completion token of a valid sample.
    pub completion: Vec<f32>,
    /// `[rows, C]`: the behaviour log-prob of that token (0 elsewhere).
    pub behaviour: Vec<f32>,
    /// `[rows]` advantages (0 for padding rows).
    pub advantages: Vec<f32>,
}

impl MicroBatch {
    /// Its inputs on `placement` in [`crate::trainer::batch_types`] order,
    /// with the loss `normalizer` this micro-batch divides by.
    pub fn upload(&self, client: &Client, placement: &Placement, normalizer: f32) -> Result<BatchInputs> {
        let s = self.shape;
        let (b, c) = (s.rows as i64, s.completion_tokens as i64);
        let mut inputs = self.upload_tokens(client, placement)?;
        placement.push(client, &mut inputs, &self.behaviour, &[b, c])?;
        placement.push(client, &mut inputs, &self.advantages, &[b])?;
        placement.push(client, &mut inputs, &[normalizer], &[])?;
        Ok(inputs)
    }

    /// Its first three inputs on `placement`: `ids`, `attention`,
    /// `completion` (all a loss over completion tokens needs; see [`crate::sft`]).
    pub fn upload_tokens(&self, client: &Client, placement: &Placement) -> Result<BatchInputs> {
        let s = self.shape;
        let (b, t, c) = (s.rows as i64, s.tokens() as i64, s.completion_tokens as i64);
        let attention: Vec<Pred> = self.attention.iter().map(|&a| Pred::from(a)).collect();
        let mut inputs = placement.inputs();
        placement.push(client, &mut inputs, &self.ids, &[b, t])?;
        placement.push(client, &mut inputs, &attention, &[b, t])?;
        placement.push(client, &mut inputs, &self.completion, &[b, c])?;
        Ok(inputs)
    }
}

/// A step's micro-batches and the loss normalizer of the whole batch.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBatch {
    /// The micro-batches, all of one shape.
    pub micro_batches: Vec<MicroBatch>,
    /// [`LossType::normalizer`] of the valid samples.
    pub normalizer: f32,
    /// Completion tokens that count.
    pub tokens: usize,
}

/// The token bucket holding sequences of `len` tokens, at most `max`:
/// `len` rounded up to a power of two or to 1.5 times one (16, 24, 32, 48,
/// 64, 96, 128, 192, …), so padding stays under a third of a row while a
/// run compiles two programs per octave of sequence length at most.
pub fn token_bucket(len: usize, max: usize) -> usize {
    let power = len.next_power_of_two();
    let bucket = if len <= power / 4 * 3 { power / 4 * 3 } else { power };
    bucket.max(MIN_TOKENS).min(max.max(MIN_TOKENS))
}

/// Packs `rollouts` into micro-batches of `rows` rows; sequences longer
/// than `max_tokens` are refused (the rollout engine's `max_model_len`
/// keeps them shorter).
pub fn pack(
    rollouts: &[Rollout],
    rows: usize,
    max_tokens: usize,
    loss_type: LossType,
    max_completion_len: usize,
) -> Result<StepBatch> {
    if rows == 0 || rollouts.is_empty() {
        return Err(Error::Config {
            field: "micro_batch_size",
            message: format!("{rows} rows for {} rollouts: both must be at least 1", rollouts.len()),
        });
    }
    let longest = rollouts
        .iter()
        .map(|r| r.prompt.len() + r.completion.len())
        .max()
        .unwrap_or(0);
    if longest > max_tokens {
        return Err(Error::Groups {
            message: format!("a sequence has {longest} tokens, more than the {max_tokens} the learner takes"),
        });
    }
    if let Some(bad) = rollouts
        .iter()
        .find(|r| r.prompt.is_empty() || r.behaviour_logprobs.len() != r.completion.len())
    {
        return Err(Error::Groups {
            message: format!(
                "a rollout has {} prompt tokens and {} log-probs for {} completion tokens",
                bad.prompt.len(),
                bad.behaviour_logprobs.len(),
                bad.completion.len()
            ),
        });
    }
    let longest_prompt = rollouts.iter().map(|r| r.prompt.len()).max().unwrap_or(1);
    let longest_completion = rollouts.iter().map(|r| r.completion.len()).max().unwrap_or(1);
    let shape = MicroBatchShape {
        rows,
        prompt_tokens: token_bucket(longest_prompt, max_tokens),
        completion_tokens: token_bucket(longest_completion, max_completion_len.max(longest_completion)),
    };
    let micro_batches = rollouts.chunks(rows).map(|chunk| micro_batch(chunk, shape)).collect();
    let valid: Vec<&Rollout> = rollouts.iter().filter(|r| r.valid).collect();
    let tokens = valid.iter().map(|r| r.completion.len()).sum();
    Ok(StepBatch {
        micro_batches,
        normalizer: loss_type.normalizer(tokens, valid.len(), max_completion_len),
        tokens,
    })
}

fn micro_batch(chunk: &[Rollout], shape: MicroBatchShape) -> MicroBatch {
    let (rows, p, c) = (shape.rows, shape.prompt_tokens, shape.completion_tokens);
    let t = p + c;
    let mut b = MicroBatch {
        shape,
        ids: vec![0; rows * t],
        attention: vec![false; rows * t],
        completion: vec![0.0; rows * c],
        behaviour: vec![0.0; rows * c],
        advantages: vec![0.0; rows],
    };
    for (row, r) in chunk.iter().enumerate() {
        // The prompt ends at column P; the completion starts there.
        let start = row * t + p - r.prompt.len();
        for (j, &id) in r.prompt.iter().chain(&r.completion).enumerate() {
            b.ids[start + j] = id as i32;
            b.attention[start + j] = true;
        }
        for (j, &lp) in r.behaviour_logprobs.iter().enumerate() {
            b.completion[row * c + j] = if r.valid { 1.0 } else { 0.0 };
            b.behaviour[row * c + j] = lp;
        }
        b.advantages[row] = if r.valid { r.advantage } else { 0.0 };
    }
    b
}
