//! The token sampler, traced into the decode program: one token per row of
//! logits, each row with its own penalties, temperature, top-k, top-p,
//! min-p and seed.
//!
//! Per row `b`, with `z` the raw logits, first the penalties (vLLM's order
//! and formulas), from the row's [`TokenHistory`]:
//! - repetition `r` (1 = off): a token of the prompt or the output gets
//!   `z / r` where `z > 0`, `z · r` otherwise;
//! - frequency `f` and presence `p` (0 = off): `z − f · count − p · [count > 0]`
//!   with `count` the token's occurrences in the output;
//! - while stop tokens are suppressed (`min_tokens` not reached), they get
//!   `−∞`.
//!
//! Then, on the penalized `z`:
//! - temperature 0 is greedy (`argmax z`);
//! - otherwise `p = softmax(z / T)`, sorted descending; a token is kept if
//!   its rank is below top-k (0 = no limit), the probability mass before it
//!   is below top-p, and `p ≥ min_p · p_max`; the first token is always kept;
//! - one uniform `u` picks the token whose kept cumulative mass first
//!   exceeds `u · Σ kept`. Rows without top-k and top-p do this in
//!   vocabulary order and skip the sort (the same distribution, and the
//!   same token whichever [`SamplerKind`] the program has).
//!
//! A guided row (see [`crate::guided`]) draws from `z` with its grammar's
//! disallowed tokens at `−∞`; its log-probs are still read from the
//! unmasked logits, as a learner scoring the policy reads them.
//!
//! The uniform comes from a counter-based hash of (seed, step), so a
//! request's draws do not depend on what else shares its batch (given the
//! same logits: those can differ in the last bits between batch shapes,
//! as the CPU's matrix kernels change with the row count). Each token is
//! returned with the logits its log-prob is read from: the raw `z` (its
//! log-prob under the unmodified policy), or, for rows asking for
//! processed log-probs, the penalized `z / T` (under the distribution it
//! was drawn from before filtering — what a learner scoring at the same
//! temperature needs for its importance ratio).

use grpo_xla::trace::Tensor;
use grpo_xla::{ElementType, Result};

/// Vocabulary tokens per block of the plain draw's two-level cumulative
/// sum (see `draw_unsorted`).
const DRAW_BLOCK: i64 = 128;

/// Per-row sampling settings, as tensors of the decode program (`[B]` each).
pub struct SamplingInputs<'a> {
    /// Repetition penalty (f32, > 0); 1 is off.
    pub repetition_penalty: &'a Tensor,
    /// Frequency penalty (f32); 0 is off.
    pub frequency_penalty: &'a Tensor,
    /// Presence penalty (f32); 0 is off.
    pub presence_penalty: &'a Tensor,
    /// 1 while the row's stop tokens may not be drawn yet (f32 0/1).
    pub suppress_stops: &'a Tensor,
    /// Temperature (f32); 0 means greedy.
    pub temperature: &'a Tensor,
    /// Keep at most this many tokens (s32); 0 keeps all.
    pub top_k: &'a Tensor,
    /// Keep the smallest set reaching this mass (f32, in (0, 1]).
    pub top_p: &'a Tensor,
    /// Drop tokens below this fraction of the most likely one (f32, in [0, 1)).
    pub min_p: &'a Tensor,
    /// The request's seed (u32).
    pub seed: &'a Tensor,
    /// How many tokens the request has drawn before (u32): the hash counter.
    pub step: &'a Tensor,
    /// 1 where the row's log-probs are processed ones (f32 0/1; see
    /// [`crate::request::LogprobsMode`]).
    pub processed_logprobs: &'a Tensor,
}

impl<'a> SamplingInputs<'a> {
    /// The element types of the eleven inputs, in field order (each `[B]`).
    pub const TYPES: [ElementType; 11] = [
        ElementType::F32,
        ElementType::F32,
        ElementType::F32,
        ElementType::F32,
        ElementType::F32,
        ElementType::S32,
        ElementType::F32,
        ElementType::F32,
        ElementType::U32,
        ElementType::U32,
        ElementType::F32,
    ];

    /// Adds the eleven inputs as parameters of `graph` for `batch` rows.
    pub fn parameters(graph: &grpo_xla::trace::Graph, batch: i64) -> Result<Vec<Tensor>> {
        Self::TYPES.iter().map(|&t| graph.parameter(t, &[batch])).collect()
    }

