//! From scored rollouts to the train step's micro-batches: each row is a
//! prompt right-aligned in `P` columns and `K` completion slots of `C`
//! columns after it (see [`crate::objective::grpo`]), `P` and `C` one token bucket
//! each for the whole step (see [`token_bucket`]: a run compiles a handful
//! of programs), cut into micro-batches of a fixed number of samples (the
//! last one padded with empty rows and slots that count for nothing).
//!
//! `K` = 1 puts one sample in a row. With [`PromptSharing`], consecutive
//! samples of one prompt (a GRPO group) share a row and one copy of the
//! prompt, and the step takes the `K` whose rows cost the least by an
//! estimate of dense and attention work ([`attention_width`]): 16 answers
//! of ≤ 16 tokens to a 29-token prompt fill 2 rows of 8 slots, 160 columns
//! each, instead of 16 rows of 48; attention grows with the square of a
//! row's length, so long completions keep `K` small.

use grpo_model::config::ModelConfig;
use grpo_xla::trace::Mesh;
use grpo_xla::{Client, NativeType, Pred, ShardedBuffer, TensorType};

use crate::error::{Error, Result};
use crate::loss::LossType;

/// The smallest token bucket.
const MIN_TOKENS: usize = 16;

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

/// The host array `data` of dimensions `dims` as a batch input on `mesh`:
/// whole on one device, its rows split over several (a scalar replicated).
pub fn batch_input<T: NativeType>(client: &Client, mesh: &Mesh, data: &[T], dims: &[i64]) -> Result<ShardedBuffer> {
    let sharding = mesh.batch_sharding(&TensorType::new(T::ELEMENT_TYPE, dims));
    Ok(mesh.from_host(client, data, dims, &sharding)?)
}

/// One scored sample, as the learner trains on it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSample {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The token ids after the prompt: the model's own, and in a
    /// multi-turn sample what came between its turns (tool results, the
    /// next turn's header).
    pub completion: Vec<u32>,
    /// Which completion tokens carry loss: the model's own (true), or the
    /// tokens between its turns (false).
    pub loss_mask: Vec<bool>,
    /// The rollout engine's log-prob of each completion token (any value
    /// where the mask is false).
    pub behaviour_logprobs: Vec<f32>,
    /// The sample's advantage.
    pub advantage: f32,
    /// Whether it counts (its reward was not skipped).
    pub valid: bool,
}

impl TrainSample {
    /// Completion tokens that carry loss.
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m).count()
    }
}

/// Whether and how far samples of one prompt may share a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptSharing {
    /// Most completion slots a row (1: one sample a row).
    pub max_slots: usize,
    /// Row length at which a token's attention costs as much as its dense
    /// layers ([`attention_width`]).
    pub attention_width: f64,
    /// Rows a micro-batch holds must be a multiple of it (the learner's devices).
    pub row_multiple: usize,
}

impl PromptSharing {
    /// One sample a row.
    pub const OFF: PromptSharing = PromptSharing {
        max_slots: 1,
        attention_width: f64::INFINITY,
        row_multiple: 1,
    };
}

/// How much more a query–key pair of attention costs than its two
/// multiply–adds per head dimension in QKᵀ and PV: the scaling, masking, f32
/// softmax and conversions of every score, forward and backward. Fitted to
/// SmolLM2-135M bf16 GRPO steps on 2 CPU cores (64 samples of a 29-token
/// prompt and 10 or 28 completion tokens, one sample a row against 8 or 16
/// slots a row): about 4.
const ATTENTION_OVERHEAD: f64 = 4.0;

/// The row length at which a token's attention (growing with the row)
/// costs as much as its dense layers (fixed): the dense FLOPs a token over
/// the attention FLOPs a query–key pair, for `config`.
pub fn attention_width(config: &ModelConfig) -> f64 {
    let (hidden, heads, kv) = (config.hidden_size as f64, config.heads as f64, config.kv_heads as f64);
    let head_dim = config.head_dim as f64;
    let projections = hidden * (heads + 2.0 * kv) * head_dim + heads * head_dim * hidden;
    let dense = 2.0 * (projections + 3.0 * hidden * config.intermediate_size as f64);
    let pair = 4.0 * heads * head_dim * ATTENTION_OVERHEAD;
    dense / pair
}

