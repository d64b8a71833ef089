//! Qwen3-MoE's sparse MLP as traced code: the router, the experts as one
//! grouped product, and the load-balancing loss, following transformers'
//! `Qwen3MoeSparseMoeBlock` and `load_balancing_loss_func`.
//!
//! **Routing.** Router logits `x·Wᵀ` (`W` `[experts, hidden]`), softmax in
//! f32, the `k` most probable experts (ties to the lower index), their
//! probabilities divided by their sum when the config normalizes them, cast
//! back to `x`'s dtype. The choice itself carries no gradient; the weights
//! do, through the softmax.
//!
//! **The grouped product.** Every (token, slot) assignment is sorted by
//! expert and written into a buffer in which each expert's rows start on a
//! multiple of `B` rows (its group padded with zero rows), so every block
//! of `B` rows belongs to one expert. Each block takes its expert's
//! matrices and the three SwiGLU products run batched over the blocks:
//! work is proportional to the assignments (`tokens × k`) plus the padding,
//! not to `tokens × experts`, and no token is ever dropped — the buffer
//! has room for any routing, `⌈A/B⌉ + experts − 1` blocks for `A`
//! assignments. Outputs go back to their tokens and are summed with the
//! routing weights. Gradients follow by autodiff: the row gathers turn into
//! scatter-adds, the matrix gathers into per-expert sums over blocks.
//! [`dense_experts`] computes every expert for every token instead; small
//! batches (a decode step) take it when it is the cheaper of the two.

use grpo_xla::trace::{ScatterDims, Tensor};
use grpo_xla::{ElementType, Result};

/// One sparse layer's routing of `N` tokens.
pub struct Routing {
    /// Router probabilities `[N, experts]` (f32).
    pub probs: Tensor,
    /// The chosen experts `[N, k]` (s32), most probable first.
    pub experts: Tensor,
    /// Their weights `[N, k]`, in the tokens' dtype.
    pub weights: Tensor,
}

/// An expert's three SwiGLU matrices, stacked over the experts:
/// `gate` and `up` `[experts, inner, hidden]`, `down` `[experts, hidden, inner]`.
pub struct ExpertWeights<'a> {
    /// Gate projections.
    pub gate: &'a Tensor,
    /// Up projections.
    pub up: &'a Tensor,
    /// Down projections.
    pub down: &'a Tensor,
}

/// How a sparse layer multiplies its tokens by their experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertProduct {
    /// The cheaper of the two for the batch's shape.
    #[default]
    Auto,
    /// Always the grouped product ([`grouped_experts`], blocks of [`block_rows`]).
    Grouped,
    /// Always every expert for every token ([`dense_experts`]).
    Dense,
}

/// Rows of one expert block may be at most this many.
const LARGEST_BLOCK: i64 = 512;

/// Rows at least in a block.
const SMALLEST_BLOCK: i64 = 8;

/// What gathering one block's matrices costs, in rows of products: a
/// block copies its expert's three matrices once and multiplies each row
/// by them. With it the cost model picks the heights `grpo bench moe
/// --block` measured fastest (AMD EPYC, f32, 8 experts of 768 over 576:
/// 64 rows at 512 tokens, 128 at 2048).
const COPY_ROWS: i64 = 32;

/// The routing of tokens `x` `[N, hidden]` by `router` `[experts, hidden]`
/// to `top_k` experts, their weights renormalized when `normalize`.
pub fn route(x: &Tensor, router: &Tensor, top_k: usize, normalize: bool) -> Result<Routing> {
    let logits = x.dot_general(router, &[], &[], &[1], &[1])?;
    let probs = logits.convert(ElementType::F32)?.softmax(1)?;
    let (_, order) = probs.stop_gradient()?.sort(1, true)?;
    let experts = order.slice_axis(1, 0, top_k as i64)?;
    let mut weights = probs.take_along_axis(&experts, 1)?;
    if normalize {
        let n = weights.dims()[0];
        weights = weights.div(&weights.sum(&[1])?.reshape(&[n, 1])?)?;
    }
    Ok(Routing {
        probs,
        experts,
        weights: weights.convert(x.dtype())?,
    })
}