    /// Views eleven tensors (as [`SamplingInputs::parameters`] made them) as the inputs.
    pub fn from_tensors(t: &'a [Tensor]) -> SamplingInputs<'a> {
        SamplingInputs {
            repetition_penalty: &t[0],
            frequency_penalty: &t[1],
            presence_penalty: &t[2],
            suppress_stops: &t[3],
            temperature: &t[4],
            top_k: &t[5],
            top_p: &t[6],
            min_p: &t[7],
            seed: &t[8],
            step: &t[9],
            processed_logprobs: &t[10],
        }
    }
}

/// What each row has seen so far, over the vocabulary (`[B, V]` f32 each).
pub struct TokenHistory<'a> {
    /// Occurrences of each token in the row's output.
    pub output_counts: &'a Tensor,
    /// 1 where the token is in the row's prompt.
    pub in_prompt: &'a Tensor,
    /// 1 on the row's stop tokens (EOS and `stop_token_ids`).
    pub stop_tokens: &'a Tensor,
}

/// The logits after the rows' repetition, frequency and presence penalties
/// and stop-token suppression.
fn penalized(z: &Tensor, inputs: &SamplingInputs<'_>, history: &TokenHistory<'_>) -> Result<Tensor> {
    let b = z.dims()[0];
    let column = |x: &Tensor| x.reshape(&[b, 1]);
    let zero = z.zeros_like()?;
    let counts = history.output_counts;
    let seen = counts.add(history.in_prompt)?.gt(&zero)?;
    let r = column(inputs.repetition_penalty)?;
    let repeated = z.gt(&zero)?.select(&z.div(&r)?, &z.mul(&r)?)?;
    let z = seen.select(&repeated, z)?;
    let present = counts.gt(&zero)?.select(&zero.ones_like()?, &zero)?;
    let z = z
        .sub(&counts.mul(&column(inputs.frequency_penalty)?)?)?
        .sub(&present.mul(&column(inputs.presence_penalty)?)?)?;
    let suppressed = history.stop_tokens.mul(&column(inputs.suppress_stops)?)?.gt(&zero)?;
    suppressed.select(&z.full_like(f64::NEG_INFINITY)?, &z)
}

/// Which draws a sampling program can make. A cheaper kind leaves out work
/// that none of its rows needs, and every kind able to serve a row draws
/// the same token for it: a row's draw never depends on its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SamplerKind {
    /// Only greedy rows (temperature 0).
    Greedy,
    /// Greedy rows and rows sampled without top-k / top-p (min-p is fine):
    /// no sort of the vocabulary.
    Plain,
    /// Any row; rows with top-k or top-p sort their probabilities.
    Filtered,
}

impl SamplerKind {
    /// The cheapest kind that serves a row with these settings.
    pub fn for_row(temperature: f32, top_k: i32, top_p: f32) -> SamplerKind {
        if temperature <= 0.0 {
            SamplerKind::Greedy
        } else if top_k > 0 || top_p < 1.0 {
            SamplerKind::Filtered
        } else {
            SamplerKind::Plain
        }
    }
}

/// The tokens each row may draw (pred `[B, vocab]`) from bitmask words
/// (u32 `[B, W]`, token `t` at bit `t % 32` of word `t / 32`).
pub fn unpack_allowed(words: &Tensor, vocab: i64) -> Result<Tensor> {
    let (b, w) = (words.dims()[0], words.dims()[1]);
    let bit = words.graph().iota(ElementType::U32, &[b, w, 32], 2)?;
    let spread = words.broadcast_in_dim(&[b, w, 32], &[0, 1])?;
    let one = bit.ones_like()?;
    let set = spread.shift_right_logical(&bit)?.and(&one)?.eq(&one)?;
    set.reshape(&[b, w * 32])?.slice_axis(1, 0, vocab)
}