/// The host tensors of one micro-batch, in the order of
/// [`crate::objective::grpo`]'s inputs (without the normalizer); `N` = `R·K` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    /// Its shape.
    pub shape: MicroBatchShape,
    /// `[R, P + K·C]` token ids (0 as padding).
    pub ids: Vec<i32>,
    /// `[R, P + K·C]` real tokens.
    pub attention: Vec<bool>,
    /// `[N, C]`: 1 where column `j` is a completion token of a valid sample.
    pub completion: Vec<f32>,
    /// `[N, C]`: the behaviour log-prob of that token (0 elsewhere).
    pub behaviour: Vec<f32>,
    /// `[N]` advantages (0 for padding slots).
    pub advantages: Vec<f32>,
}

impl MicroBatch {
    /// Its inputs on `mesh` in [`crate::objective::grpo`]'s order, with
    /// the loss `normalizer` this micro-batch divides by.
    pub fn upload(&self, client: &Client, mesh: &Mesh, normalizer: f32) -> Result<Vec<ShardedBuffer>> {
        let s = self.shape;
        let (b, c) = (s.samples() as i64, s.completion_tokens as i64);
        let mut inputs = self.upload_tokens(client, mesh)?;
        inputs.push(batch_input(client, mesh, &self.behaviour, &[b, c])?);
        inputs.push(batch_input(client, mesh, &self.advantages, &[b])?);
        inputs.push(batch_input(client, mesh, &[normalizer], &[])?);
        Ok(inputs)
    }

    /// Its first three inputs on `mesh`: `ids`, `attention`, `completion`
    /// (all a loss over completion tokens needs; see [`crate::objective::sft`]).
    pub fn upload_tokens(&self, client: &Client, mesh: &Mesh) -> Result<Vec<ShardedBuffer>> {
        let s = self.shape;
        let (r, t) = (s.rows as i64, s.tokens() as i64);
        let (n, c) = (s.samples() as i64, s.completion_tokens as i64);
        let attention: Vec<Pred> = self.attention.iter().map(|&a| Pred::from(a)).collect();
        Ok(vec![
            batch_input(client, mesh, &self.ids, &[r, t])?,
            batch_input(client, mesh, &attention, &[r, t])?,
            batch_input(client, mesh, &self.completion, &[n, c])?,
        ])
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
    /// Each micro-batch's normalizer (see [`StepBatch::micro_normalizer`]).
    micro_normalizers: Vec<f32>,
}

impl StepBatch {
    /// The normalizer micro-batch `index` gets: the batch's divided by the
    /// micro-batches, so that the accumulating step's mean gradient is the
    /// whole batch's; for [`LossType::Bnpo`], its own completion tokens, so
    /// that the step (which averages over its micro-batches) averages their
    /// token means.
    pub fn micro_normalizer(&self, index: usize) -> f32 {
        self.micro_normalizers[index]
    }