/// The sparse MLP output `[N, hidden]` of tokens `x` `[N, hidden]`
/// routed by `routing`, by `product`: with `Auto`, the grouped product, or
/// every expert for every token when that costs less ([`block_rows`]).
pub fn sparse_mlp(x: &Tensor, routing: &Routing, w: &ExpertWeights<'_>, product: ExpertProduct) -> Result<Tensor> {
    let (tokens, top_k) = (routing.experts.dims()[0], routing.experts.dims()[1]);
    let experts = w.gate.dims()[0];
    let block = block_rows(tokens * top_k, experts);
    let grouped_cost = blocks(tokens * top_k, experts, block) * (block + COPY_ROWS);
    match product {
        ExpertProduct::Grouped => grouped_experts(x, routing, w, block),
        ExpertProduct::Auto if grouped_cost < tokens * experts => grouped_experts(x, routing, w, block),
        ExpertProduct::Auto | ExpertProduct::Dense => dense_experts(x, routing, w),
    }
}

/// Blocks of `block` rows that hold `assignments` grouped over `experts`
/// whatever the routing: `⌈A/B⌉ + experts − 1` (each expert wastes less than a block).
pub fn blocks(assignments: i64, experts: i64, block: i64) -> i64 {
    (assignments + block - 1) / block + experts - 1
}

/// The block height (a power of two) that costs least for `assignments`
/// over `experts`: the rows computed (padding included) plus each block's
/// matrix copy.
pub fn block_rows(assignments: i64, experts: i64) -> i64 {
    std::iter::successors(Some(SMALLEST_BLOCK), |b| Some(b * 2))
        .take_while(|&b| b <= LARGEST_BLOCK)
        .min_by_key(|&b| blocks(assignments, experts, b) * (b + COPY_ROWS))
        .unwrap_or(SMALLEST_BLOCK)
}

/// `x` through each token's chosen experts as one grouped product in
/// blocks of `block` rows (see the module's docs), summed with the routing weights.
pub fn grouped_experts(x: &Tensor, routing: &Routing, w: &ExpertWeights<'_>, block: i64) -> Result<Tensor> {
    let graph = x.graph();
    let (tokens, hidden) = (x.dims()[0], x.dims()[1]);
    let top_k = routing.experts.dims()[1];
    let experts = w.gate.dims()[0];
    let assignments = tokens * top_k;
    let count = blocks(assignments, experts, block);
    let rows = count * block;
    let s32 = |v: i64| graph.scalar(v as f64, ElementType::S32);

    // Assignments sorted by expert; each expert's group padded to whole blocks.
    let chosen = routing.experts.reshape(&[assignments])?;
    let (sorted, order) = chosen.sort(0, false)?;
    let hits = chosen
        .reshape(&[assignments, 1])?
        .eq(&graph.iota(ElementType::S32, &[1, experts], 1)?)?;
    let per_expert = hits
        .select(
            &graph.full(1.0, ElementType::S32, &[assignments, experts])?,
            &graph.full(0.0, ElementType::S32, &[assignments, experts])?,
        )?
        .sum(&[0])?;
    let padded = per_expert.add(&s32(block - 1)?)?.div(&s32(block)?)?.mul(&s32(block)?)?;
    let padded_end = padded.cumsum(0, false)?;
    let padded_start = padded_end.sub(&padded)?;
    let group_start = per_expert.cumsum(0, false)?.sub(&per_expert)?;
    // Sorted assignment j goes to its group's padded start plus its rank in the group.
    let rank = graph
        .iota(ElementType::S32, &[assignments], 0)?
        .sub(&group_start.take(&sorted, 0)?)?;
    let slot = padded_start.take(&sorted, 0)?.add(&rank)?;
    let token = order.div(&s32(top_k)?)?;

    // Buffer row r holds token source[r] (`tokens`: a zero row of padding).
    let into_rows = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
    };
    let source = graph.full(tokens as f64, ElementType::S32, &[rows])?.scatter(
        &slot.reshape(&[assignments, 1])?,
        &token,
        &into_rows,
    )?;
    let padded_x = Tensor::concatenate(&[x, &graph.full(0.0, x.dtype(), &[1, hidden])?], 0)?;
    let grouped = padded_x.take(&source, 0)?.reshape(&[count, block, hidden])?;

    // Block b belongs to the expert whose padded group holds row b·B.
    let block_start = graph.iota(ElementType::S32, &[count, 1], 0)?.mul(&s32(block)?)?;
    let before = padded_end.reshape(&[1, experts])?.le(&block_start)?;
    let owner = before
        .select(
            &graph.full(1.0, ElementType::S32, &[count, experts])?,
            &graph.full(0.0, ElementType::S32, &[count, experts])?,
        )?
        .sum(&[1])?
        .minimum(&s32(experts - 1)?)?;
    let product = |input: &Tensor, stacked: &Tensor| -> Result<Tensor> {
        input.dot_general(&stacked.take(&owner, 0)?, &[0], &[0], &[2], &[2])
    };
    let inner = product(&grouped, w.gate)?.silu()?.mul(&product(&grouped, w.up)?)?;
    let out = product(&inner, w.down)?.reshape(&[rows, hidden])?;

    // Back to (token, slot) order, weighted and summed over the slots.
    let row_of = graph.full(0.0, ElementType::S32, &[assignments])?.scatter(
        &order.reshape(&[assignments, 1])?,
        &slot,
        &into_rows,
    )?;
    let per_slot = out.take(&row_of, 0)?.reshape(&[tokens, top_k, hidden])?;
    routing.weights.dot_general(&per_slot, &[0], &[0], &[1], &[1])
}