/// The sampled tokens (s32 `[B]`), for rows that `kind` serves, and the
/// logits their log-probs are read from (f32 `[B, V]`: raw, or penalized
/// and tempered for rows asking for processed log-probs). With `allowed`
/// (pred `[B, V]`), each row draws only among its allowed tokens; the
/// returned logits are not masked. Without a `history` (no row has a
/// penalty or suppresses its stop tokens) the penalties are left out.
pub fn sample(
    logits: &Tensor,
    inputs: &SamplingInputs<'_>,
    history: Option<&TokenHistory<'_>>,
    kind: SamplerKind,
    allowed: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let b = logits.dims()[0];
    let raw = logits.convert(ElementType::F32)?;
    let penalized = match history {
        Some(history) => penalized(&raw, inputs, history)?,
        None => raw.clone(),
    };
    let greedy = inputs.temperature.le(&inputs.temperature.zeros_like()?)?;
    let safe_t = greedy.select(&inputs.temperature.ones_like()?, inputs.temperature)?;
    let safe_t = safe_t.reshape(&[b, 1])?;
    let processed = inputs.processed_logprobs.gt(&inputs.processed_logprobs.zeros_like()?)?;
    let scored = processed.reshape(&[b, 1])?.select(&penalized.div(&safe_t)?, &raw)?;
    let z = match allowed {
        Some(allowed) => allowed.select(&penalized, &penalized.full_like(f64::NEG_INFINITY)?)?,
        None => penalized,
    };
    let argmax = z.argmax(1, ElementType::S32)?;
    let tokens = if kind == SamplerKind::Greedy {
        argmax
    } else {
        let tempered = z.div(&safe_t)?;
        // Division by a positive temperature keeps the order, so the
        // largest tempered logit is the argmax's.
        let top = tempered.take_along_axis(&argmax.reshape(&[b, 1])?, 1)?;
        let u = uniform(inputs.seed, inputs.step)?;
        let mut drawn = draw_unsorted(&tempered, &top, inputs, &u)?;
        if kind == SamplerKind::Filtered {
            let no_k = inputs.top_k.le(&inputs.top_k.zeros_like()?)?;
            let no_p = inputs.top_p.ge(&inputs.top_p.ones_like()?)?;
            let plain = no_k.and(&no_p)?;
            let p = tempered.softmax(1)?;
            drawn = plain.select(&drawn, &draw_sorted(&p, inputs, &u)?)?;
        }
        greedy.select(&argmax, &drawn)?
    };
    Ok((tokens, scored))
}

/// Per row, the first position whose cumulative `kept_p` mass exceeds
/// `u · Σ kept_p` (never past the last `kept` position).
fn inverse_cdf(kept_p: &Tensor, kept: &Tensor, u: &Tensor) -> Result<Tensor> {
    let (b, v) = (kept_p.dims()[0], kept_p.dims()[1]);
    let rank = kept_p.graph().iota(ElementType::S32, &[b, v], 1)?;
    let cumulative = kept_p.cumsum(1, false)?;
    let total = cumulative.slice_axis(1, v - 1, v)?;
    let threshold = u.reshape(&[b, 1])?.mul(&total)?;
    let below = cumulative.le(&threshold)?;
    let count = below.select(&rank.ones_like()?, &rank.zeros_like()?)?.sum(&[1])?;
    let last_kept = kept.select(&rank, &rank.zeros_like()?)?.max(&[1])?;
    count.minimum(&last_kept)
}

/// Tokens drawn with min-p only, in vocabulary order, from the tempered
/// logits `z` `[B, V]` whose row maxima are `top` `[B, 1]`: the inverse
/// CDF of each row's uniform `u` over the kept masses `e = exp(z − top)`
/// (`e ≥ min_p` is `p ≥ min_p · p_max`; no normalization is needed).
///
/// The cumulative sum runs in two levels, so no pass over the vocabulary
/// is a scan: the sums of blocks of [`DRAW_BLOCK`] tokens, their running
/// sum to find the block where the row's mass `u · Σ e` is crossed, then
/// the running sum inside that one block. The chosen token always has
/// mass: it is the first kept token whose running sum exceeds the mark,
/// else the last kept token of its block.
fn draw_unsorted(z: &Tensor, top: &Tensor, inputs: &SamplingInputs<'_>, u: &Tensor) -> Result<Tensor> {
    let (b, v) = (z.dims()[0], z.dims()[1]);
    let blocks = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    let padded = if blocks * DRAW_BLOCK == v {
        z.clone()
    } else {
        z.pad(
            &z.scalar_like(f64::NEG_INFINITY)?,
            &[0, 0],
            &[0, blocks * DRAW_BLOCK - v],
            &[0, 0],
        )?
    };
    let min_p = inputs.min_p.reshape(&[b, 1, 1])?;
    let mass = |z: &Tensor, top: &Tensor| -> Result<Tensor> {
        let e = z.sub(top)?.exp()?;
        e.ge(&min_p)?.select(&e, &e.zeros_like()?)
    };
    let by_block = padded.reshape(&[b, blocks, DRAW_BLOCK])?;
    let sums = mass(&by_block, &top.reshape(&[b, 1, 1])?)?.sum(&[2])?;
    let running = sums.cumsum(1, false)?;
    let mark = u.reshape(&[b, 1])?.mul(&running.slice_axis(1, blocks - 1, blocks)?)?;
    let block = first_past(&running, &sums, &mark)?;
    let before = running.sub(&sums)?.take_along_axis(&block.reshape(&[b, 1])?, 1)?;
    let picked = block.reshape(&[b, 1, 1])?.broadcast_to(&[b, 1, DRAW_BLOCK])?;
    let values = by_block.take_along_axis(&picked, 1)?;
    let inside = mass(&values, &top.reshape(&[b, 1, 1])?)?.reshape(&[b, DRAW_BLOCK])?;
    let within = inside.cumsum(1, false)?.add(&before)?;
    let offset = first_past(&within, &inside, &mark)?;
    block.mul(&block.scalar_like(DRAW_BLOCK as f64)?)?.add(&offset)
}