    /// The shape of its micro-batches.
    pub fn shape(&self) -> MicroBatchShape {
        self.micro_batches[0].shape
    }
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

/// Packs `rollouts` into micro-batches of `rows` samples, one a row;
/// sequences longer than `max_tokens` are refused (the rollout engine's
/// `max_model_len` keeps them shorter).
pub fn pack(
    rollouts: &[TrainSample],
    rows: usize,
    max_tokens: usize,
    loss_type: LossType,
    max_completion_len: usize,
) -> Result<StepBatch> {
    pack_sharing(
        rollouts,
        rows,
        max_tokens,
        loss_type,
        max_completion_len,
        PromptSharing::OFF,
    )
}

/// [`pack`] with consecutive samples of one prompt sharing rows as
/// `sharing` allows, when that costs fewer estimated FLOPs.
pub fn pack_sharing(
    rollouts: &[TrainSample],
    samples: usize,
    max_tokens: usize,
    loss_type: LossType,
    max_completion_len: usize,
    sharing: PromptSharing,
) -> Result<StepBatch> {
    if samples == 0 || rollouts.is_empty() {
        return Err(Error::Config {
            field: "micro_batch_size",
            message: format!(
                "{samples} rows for {} rollouts: both must be at least 1",
                rollouts.len()
            ),
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
    if let Some(bad) = rollouts.iter().find(|r| {
        r.prompt.is_empty()
            || r.behaviour_logprobs.len() != r.completion.len()
            || r.loss_mask.len() != r.completion.len()
    }) {
        return Err(Error::Groups {
            message: format!(
                "a rollout has {} prompt tokens, and {} log-probs and {} mask entries for {} completion tokens",
                bad.prompt.len(),
                bad.behaviour_logprobs.len(),
                bad.loss_mask.len(),
                bad.completion.len()
            ),
        });
    }
    let longest_prompt = rollouts.iter().map(|r| r.prompt.len()).max().unwrap_or(1);
    let longest_completion = rollouts.iter().map(|r| r.completion.len()).max().unwrap_or(1);
    let (prompt_tokens, completion_tokens) = (
        token_bucket(longest_prompt, max_tokens),
        token_bucket(longest_completion, max_completion_len.max(longest_completion)),
    );
    let (shape, packs) = (1..=sharing.max_slots.min(samples))
        .filter(|&slots| samples.is_multiple_of(slots) && (samples / slots).is_multiple_of(sharing.row_multiple))
        .map(|slots| {
            let shape = MicroBatchShape {
                rows: samples / slots,
                prompt_tokens,
                slots,
                completion_tokens,
            };
            (shape, prompt_packs(rollouts, slots))
        })
        .min_by(|a, b| layout_cost(a, sharing).total_cmp(&layout_cost(b, sharing)))
        .expect("one sample a row always splits a micro-batch");
    let chunks: Vec<_> = packs.chunks(shape.rows).collect();
    let micro_batches: Vec<MicroBatch> = chunks.iter().map(|chunk| micro_batch(chunk, shape)).collect();
    let valid = rollouts.iter().filter(|r| r.valid).count();
    let tokens = valid_tokens(rollouts);
    let normalizer = loss_type.normalizer(tokens, valid, max_completion_len);
    let count = micro_batches.len().max(1);
    let micro_normalizers = chunks
        .iter()
        .map(|chunk| match loss_type {
            LossType::Bnpo => valid_tokens(chunk.iter().flatten().copied()).max(1) as f32,
            _ => normalizer / count as f32,
        })
        .collect();
    Ok(StepBatch {
        micro_batches,
        normalizer,
        tokens,
        micro_normalizers,
    })
}

/// The completion tokens that count among `samples` (the valid ones').
fn valid_tokens<'a>(samples: impl IntoIterator<Item = &'a TrainSample>) -> usize {
    samples
        .into_iter()
        .filter(|r| r.valid)
        .map(TrainSample::loss_tokens)
        .sum()
}

/// `rollouts` in order, cut into runs of at most `slots` samples with one prompt.
fn prompt_packs(rollouts: &[TrainSample], slots: usize) -> Vec<Vec<&TrainSample>> {
    let mut packs: Vec<Vec<&TrainSample>> = Vec::new();
    for r in rollouts {
        match packs.last_mut() {
            Some(pack) if pack.len() < slots && pack[0].prompt == r.prompt => pack.push(r),
            _ => packs.push(vec![r]),
        }
    }
    packs
}

/// The estimated cost of training `packs` in micro-batches of `shape`:
/// padded rows times a row's tokens, each token's cost growing with the
/// row's length past the [`PromptSharing::attention_width`].
fn layout_cost((shape, packs): &(MicroBatchShape, Vec<Vec<&TrainSample>>), sharing: PromptSharing) -> f64 {
    let padded_rows = packs.len().div_ceil(shape.rows) * shape.rows;
    let tokens = shape.tokens() as f64;
    padded_rows as f64 * tokens * (1.0 + tokens / sharing.attention_width)
}

fn micro_batch(chunk: &[Vec<&TrainSample>], shape: MicroBatchShape) -> MicroBatch {
    let (rows, p, k, c) = (shape.rows, shape.prompt_tokens, shape.slots, shape.completion_tokens);
    let (t, n) = (shape.tokens(), shape.samples());
    let mut b = MicroBatch {
        shape,
        ids: vec![0; rows * t],
        attention: vec![false; rows * t],
        completion: vec![0.0; n * c],
        behaviour: vec![0.0; n * c],
        advantages: vec![0.0; n],
    };
    for (row, pack) in chunk.iter().enumerate() {
        // The prompt ends at column P; completion slot s starts at P + s·C.
        let prompt = &pack[0].prompt;
        let start = row * t + p - prompt.len();
        b.ids[start..start + prompt.len()].copy_from_slice(&prompt.iter().map(|&id| id as i32).collect::<Vec<_>>());
        b.attention[start..start + prompt.len()].fill(true);
        for (slot, r) in pack.iter().enumerate() {
            let begin = row * t + p + slot * c;
            for (j, &id) in r.completion.iter().enumerate() {
                b.ids[begin + j] = id as i32;
                b.attention[begin + j] = true;
            }
            let sample = row * k + slot;
            for (j, (&lp, &trained)) in r.behaviour_logprobs.iter().zip(&r.loss_mask).enumerate() {
                b.completion[sample * c + j] = if r.valid && trained { 1.0 } else { 0.0 };
                b.behaviour[sample * c + j] = lp;
            }
            b.advantages[sample] = if r.valid { r.advantage } else { 0.0 };
        }
    }
    b
}