/// `x` through every expert for every token, each output weighted by the
/// token's routing weight for that expert (0 for the experts it did not choose).
pub fn dense_experts(x: &Tensor, routing: &Routing, w: &ExpertWeights<'_>) -> Result<Tensor> {
    let graph = x.graph();
    let (tokens, top_k) = (routing.experts.dims()[0], routing.experts.dims()[1]);
    let experts = w.gate.dims()[0];
    let chosen =
        routing
            .experts
            .reshape(&[tokens, top_k, 1])?
            .eq(&graph.iota(ElementType::S32, &[1, 1, experts], 2)?)?;
    let spread = routing
        .weights
        .reshape(&[tokens, top_k, 1])?
        .broadcast_to(chosen.dims())?;
    let dense = chosen.select(&spread, &spread.zeros_like()?)?.sum(&[1])?;
    // [experts, tokens, inner] by one product per projection.
    let product = |input: &Tensor, stacked: &Tensor| -> Result<Tensor> {
        stacked.dot_general(input, &[], &[], &[2], &[1])?.transpose(&[0, 2, 1])
    };
    let inner = product(x, w.gate)?.silu()?.mul(&product(x, w.up)?)?;
    let out = inner.dot_general(w.down, &[0], &[0], &[2], &[2])?;
    out.dot_general(&dense, &[1], &[0], &[0], &[1])
}

/// Running sums over sparse layers for transformers' load-balancing loss
/// (`load_balancing_loss_func` with an attention mask): per expert, the
/// real tokens' assignments and router probabilities, and the real tokens.
pub struct Balance {
    assigned: Tensor,
    probability: Tensor,
    tokens: Tensor,
}

impl Balance {
    /// The sums of one layer's `routing` over the tokens `real` `[N]` (pred) marks.
    pub fn of(routing: &Routing, real: &Tensor) -> Result<Balance> {
        let graph = real.graph();
        let (n, top_k) = (routing.experts.dims()[0], routing.experts.dims()[1]);
        let experts = routing.probs.dims()[1];
        let weight = real.select(
            &graph.full(1.0, ElementType::F32, &[n])?,
            &graph.full(0.0, ElementType::F32, &[n])?,
        )?;
        let hits =
            routing
                .experts
                .reshape(&[n, top_k, 1])?
                .eq(&graph.iota(ElementType::S32, &[1, 1, experts], 2)?)?;
        let counted = hits.select(
            &weight.reshape(&[n, 1, 1])?.broadcast_to(hits.dims())?,
            &graph.full(0.0, ElementType::F32, hits.dims())?,
        )?;
        Ok(Balance {
            assigned: counted.sum(&[0, 1])?,
            probability: weight.dot_general(&routing.probs, &[], &[], &[0], &[0])?,
            tokens: weight.sum_all()?,
        })
    }

    /// These sums and `other`'s.
    pub fn add(&self, other: &Balance) -> Result<Balance> {
        Ok(Balance {
            assigned: self.assigned.add(&other.assigned)?,
            probability: self.probability.add(&other.probability)?,
            tokens: self.tokens.add(&other.tokens)?,
        })
    }

    /// The loss: `experts · Σ_e (assigned_e / T) · (probability_e / T)`
    /// over `T` real tokens counted once per layer (f32 scalar). Only the
    /// probabilities carry a gradient.
    pub fn loss(&self) -> Result<Tensor> {
        let tokens = self.tokens.maximum(&self.tokens.scalar_like(1.0)?)?;
        let share = self.assigned.div(&tokens)?.stop_gradient()?;
        let mean_probability = self.probability.div(&tokens)?;
        let experts = self.assigned.dims()[0];
        share.mul(&mean_probability)?.sum_all()?.mul_scalar(experts as f64)
    }
}