/// Per row of `running` `[B, N]` (the running sum of `mass` `[B, N]`),
/// the first position with mass whose running sum exceeds `mark`
/// `[B, 1]`; the last position with mass when none does (the mark at
/// the total, by rounding), and 0 for a row without mass. s32 `[B]`.
fn first_past(running: &Tensor, mass: &Tensor, mark: &Tensor) -> Result<Tensor> {
    let (b, n) = (mass.dims()[0], mass.dims()[1]);
    let position = mass.graph().iota(ElementType::S32, &[b, n], 1)?;
    let has_mass = mass.gt(&mass.zeros_like()?)?;
    let past = running.gt(mark)?.and(&has_mass)?;
    let first = past.select(&position, &position.full_like(n as f64)?)?.min(&[1])?;
    let last = has_mass.select(&position, &position.zeros_like()?)?.max(&[1])?;
    first.eq(&first.full_like(n as f64)?)?.select(&last, &first)
}

/// Tokens drawn from `p` `[B, V]` with top-k, top-p and min-p, in
/// descending probability order (the first token is always kept).
fn draw_sorted(p: &Tensor, inputs: &SamplingInputs<'_>, u: &Tensor) -> Result<Tensor> {
    let (b, v) = (p.dims()[0], p.dims()[1]);
    let column = |x: &Tensor| x.reshape(&[b, 1]);
    let (sorted, order) = p.sort(1, true)?;
    let rank = p.graph().iota(ElementType::S32, &[b, v], 1)?;
    let k = inputs
        .top_k
        .le(&inputs.top_k.zeros_like()?)?
        .select(&inputs.top_k.full_like(v as f64)?, inputs.top_k)?;
    let within_k = rank.lt(&column(&k)?)?;
    let mass_before = sorted.cumsum(1, false)?.sub(&sorted)?;
    let within_p = mass_before.lt(&column(inputs.top_p)?)?;
    let p_max = sorted.slice_axis(1, 0, 1)?;
    let above_min = sorted.ge(&p_max.mul(&column(inputs.min_p)?)?)?;
    let first = rank.eq(&rank.zeros_like()?)?;
    let kept = within_k.and(&within_p)?.and(&above_min)?.or(&first)?;
    let kept_p = kept.select(&sorted, &sorted.zeros_like()?)?;
    let position = inverse_cdf(&kept_p, &kept, u)?;
    order.take_along_axis(&column(&position)?, 1)?.reshape(&[b])
}

/// The `k` most likely tokens of each row under `logits` (f32, as
/// [`sample`] returns them) and their log-probs, most likely first:
/// (s32 `[B, k]`, f32 `[B, k]`).
pub fn top_logprobs(logits: &Tensor, k: i64) -> Result<(Tensor, Tensor)> {
    let log_probs = logits.log_softmax(1)?;
    let (sorted, order) = log_probs.sort(1, true)?;
    Ok((order.slice_axis(1, 0, k)?, sorted.slice_axis(1, 0, k)?))
}

/// A uniform in [0, 1) per row from a 32-bit integer hash of (seed, step):
/// `x = seed ⊕ (step · 0x9E3779B9)`, then two multiply–xorshift rounds
/// (the "lowbias32" mixer); the top 24 bits become the fraction.
pub fn uniform(seed: &Tensor, step: &Tensor) -> Result<Tensor> {
    let constant = |c: u32| seed.scalar_like(f64::from(c));
    let shifted = |x: &Tensor, by: u32| -> Result<Tensor> { x.xor(&x.shift_right_logical(&constant(by)?)?) };
    let mut x = seed.xor(&step.mul(&constant(0x9E37_79B9)?)?)?;
    x = shifted(&x, 16)?.mul(&constant(0x7FEB_352D)?)?;
    x = shifted(&x, 15)?.mul(&constant(0x846C_A68B)?)?;
    x = shifted(&x, 16)?;
    let top = x.shift_right_logical(&constant(8)?)?;
    top.convert(ElementType::F32)?.mul_scalar(1.0 / f64::from(1u32 << 24))
}
