//! The Llama / Mistral / Phi-3 / Qwen2 / Qwen3 decoder as traced grpo-xla
//! code, following transformers' eager implementation: RMSNorm,
//! grouped-query attention with rotate-half RoPE, SwiGLU, residuals; q/k/v
//! biases, per-head q/k norms and fused projections where the config asks
//! for them, and Qwen3-MoE's sparse MLP layers ([`crate::moe`]).
//!
//! Attention takes its keys and values as tensors with a key mask, so the
//! same block serves training (keys = this sequence) and generation (keys =
//! a KV cache the rollout engine owns).
//!
//! A decoder may carry LoRA adapters ([`Decoder::with_adapters`]): their
//! tensors follow the base parameters, and every adapted linear layer adds
//! its low-rank product. A decoder with adapter slots
//! ([`Decoder::with_adapter_slots`]) holds several adapters side by side
//! and lets each row of a batch pick its own.

use std::rc::Rc;

use grpo_xla::trace::{GatherDims, HeadScale, ScatterDims, Tensor, linear_log_probs, rematerialized, uniform};
use grpo_xla::{ElementType, Result, TensorType};

use crate::config::ModelConfig;
use crate::lora::{LoraConfig, adapter_parameters};
use crate::moe::{Balance, ExpertProduct, ExpertWeights, Routing, route, sparse_mlp};
use crate::names::{ParamSpec, parameters};

/// A decoder: its config and parameter layout (the base model's, then its
/// adapters' when it has some).
#[derive(Debug, Clone)]
pub struct Decoder {
    config: ModelConfig,
    params: Vec<ParamSpec>,
    /// The base model's parameters: the first this many.
    base_count: usize,
    adapters: Option<Adapters>,
    /// Whether a training forward rematerializes each layer in the backward
    /// pass ([`Decoder::with_layer_checkpoints`]).
    checkpoint_layers: bool,
    /// How sparse layers multiply tokens by experts ([`Decoder::with_expert_product`]).
    expert_product: ExpertProduct,
}

/// The LoRA adapters of a decoder.
#[derive(Debug, Clone)]
struct Adapters {
    lora: LoraConfig,
    /// The adapted layers' names (`model.layers.0.self_attn.q_proj`).
    layers: Vec<String>,
    /// Whether each row picks its adapters ([`Decoder::with_adapter_slots`]).
    per_row: bool,
    /// Dropout on the adapters' inputs while training ([`Decoder::with_adapter_dropout`]).
    dropout: Option<AdapterDropout>,
}

/// PEFT's `lora_dropout`, as a decoder applies it in training.
#[derive(Debug, Clone, Copy, PartialEq)]
struct AdapterDropout {
    /// The probability of dropping each input value.
    p: f64,
    /// The seed of the masks.
    seed: u64,
}

/// Most tokens whose logits exist at once in [`Decoder::token_logprobs`].
pub const HEAD_CHUNK: i64 = 256;

/// What a scoring forward gives: per-token log-probs and entropies, and
/// for a model with sparse layers the load-balancing loss of its routing
/// over the real tokens ([`Balance`]).
pub struct TokenScores {
    /// Log-probabilities of the scored tokens (f32).
    pub logprobs: Tensor,
    /// Entropies of their distributions (f32).
    pub entropy: Tensor,
    /// transformers' `load_balancing_loss_func` (without its coefficient)
    /// over every sparse layer; `None` without sparse layers.
    pub balance: Option<Tensor>,
}

/// The parameters of one forward, as traced tensors in [`Decoder::parameters`] order.
pub struct Weights<'a> {
    specs: &'a [ParamSpec],
    tensors: &'a [Tensor],
    /// Each row's adapter columns, for a decoder with adapter slots.
    columns: Option<&'a Tensor>,
    /// The draw number of the adapters' dropout masks (u32), while training.
    draw: Option<&'a Tensor>,
}

impl<'a> Weights<'a> {
    fn get(&self, name: &str) -> Result<&'a Tensor> {
        self.specs
            .iter()
            .position(|p| p.name == name)
            .map(|i| &self.tensors[i])
            .ok_or_else(|| grpo_xla::Error::Trace {
                op: "decoder",
                message: format!("the model has no parameter `{name}`"),
            })
    }
}

/// `x · wᵀ (+ b)` for a PyTorch-layout `[out, in]` weight.
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.dot_general(w, &[], &[], &[x.rank() - 1], &[1])?;
    match b {
        Some(b) => y.add(b),
        None => Ok(y),
    }
}

/// `x` with its last axis halves `[a, b]` turned into `[-b, a]`.
fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let last = x.rank() - 1;
    let half = x.dims()[last] / 2;
    let a = x.slice_axis(last, 0, half)?;
    let b = x.slice_axis(last, half, 2 * half)?;
    Tensor::concatenate(&[&b.neg()?, &a], last)
}

/// RMS norm over the last axis computed in f32 and scaled by `weight` in
/// `x`'s dtype, as transformers' `LlamaRMSNorm` does.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    weight.mul(&normalized(x, eps)?.convert(x.dtype())?)
}

/// Gemma's RMSNorm: `x` normalized, times `1 + weight`, in f32, then cast
/// back (transformers' `(x * (1 + w)).to(dtype)`, where Llama's casts first).
fn offset_rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let scale = weight.convert(ElementType::F32)?.add_scalar(1.0)?;
    normalized(x, eps)?.mul(&scale)?.convert(x.dtype())
}

/// `x / √(mean(x²) + eps)` over the last axis, in f32.
fn normalized(x: &Tensor, eps: f64) -> Result<Tensor> {
    let last = x.rank() - 1;
    let x32 = x.convert(ElementType::F32)?;
    let mean_square = x32.square()?.mean(&[last])?.reshape(&keep_last(x.dims()))?;
    x32.mul(&mean_square.add_scalar(eps)?.rsqrt()?)
}

/// `cap · tanh(x / cap)`: Gemma 2's soft-capping of scores and logits.
fn soft_cap(x: &Tensor, cap: f64) -> Result<Tensor> {
    x.mul_scalar(1.0 / cap)?.tanh()?.mul_scalar(cap)
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`):
/// `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let inner = x.add(&x.mul(&x.square()?)?.mul_scalar(0.044715)?)?;
    let t = inner.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?.tanh()?;
    x.mul(&t.add_scalar(1.0)?)?.mul_scalar(0.5)
}

/// The rotary tables (cos, sin) of a forward: the global base's, and the
/// sliding layers' own when they have one (Gemma 3).
struct Rotary {
    global: (Tensor, Tensor),
    local: Option<(Tensor, Tensor)>,
}

impl Rotary {
    /// The tables of `layer`.
    fn of(&self, config: &ModelConfig, layer: usize) -> (&Tensor, &Tensor) {
        let (cos, sin) = match &self.local {
            Some(local) if config.slides(layer) => local,
            _ => &self.global,
        };
        (cos, sin)
    }
}

/// `decoder`'s layer `layer` of the forward over weights `w`, as
/// [`rematerialized`]: it keeps its inputs — the residual stream `x`, the
/// rotary tables, the attention mask `allowed`, the layer's parameters and
/// the adapters' columns or dropout draw — and computes the rest again in
/// the backward pass.
fn checkpointed_layer(
    decoder: &Rc<Decoder>,
    w: &Weights<'_>,
    layer: usize,
    x: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    allowed: &Tensor,
) -> Result<(Tensor, Option<Routing>)> {
    let prefix = format!("model.layers.{layer}.");
    let own: Vec<usize> = (0..w.tensors.len())
        .filter(|&i| w.specs[i].name.starts_with(&prefix))
        .collect();
    let specs: Vec<ParamSpec> = own.iter().map(|&i| w.specs[i].clone()).collect();
    let mut inputs = vec![x, cos, sin, allowed];
    inputs.extend(own.iter().map(|&i| &w.tensors[i]));
    let (columns, draw) = (w.columns.is_some(), w.draw.is_some());
    inputs.extend(w.columns.iter().chain(&w.draw));
    let decoder = Rc::clone(decoder);
    let out = rematerialized("decoder_layer", &inputs, move |p| {
        let (fixed, rest) = p.split_at(4);
        let (params, extra) = rest.split_at(specs.len());
        let mut extra = extra.iter();
        let w = Weights {
            specs: &specs,
            tensors: params,
            columns: if columns { extra.next() } else { None },
            draw: if draw { extra.next() } else { None },
        };
        let attend = |q, k, v| decoder.attend(&q, &k, &v, &fixed[3]);
        let (x, routing) = decoder.layer(&w, layer, &fixed[0], (&fixed[1], &fixed[2]), attend)?;
        let mut out = vec![x];
        if let Some(r) = routing {
            out.extend([r.probs, r.experts, r.weights]);
        }
        Ok(out)
    })?;
    let mut out = out.into_iter();
    let x = out.next().expect("the layer's output");
    let routing = match (out.next(), out.next(), out.next()) {
        (Some(probs), Some(experts), Some(weights)) => Some(Routing {
            probs,
            experts,
            weights,
        }),
        _ => None,
    };
    Ok((x, routing))
}

/// Which key each query may see in self-attention over one sequence:
/// `allowed[b, i, j]` = `j ≤ i` and token `j` is real (`mask` `[B, T]`).
fn causal_mask(mask: &Tensor) -> Result<Tensor> {
    let (b, t) = (mask.dims()[0], mask.dims()[1]);
    let graph = mask.graph();
    let row = graph.iota(ElementType::S32, &[t, t], 0)?;
    let col = graph.iota(ElementType::S32, &[t, t], 1)?;
    col.le(&row)?.reshape(&[1, t, t])?.and(&mask.reshape(&[b, 1, t])?)
}

/// What each layer's queries may see in one forward: the causal (and
/// padding) mask, and where the model has a sliding window, the same
/// restricted to the keys less than the window behind each query
/// (transformers' `kv_idx > q_idx − sliding_window`, over positions).
struct Masks {
    full: Tensor,
    sliding: Option<Tensor>,
}

impl Masks {
    /// The masks of `full` (`[B, T, S]`) for queries at `queries` `[B, T]`
    /// over keys at `keys` (`[B, S]` or `[1, S]`), under `config`'s window.
    fn new(config: &ModelConfig, full: Tensor, queries: &Tensor, keys: &Tensor) -> Result<Masks> {
        let sliding = match config.sliding_window {
            Some(window) => {
                let (b, t) = (queries.dims()[0], queries.dims()[1]);
                let (kb, s) = (keys.dims()[0], keys.dims()[1]);
                let oldest = queries
                    .reshape(&[b, t, 1])?
                    .sub(&queries.full_like(window as f64)?.reshape(&[b, t, 1])?)?;
                let near = keys.reshape(&[kb, 1, s])?.gt(&oldest)?;
                Some(full.and(&near)?)
            }
            None => None,
        };
        Ok(Masks { full, sliding })
    }

    /// The mask of `layer`'s attention.
    fn of(&self, config: &ModelConfig, layer: usize) -> &Tensor {
        match &self.sliding {
            Some(sliding) if config.slides(layer) => sliding,
            _ => &self.full,
        }
    }
}

/// `cache` `[S, kv, C, hd]` with `new` `[B, kv, T, hd]` written at row
/// `rows[b]` (`[B]`), position `positions[b, t]`; tokens at position −1 (or
/// in a row −1) write nothing.
fn write_positions(cache: &Tensor, new: &Tensor, rows: &Tensor, positions: &Tensor) -> Result<Tensor> {
    let (b, t) = (positions.dims()[0], positions.dims()[1]);
    let rows = rows.reshape(&[b, 1, 1])?.broadcast_to(&[b, t, 1])?;
    let indices = Tensor::concatenate(&[&rows, &positions.reshape(&[b, t, 1])?], 2)?;
    let dims = ScatterDims {
        update_window_dims: vec![2, 3],
        inserted_window_dims: vec![0, 2],
        scatter_dims_to_operand_dims: vec![0, 2],
        index_vector_dim: 2,
    };
    cache.scatter(&indices, &new.transpose(&[0, 2, 1, 3])?, &dims)
}

/// Which cache rows a cached forward reads and writes.
#[derive(Clone, Copy)]
enum CacheRows<'a> {
    /// Rows `0..B`: sequence `b` is row `b` (decode).
    First,
    /// Row `rows[b]` (`[B]`, s32) for sequence `b` (continuing chosen slots).
    Chosen(&'a Tensor),
}

/// `x` with each value dropped (zeroed) with probability `dropout.p` and
/// the rest scaled by `1/(1−p)`, the mask drawn from the seed, the adapted
/// layer's `index` and the `draw` number (u32 scalar).
fn drop_values(x: &Tensor, dropout: AdapterDropout, index: usize, draw: &Tensor) -> Result<Tensor> {
    let graph = x.graph();
    let stream = dropout.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let state = Tensor::concatenate(
        &[
            &graph.constant(&[stream], &[1])?,
            &draw.convert(ElementType::U64)?.reshape(&[1])?,
        ],
        0,
    )?;
    let (_, u) = uniform(&state, x.dims(), ElementType::F32)?;
    let kept = u.ge(&u.scalar_like(dropout.p)?)?;
    let scaled = x.mul_scalar(1.0 / (1.0 - dropout.p))?;
    kept.select(&scaled, &x.zeros_like()?)
}

/// The load-balancing loss of `routings` (one per sparse layer, over the
/// `[B, T]` tokens) over the real tokens of `mask`; `None` without sparse layers.
fn balance(routings: &[Routing], mask: &Tensor) -> Result<Option<Tensor>> {
    let real = mask.reshape(&[mask.dims().iter().product()])?;
    let mut total: Option<Balance> = None;
    for routing in routings {
        let layer = Balance::of(routing, &real)?;
        total = Some(match total {
            Some(sum) => sum.add(&layer)?,
            None => layer,
        });
    }
    total.map(|t| t.loss()).transpose()
}

/// The chosen experts of `routings` (one per sparse layer, over tokens of
/// shape `dims` `[B, T]`) as `[layers, B, T, k]`.
fn stacked_choices(routings: &[Routing], dims: &[i64]) -> Result<Tensor> {
    let choices = routings
        .iter()
        .map(|r| {
            let k = r.experts.dims()[1];
            r.experts.reshape(&[1, dims[0], dims[1], k])
        })
        .collect::<Result<Vec<Tensor>>>()?;
    if choices.is_empty() {
        return Err(grpo_xla::Error::Trace {
            op: "expert_choices",
            message: "the model has no sparse layers".to_string(),
        });
    }
    Tensor::concatenate(&choices.iter().collect::<Vec<_>>(), 0)
}

/// `dims` with the last axis of size 1.
fn keep_last(dims: &[i64]) -> Vec<i64> {
    let mut kept = dims.to_vec();
    if let Some(last) = kept.last_mut() {
        *last = 1;
    }
    kept
}

impl Decoder {
    /// A decoder for `config`.
    pub fn new(config: ModelConfig) -> Decoder {
        let params = parameters(&config);
        Decoder {
            base_count: params.len(),
            config,
            params,
            adapters: None,
            checkpoint_layers: false,
            expert_product: ExpertProduct::Auto,
        }
    }

    /// The coefficient of the load-balancing loss a train step adds for the
    /// sparse layers: the config's `router_aux_loss_coef` when it sets
    /// `output_router_logits` (transformers adds the loss only then), else 0.
    pub fn router_aux_loss_coef(&self) -> f64 {
        self.config
            .experts
            .as_ref()
            .filter(|e| e.output_router_logits)
            .map_or(0.0, |e| e.router_aux_loss_coef)
    }

    /// The same decoder with a train step adding the load-balancing loss
    /// times `coef` (0: not at all); a model without sparse layers, or a
    /// coefficient that is negative or not finite, is refused.
    pub fn with_router_aux_loss_coef(mut self, coef: f64) -> crate::Result<Decoder> {
        let bad = |message: String| crate::Error::Config {
            field: "trainer.router_aux_loss_coef".to_string(),
            message,
        };
        if !(coef.is_finite() && coef >= 0.0) {
            return Err(bad(format!("{coef} must be a finite number ≥ 0")));
        }
        let Some(experts) = self.config.experts.as_mut() else {
            return Err(bad(format!(
                "the {} model has no sparse (mixture-of-experts) layers to balance",
                self.config.family.architecture()
            )));
        };
        experts.router_aux_loss_coef = coef;
        experts.output_router_logits = coef > 0.0;
        Ok(self)
    }

    /// The same decoder whose sparse layers multiply tokens by their
    /// experts as `product` says (by default the cheaper way for each
    /// shape); the values are the same up to rounding.
    pub fn with_expert_product(mut self, product: ExpertProduct) -> Decoder {
        self.expert_product = product;
        self
    }

    /// The same decoder whose scoring forwards ([`Decoder::token_logprobs`],
    /// [`Decoder::shared_prompt_logprobs`], [`Decoder::logits`]) keep only
    /// each layer's input for the backward pass, when `on`, and compute the
    /// layer again there (activation checkpointing per layer): the values
    /// and gradients are the same, the activations held are one
    /// `[B, T, hidden]` per layer instead of every intermediate.
    pub fn with_layer_checkpoints(mut self, on: bool) -> Decoder {
        self.checkpoint_layers = on;
        self
    }

    /// The decoder of `config` with `lora`'s adapters, whose tensors follow
    /// the base parameters; refuses targets the model lacks.
    pub fn with_adapters(config: ModelConfig, lora: LoraConfig) -> crate::Result<Decoder> {
        let layers = lora.layers(&config)?;
        let mut decoder = Decoder::new(config);
        decoder.params.extend(adapter_parameters(&layers, lora.rank));
        decoder.adapters = Some(Adapters {
            lora,
            layers: layers.into_iter().map(|l| l.name).collect(),
            per_row: false,
            dropout: None,
        });
        Ok(decoder)
    }

    /// The same decoder whose adapters drop each value of their input with
    /// probability `p` while training (PEFT's `lora_dropout`: `B·A·drop(x)`,
    /// kept values scaled by `1/(1−p)`). A forward given a draw number (a
    /// `u32` scalar after the parameters, [`Decoder::dropout_draw`]) draws
    /// masks from `seed` and that number — every adapted layer its own —
    /// and one given none is the evaluation forward, without dropout. A
    /// decoder without adapters, or `p` outside `[0, 1)`, is refused.
    pub fn with_adapter_dropout(mut self, p: f64, seed: u64) -> crate::Result<Decoder> {
        let bad = |message: String| crate::Error::Config {
            field: "lora.dropout".to_string(),
            message,
        };
        if !(0.0..1.0).contains(&p) {
            return Err(bad(format!("the dropout must be in [0, 1), got {p}")));
        }
        match self.adapters.as_mut() {
            Some(adapters) if !adapters.per_row => {
                adapters.dropout = (p > 0.0).then_some(AdapterDropout { p, seed });
                Ok(self)
            }
            _ => Err(bad("dropout needs a decoder with trained adapters".to_string())),
        }
    }

    /// The probability its adapters drop an input value while training (0: none).
    pub fn adapter_dropout(&self) -> f64 {
        self.adapters.as_ref().and_then(|a| a.dropout).map_or(0.0, |d| d.p)
    }

    /// Adds the draw number of the dropout masks (a `u32` scalar) to
    /// `graph`: the input a training forward of a decoder with adapter
    /// dropout takes after its parameters.
    pub fn dropout_draw(&self, graph: &grpo_xla::trace::Graph) -> Result<Tensor> {
        graph.parameter(ElementType::U32, &[])
    }

    /// The decoder of `config` with `slots` adapters of rank up to `rank`
    /// on every linear layer, held side by side: slot `k`'s `A` is rows
    /// `k·rank..(k+1)·rank` of each layer's `lora_A.weight` `[slots·rank,
    /// in]`, its `B` those columns of `lora_B.weight` `[out, slots·rank]`
    /// (a smaller rank, or a layer an adapter leaves alone, is zeros).
    /// Its forward functions take, after the parameters, each row's
    /// adapter columns `[rows, slots·rank]` ([`Decoder::adapter_columns`]):
    /// a row's adapter's scaling in its slot's columns and zeros elsewhere,
    /// so each row adds `((x·Aᵀ) ⊙ c)·Bᵀ` — its own adapter, or none.
    pub fn with_adapter_slots(config: ModelConfig, slots: usize, rank: usize) -> crate::Result<Decoder> {
        let width = slots * rank;
        let bank = LoraConfig {
            rank: width,
            alpha: width as f64,
            targets: crate::lora::Targets::AllLinear,
            use_rslora: false,
        };
        let mut decoder = Decoder::with_adapters(config, bank)?;
        if let Some(adapters) = decoder.adapters.as_mut() {
            adapters.per_row = true;
        }
        Ok(decoder)
    }

    /// Whether each row picks its adapter ([`Decoder::with_adapter_slots`]).
    pub fn has_adapter_slots(&self) -> bool {
        self.adapters.as_ref().is_some_and(|a| a.per_row)
    }

    /// Adds the rows' adapter columns `[rows, slots·rank]` (f32) to
    /// `graph`: the input a decoder with adapter slots takes after its
    /// parameters.
    pub fn adapter_columns(&self, graph: &grpo_xla::trace::Graph, rows: i64) -> Result<Tensor> {
        let width = self.adapters.as_ref().map_or(0, |a| a.lora.rank) as i64;
        graph.parameter(ElementType::F32, &[rows, width])
    }

    /// The same decoder without adapters (the frozen base of an adapted one).
    pub fn base(&self) -> Decoder {
        Decoder::new(self.config.clone()).with_expert_product(self.expert_product)
    }

    /// Its LoRA settings, when it has adapters.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.adapters.as_ref().map(|a| &a.lora)
    }

    /// The base model's parameters (all of them without adapters).
    pub fn base_parameters(&self) -> &[ParamSpec] {
        &self.params[..self.base_count]
    }

    /// The adapters' tensors (none without adapters).
    pub fn adapter_parameters(&self) -> &[ParamSpec] {
        &self.params[self.base_count..]
    }

    /// `x` through the linear layer `layer` (`model.layers.0.mlp.down_proj`)
    /// and its bias when `bias`, plus its adapter's `(x·Aᵀ)·Bᵀ·s` when it has one.
    fn linear_layer(&self, w: &Weights<'_>, layer: &str, x: &Tensor, bias: bool) -> Result<Tensor> {
        let b = if bias {
            Some(w.get(&format!("{layer}.bias"))?)
        } else {
            None
        };
        let y = linear(x, w.get(&format!("{layer}.weight"))?, b)?;
        match &self.adapters {
            Some(adapters) if adapters.layers.iter().any(|l| l == layer) => {
                let input = match (adapters.dropout, w.draw) {
                    (Some(dropout), Some(draw)) => {
                        let index = adapters.layers.iter().position(|l| l == layer).unwrap_or(0);
                        drop_values(x, dropout, index, draw)?
                    }
                    _ => x.clone(),
                };
                let low = linear(&input, w.get(&format!("{layer}.lora_A.weight"))?, None)?;
                let b_weight = w.get(&format!("{layer}.lora_B.weight"))?;
                match (adapters.per_row, w.columns) {
                    (true, None) => Err(grpo_xla::Error::Trace {
                        op: "decoder",
                        message: "a decoder with adapter slots needs the rows' adapter columns".to_string(),
                    }),
                    (_, Some(columns)) => {
                        let (rows, width) = (low.dims()[0], columns.dims()[1]);
                        let mut shape = vec![1; low.dims().len()];
                        (shape[0], shape[low.dims().len() - 1]) = (rows, width);
                        let picked = low.mul(&columns.convert(low.dtype())?.reshape(&shape)?)?;
                        y.add(&linear(&picked, b_weight, None)?)
                    }
                    (false, None) => {
                        let update = linear(&low, b_weight, None)?;
                        y.add(&update.mul_scalar(adapters.lora.scaling())?)
                    }
                }
            }
            _ => Ok(y),
        }
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Parameter names and shapes, in the order the programs take them.
    pub fn parameters(&self) -> &[ParamSpec] {
        &self.params
    }

    /// Adds every parameter to `graph` as a `dtype` input, in [`Decoder::parameters`] order.
    pub fn parameter_tensors(&self, graph: &grpo_xla::trace::Graph, dtype: ElementType) -> Result<Vec<Tensor>> {
        self.params
            .iter()
            .map(|p| graph.parameter(dtype, &p.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
            .collect()
    }

    /// Wraps traced parameter tensors (in [`Decoder::parameters`] order,
    /// then the rows' adapter columns for a decoder with adapter slots, or
    /// the dropout draw number in a training forward of one with adapter dropout).
    pub fn weights<'a>(&'a self, tensors: &'a [Tensor]) -> Weights<'a> {
        let count = self.params.len();
        let extra = tensors.get(count);
        Weights {
            specs: &self.params,
            tensors: &tensors[..count.min(tensors.len())],
            columns: extra.filter(|_| self.has_adapter_slots()),
            draw: extra.filter(|_| self.adapter_dropout() > 0.0),
        }
    }

    /// The model's RMSNorm of `x` with `weight` (Gemma's offset form for Gemma 3).
    fn norm(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        if self.config.gemma.is_some() {
            offset_rms_norm(x, weight, eps)
        } else {
            rms_norm(x, weight, eps)
        }
    }

    /// cos and sin of the rotary angles for integer `positions` `[B, T]` at
    /// the `inverse` frequencies: `[B, 1, T, head_dim]`.
    fn rotary(&self, positions: &Tensor, dtype: ElementType, inverse: &[f32]) -> Result<(Tensor, Tensor)> {
        let graph = positions.graph();
        let half = inverse.len() as i64;
        let (b, t) = (positions.dims()[0], positions.dims()[1]);
        let inverse = graph.constant(inverse, &[half])?;
        let angles = positions
            .convert(ElementType::F32)?
            .reshape(&[b, t, 1])?
            .mul(&inverse.reshape(&[1, 1, half])?)?;
        let angles = Tensor::concatenate(&[&angles, &angles], 2)?.reshape(&[b, 1, t, 2 * half])?;
        Ok((angles.cos()?.convert(dtype)?, angles.sin()?.convert(dtype)?))
    }

    /// Attention of queries `q` `[B, heads, T, hd]` over keys/values
    /// `[B, kv_heads, S, hd]`, where `allowed` `[B, T, S]` (pred) says which
    /// key each query may see. Softmax in f32, as transformers does. Query
    /// head `h` reads key/value head `h / (heads / kv_heads)` (transformers'
    /// `repeat_kv`), as one product batched over the key/value heads: the
    /// shared keys and values are never copied per query head.
    ///
    /// Batch and key/value heads are merged into one batch dimension, and
    /// each head group's queries stay `[group, T]`: the merging reshapes
    /// materialize transposed projections in row-major order, and the
    /// gradients of keys and values contract a run of two dimensions, which
    /// is what lets XLA's CPU backend run every product of the layer as a
    /// native bf16 GEMM (see `dot_general`).
    pub fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, allowed: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (b, t, s) = (q.dims()[0], q.dims()[2], k.dims()[2]);
        let group = (c.heads / c.kv_heads) as i64;
        let (kv, hd) = (c.kv_heads as i64, c.head_dim as i64);
        let grouped = q.reshape(&[b * kv, group, t, hd])?;
        let (k, v) = (k.reshape(&[b * kv, s, hd])?, v.reshape(&[b * kv, s, hd])?);
        let mut scores = grouped
            .dot_general(&k, &[0], &[0], &[3], &[2])?
            .mul_scalar(c.attention_scale())?
            .convert(ElementType::F32)?;
        if let Some(cap) = c.attention_softcap() {
            scores = soft_cap(&scores, cap)?;
        }
        let allowed = allowed
            .reshape(&[b, 1, 1, t, s])?
            .broadcast_to(&[b, kv, group, t, s])?
            .reshape(scores.dims())?;
        let masked = allowed.select(&scores, &scores.full_like(f64::from(f32::MIN))?)?;
        masked
            .softmax(3)?
            .convert(q.dtype())?
            .dot_general(&v, &[0], &[0], &[3], &[1])?
            .reshape(&[b, kv * group, t, hd])
    }

    /// Logits `[B, T, vocab]` (f32) of token `ids` `[B, T]` at `positions`
    /// `[B, T]`, where `mask` `[B, T]` (pred) marks real tokens: each token
    /// attends to the real tokens at or before it.
    pub fn logits(&self, tensors: &[Tensor], ids: &Tensor, positions: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let masks = Masks::new(&self.config, causal_mask(mask)?, positions, positions)?;
        let (hidden, _) = self.masked_forward(tensors, ids, positions, &masks)?;
        self.head(tensors, &hidden)
    }

    /// The vocabulary projection of final hidden states, as f32 logits
    /// (soft-capped for Gemma 2).
    fn head(&self, tensors: &[Tensor], hidden: &Tensor) -> Result<Tensor> {
        let logits = linear(hidden, self.head_weight(tensors)?, None)?.convert(ElementType::F32)?;
        match self.config.final_softcap() {
            Some(cap) => soft_cap(&logits, cap),
            None => Ok(logits),
        }
    }

    /// `lm_head.weight`, or the embeddings when they are tied.
    fn head_weight<'a>(&'a self, tensors: &'a [Tensor]) -> Result<&'a Tensor> {
        let name = if self.config.tie_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        self.weights(tensors).get(name)
    }

    /// Types of a KV cache for `batch` sequences of up to `capacity` tokens:
    /// per layer, keys then values, each `[batch, kv_heads, capacity, head_dim]`.
    pub fn cache_types(&self, batch: i64, capacity: i64, dtype: ElementType) -> Vec<TensorType> {
        let c = &self.config;
        let dims = [batch, c.kv_heads as i64, capacity, c.head_dim as i64];
        (0..2 * c.layers).map(|_| TensorType::new(dtype, dims)).collect()
    }

    /// Logits of `ids` `[B, T]` at `positions` `[B, T]` attending through a
    /// KV cache of at least `B` rows (as [`Decoder::cache_types`], keys then
    /// values per layer): row `b` of the cache is sequence `b`. The new keys
    /// and values are written at their positions (−1: a padding token that
    /// writes nothing), then each token attends to the cached positions at
    /// or before its own among the first `window` — later positions are
    /// never read, so a program for short sequences skips the rest of the
    /// cache. Returns the logits and the updated (whole) cache. Prefill (T
    /// tokens) and decode (T = 1) are the same function with other shapes.
    pub fn logits_with_cache(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        cache: &[Tensor],
        window: i64,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let (hidden, updated, _) = self.cached_forward(tensors, ids, positions, CacheRows::First, cache, window)?;
        Ok((self.head(tensors, &hidden)?, updated))
    }

    /// [`Decoder::logits_with_cache`] with the experts each token is routed
    /// to by every sparse layer, `[sparse layers, B, T, k]` (s32), as the
    /// engine's programs route it — to compare with a scoring forward's
    /// routing ([`Decoder::expert_choices`]). A model without sparse layers
    /// is refused.
    pub fn routed_logits_with_cache(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        cache: &[Tensor],
        window: i64,
    ) -> Result<(Tensor, Vec<Tensor>, Tensor)> {
        let (hidden, updated, routings) =
            self.cached_forward(tensors, ids, positions, CacheRows::First, cache, window)?;
        let choices = stacked_choices(&routings, ids.dims())?;
        Ok((self.head(tensors, &hidden)?, updated, choices))
    }

    /// The experts each token of `ids` `[B, T]` (real where `mask`) is
    /// routed to by every sparse layer in a scoring forward
    /// ([`Decoder::token_logprobs`]'s), `[sparse layers, B, T, k]` (s32).
    /// A model without sparse layers is refused.
    pub fn expert_choices(&self, tensors: &[Tensor], ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (_, routings) = self.scoring_forward(tensors, ids, mask)?;
        stacked_choices(&routings, ids.dims())
    }

    /// The cache with the keys and values of `ids` `[B, T]` at `positions`
    /// `[B, T]` written into row `rows[b]` (`[B]`; −1 and position −1 write
    /// nothing), each token attending to its row's cached positions at or
    /// before its own among the first `window`: what continuing cached
    /// sequences by some tokens leaves in the cache. No output head.
    pub fn extend_cache(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        rows: &Tensor,
        cache: &[Tensor],
        window: i64,
    ) -> Result<Vec<Tensor>> {
        let (_, updated, _) = self.cached_forward(tensors, ids, positions, CacheRows::Chosen(rows), cache, window)?;
        Ok(updated)
    }

    /// The decoder stack over a KV cache: the final hidden states of `ids`,
    /// the cache with their keys and values written (see
    /// [`Decoder::logits_with_cache`]) and the sparse layers' routings.
    fn cached_forward(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        rows: CacheRows<'_>,
        cache: &[Tensor],
        window: i64,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Routing>)> {
        let graph = ids.graph();
        let (b, t) = (ids.dims()[0], ids.dims()[1]);
        let visible = graph.iota(ElementType::S32, &[1, window], 1)?;
        let allowed = visible.reshape(&[1, 1, window])?.le(&positions.reshape(&[b, t, 1])?)?;
        let masks = Masks::new(&self.config, allowed, positions, &visible)?;
        let row_ids = match rows {
            CacheRows::First => graph.iota(ElementType::S32, &[b], 0)?,
            CacheRows::Chosen(rows) => rows.clone(),
        };
        let read = |full: &Tensor| -> Result<Tensor> {
            let d = full.dims();
            match rows {
                CacheRows::First => full.slice(&[0, 0, 0, 0], &[b, d[1], window, d[3]], &[1, 1, 1, 1]),
                CacheRows::Chosen(rows) => {
                    let dims = GatherDims {
                        offset_dims: vec![1, 2, 3],
                        collapsed_slice_dims: vec![0],
                        start_index_map: vec![0],
                        index_vector_dim: 1,
                    };
                    full.gather(&rows.reshape(&[b, 1])?, &dims, &[1, d[1], window, d[3]])
                }
            }
        };
        let mut updated = Vec::with_capacity(cache.len());
        let (hidden, routings) = self.forward(tensors, ids, positions, |layer, q, k, v| {
            let k = write_positions(&cache[2 * layer], &k, &row_ids, positions)?;
            let v = write_positions(&cache[2 * layer + 1], &v, &row_ids, positions)?;
            let context = self.attend(&q, &read(&k)?, &read(&v)?, masks.of(&self.config, layer))?;
            updated.push(k);
            updated.push(v);
            Ok(context)
        })?;
        Ok((hidden, updated, routings))
    }

    /// The keys and values (per layer, keys then values, each `[B, kv, T,
    /// hd]`, RoPE applied) of the prompts `ids` `[B, T]` at `positions`
    /// `[B, T]` (−1 marks padding), each token attending to the real tokens
    /// at or before its position: what a KV cache holds after prefilling
    /// them. The output head is not computed.
    pub fn prompt_kv(&self, tensors: &[Tensor], ids: &Tensor, positions: &Tensor) -> Result<Vec<Tensor>> {
        let (b, t) = (ids.dims()[0], ids.dims()[1]);
        let keys = positions.reshape(&[b, 1, t])?;
        let queries = positions.reshape(&[b, t, 1])?;
        let allowed = keys.le(&queries)?.and(&keys.ge(&keys.zeros_like()?)?)?;
        let masks = Masks::new(&self.config, allowed, positions, positions)?;
        let mut kv = Vec::with_capacity(2 * self.config.layers);
        self.forward(tensors, ids, positions, |layer, q, k, v| {
            let context = self.attend(&q, &k, &v, masks.of(&self.config, layer))?;
            kv.push(k);
            kv.push(v);
            Ok(context)
        })?;
        Ok(kv)
    }

    /// The decoder stack up to the final norm, with the sparse layers'
    /// routings; `attend(layer, q, k, v)` turns the rotated queries, keys
    /// and values of a layer into its attention context `[B, heads, T, head_dim]`.
    fn forward(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        mut attend: impl FnMut(usize, Tensor, Tensor, Tensor) -> Result<Tensor>,
    ) -> Result<(Tensor, Vec<Routing>)> {
        self.stack(tensors, ids, positions, |w, layer, x, rotary| {
            self.layer(w, layer, x, rotary, |q, k, v| attend(layer, q, k, v))
        })
    }

    /// The stack over rows `ids` whose real tokens `mask` marks, each
    /// attending to the real tokens at or before it, at positions counted
    /// over the real tokens (left and right padding both work).
    fn scoring_forward(&self, tensors: &[Tensor], ids: &Tensor, mask: &Tensor) -> Result<(Tensor, Vec<Routing>)> {
        let ones = mask.select(&ids.ones_like()?, &ids.zeros_like()?)?;
        let positions = ones.cumsum(1, false)?.sub(&ones)?;
        let masks = Masks::new(&self.config, causal_mask(mask)?, &positions, &positions)?;
        self.masked_forward(tensors, ids, &positions, &masks)
    }

    /// [`Decoder::forward`] attending within `masks`; with
    /// [`Decoder::with_layer_checkpoints`], each layer keeps only its input
    /// for the backward pass and is computed again there.
    fn masked_forward(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        masks: &Masks,
    ) -> Result<(Tensor, Vec<Routing>)> {
        let c = &self.config;
        if !self.checkpoint_layers {
            return self.forward(tensors, ids, positions, |layer, q, k, v| {
                self.attend(&q, &k, &v, masks.of(c, layer))
            });
        }
        let shared = Rc::new(self.clone());
        self.stack(tensors, ids, positions, |w, layer, x, rotary| {
            checkpointed_layer(&shared, w, layer, x, rotary, masks.of(c, layer))
        })
    }

    /// The embeddings of `ids`, each layer's `layer(weights, index, x,
    /// rotary tables)` in turn, then the final norm; with the sparse
    /// layers' routings in layer order.
    fn stack(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        positions: &Tensor,
        mut layer: impl FnMut(&Weights<'_>, usize, &Tensor, (&Tensor, &Tensor)) -> Result<(Tensor, Option<Routing>)>,
    ) -> Result<(Tensor, Vec<Routing>)> {
        let w = self.weights(tensors);
        let (mut x, rotary) = self.embed(&w, ids, positions)?;
        let mut routings = Vec::new();
        for index in 0..self.config.layers {
            let (next, routing) = layer(&w, index, &x, rotary.of(&self.config, index))?;
            x = next;
            routings.extend(routing);
        }
        Ok((self.norm(&x, w.get("model.norm.weight")?)?, routings))
    }

    /// The scaled token embeddings of `ids` and the rotary tables of `positions`.
    fn embed(&self, w: &Weights<'_>, ids: &Tensor, positions: &Tensor) -> Result<(Tensor, Rotary)> {
        let c = &self.config;
        let embed = w.get("model.embed_tokens.weight")?;
        let global = self.rotary(positions, embed.dtype(), &c.rope_inverse_frequencies())?;
        // Gemma 3's sliding layers rotate at their own base.
        let local = match c.local_rope_inverse_frequencies() {
            Some(inverse) => Some(self.rotary(positions, embed.dtype(), &inverse)?),
            None => None,
        };
        let mut x = embed.take(ids, 0)?;
        if c.gemma.is_some() {
            // √hidden, in the embeddings' dtype (bf16 rounds it, as transformers does).
            x = x.mul_scalar((c.hidden_size as f64).sqrt())?;
        }
        Ok((x, Rotary { global, local }))
    }

    /// Decoder layer `layer` on the residual stream `x` `[B, T, hidden]`,
    /// rotating by `(cos, sin)`; `attend(q, k, v)` gives its attention
    /// context. A sparse layer also returns its tokens' routing.
    fn layer(
        &self,
        w: &Weights<'_>,
        layer: usize,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        attend: impl FnOnce(Tensor, Tensor, Tensor) -> Result<Tensor>,
    ) -> Result<(Tensor, Option<Routing>)> {
        let c = &self.config;
        let (b, t) = (x.dims()[0], x.dims()[1]);
        let (hd, heads, kv) = (c.head_dim as i64, c.heads as i64, c.kv_heads as i64);
        let rope = |x: &Tensor| -> Result<Tensor> { x.mul(cos)?.add(&rotate_half(x)?.mul(sin)?) };
        let p = |leaf: &str| w.get(&format!("model.layers.{layer}.{leaf}"));
        let lin = |leaf: &str, input: &Tensor, bias: bool| {
            self.linear_layer(w, &format!("model.layers.{layer}.{leaf}"), input, bias)
        };
        let project = |name: &str, n: i64, input: &Tensor| -> Result<Tensor> {
            lin(&format!("self_attn.{name}"), input, c.qkv_bias)?
                .reshape(&[b, t, n, hd])?
                .transpose(&[0, 2, 1, 3])
        };
        let h = self.norm(x, p("input_layernorm.weight")?)?;
        let (mut q, mut k, v) = if c.fused_projections {
            // Phi-3: one product, then the query, key and value columns.
            let qkv = lin("self_attn.qkv_proj", &h, false)?;
            let heads_of = |from: i64, n: i64| -> Result<Tensor> {
                qkv.slice_axis(2, from * hd, (from + n) * hd)?
                    .reshape(&[b, t, n, hd])?
                    .transpose(&[0, 2, 1, 3])
            };
            (heads_of(0, heads)?, heads_of(heads, kv)?, heads_of(heads + kv, kv)?)
        } else {
            (
                project("q_proj", heads, &h)?,
                project("k_proj", kv, &h)?,
                project("v_proj", kv, &h)?,
            )
        };
        if c.qk_norm {
            q = self.norm(&q, p("self_attn.q_norm.weight")?)?;
            k = self.norm(&k, p("self_attn.k_norm.weight")?)?;
        }
        let context = attend(rope(&q)?, rope(&k)?, v)?
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[b, t, heads * hd])?;
        let attended = lin("self_attn.o_proj", &context, false)?;
        // Gemma normalizes each branch's output before its residual add.
        let (x, h) = if c.gemma.is_some() {
            let x = x.add(&self.norm(&attended, p("post_attention_layernorm.weight")?)?)?;
            let h = self.norm(&x, p("pre_feedforward_layernorm.weight")?)?;
            (x, h)
        } else {
            let x = x.add(&attended)?;
            let h = self.norm(&x, p("post_attention_layernorm.weight")?)?;
            (x, h)
        };
        if let Some(experts) = c.experts_of(layer) {
            let tokens = h.reshape(&[b * t, h.dims()[2]])?;
            let routing = route(&tokens, p("mlp.gate.weight")?, experts.top_k, experts.normalize_top_k)?;
            let stacked = ExpertWeights {
                gate: p("mlp.experts.gate_proj")?,
                up: p("mlp.experts.up_proj")?,
                down: p("mlp.experts.down_proj")?,
            };
            let mlp = sparse_mlp(&tokens, &routing, &stacked, self.expert_product)?.reshape(x.dims())?;
            return Ok((x.add(&mlp)?, Some(routing)));
        }
        let (gate, up) = if c.fused_projections {
            // Phi-3: the gate's columns, then the up projection's.
            let fused = lin("mlp.gate_up_proj", &h, false)?;
            let i = c.intermediate_size as i64;
            (fused.slice_axis(2, 0, i)?, fused.slice_axis(2, i, 2 * i)?)
        } else {
            (lin("mlp.gate_proj", &h, false)?, lin("mlp.up_proj", &h, false)?)
        };
        let gate = if c.gemma.is_some() {
            gelu_tanh(&gate)?
        } else {
            gate.silu()?
        };
        let mut mlp = lin("mlp.down_proj", &gate.mul(&up)?, false)?;
        if c.gemma.is_some() {
            mlp = self.norm(&mlp, p("post_feedforward_layernorm.weight")?)?;
        }
        Ok((x.add(&mlp)?, None))
    }

    /// Log-probabilities and entropies `[B, last]` (f32) of the last
    /// `last` tokens of each row (at most `T − 1`): entry `j` is
    /// `log p(ids[s+j] | ids[..s+j])` with `s = T − last`, and the entropy
    /// of that distribution; `last = T − 1` scores every token but the
    /// first. The distributions are those of the logits divided by
    /// `temperature` (1: the model's own). Positions come from the mask
    /// (count of real tokens before each one), so left and right padding
    /// both work. Only the scored positions reach the output head, which
    /// runs in chunks of at most [`HEAD_CHUNK`] tokens with a recomputing
    /// gradient, so `[B, T, vocab]` logits are never held.
    pub fn token_logprobs(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        mask: &Tensor,
        last: i64,
        temperature: f64,
    ) -> Result<TokenScores> {
        let (b, t) = (ids.dims()[0], ids.dims()[1]);
        if !(1..t).contains(&last) {
            return Err(grpo_xla::Error::Trace {
                op: "token_logprobs",
                message: format!("cannot score the last {last} of {t} tokens (1 ≤ last < T)"),
            });
        }
        let (hidden, routings) = self.scoring_forward(tensors, ids, mask)?;
        // Hidden states at positions s − 1 … T − 2 predict tokens s … T − 1.
        let first = t - last;
        let scoring = hidden.slice_axis(1, first - 1, t - 1)?;
        let targets = ids.slice_axis(1, first, t)?;
        let (logprobs, entropy) = self.score(tensors, &scoring, &targets, temperature)?;
        Ok(TokenScores {
            logprobs: logprobs.reshape(&[b, last])?,
            entropy: entropy.reshape(&[b, last])?,
            balance: balance(&routings, mask)?,
        })
    }

    /// [`Decoder::token_logprobs`] of `slots` completions per row that share
    /// the row's prompt, held once: each row of `ids` / `mask` `[B, P + slots·C]`
    /// is the prompt right-aligned in its first `prompt` columns (left
    /// padding), then `slots` completions of `C` columns each (right
    /// padding). Completion `s` attends to the prompt and to its own earlier
    /// tokens only, at the positions it would have after the prompt alone,
    /// so its log-probs are those of the sequence prompt + completion `s`;
    /// the prompt's forward (and its share of the backward) is computed
    /// once instead of `slots` times. Returns `[B·slots, C]`: row
    /// `b·slots + s` is completion `s` of row `b`, entry `j` the log-prob of
    /// its token `j` given the prompt and its tokens before `j`.
    pub fn shared_prompt_logprobs(
        &self,
        tensors: &[Tensor],
        ids: &Tensor,
        mask: &Tensor,
        prompt: i64,
        slots: i64,
        temperature: f64,
    ) -> Result<TokenScores> {
        let (b, t) = (ids.dims()[0], ids.dims()[1]);
        let c = if slots >= 1 && prompt >= 1 {
            (t - prompt) / slots
        } else {
            0
        };
        if c < 1 || prompt + slots * c != t {
            return Err(grpo_xla::Error::Trace {
                op: "shared_prompt_logprobs",
                message: format!("{t} columns are not a {prompt}-token prompt and {slots} equal completion slots"),
            });
        }
        let graph = ids.graph();
        // The prompt's positions count its real tokens; completion token j is at prompt length + j.
        let ones = mask.select(&ids.ones_like()?, &ids.zeros_like()?)?;
        let prompt_ones = ones.slice_axis(1, 0, prompt)?;
        let prompt_positions = prompt_ones.cumsum(1, false)?.sub(&prompt_ones)?;
        let prompt_length = prompt_ones.sum(&[1])?.reshape(&[b, 1])?;
        let offsets = graph.iota(ElementType::S32, &[slots, c], 1)?.reshape(&[1, slots * c])?;
        let completion_positions = offsets.convert(ids.dtype())?.add(&prompt_length)?;
        let positions = Tensor::concatenate(&[&prompt_positions, &completion_positions], 1)?;
        // Query i sees key j ≤ i when j is in the prompt or in i's slot (which starts at `start[i]`).
        let start: Vec<i32> = (0..t)
            .map(|i| {
                if i < prompt {
                    0
                } else {
                    (prompt + (i - prompt) / c * c) as i32
                }
            })
            .collect();
        let col = graph.iota(ElementType::S32, &[t, t], 1)?;
        let start = graph.constant(&start, &[t, 1])?.broadcast_to(&[t, t])?;
        let in_prompt = col.lt(&graph.full(prompt as f64, ElementType::S32, &[t, t])?)?;
        let shared = in_prompt.or(&col.ge(&start)?)?.reshape(&[1, t, t])?;
        let allowed = causal_mask(mask)?.and(&shared)?;
        let masks = Masks::new(&self.config, allowed, &positions, &positions)?;
        let (hidden, routings) = self.masked_forward(tensors, ids, &positions, &masks)?;
        // Token 0 of every slot is predicted by the prompt's last hidden state,
        // token j > 0 by its slot's token j − 1.
        let width = hidden.dims()[2];
        let last_prompt = hidden
            .slice_axis(1, prompt - 1, prompt)?
            .reshape(&[b, 1, 1, width])?
            .broadcast_to(&[b, slots, 1, width])?;
        let completions = hidden.slice_axis(1, prompt, t)?.reshape(&[b, slots, c, width])?;
        let scoring = Tensor::concatenate(&[&last_prompt, &completions.slice_axis(2, 0, c - 1)?], 2)?;
        let targets = ids.slice_axis(1, prompt, t)?;
        let (logprobs, entropy) = self.score(tensors, &scoring, &targets, temperature)?;
        Ok(TokenScores {
            logprobs: logprobs.reshape(&[b * slots, c])?,
            entropy: entropy.reshape(&[b * slots, c])?,
            balance: balance(&routings, mask)?,
        })
    }

    /// Log-probs and entropies (flat) of `targets` (any shape) at
    /// temperature `temperature` under the output head applied to `hidden`
    /// (`targets`' shape + `[width]`), in chunks of at most [`HEAD_CHUNK`] tokens.
    fn score(
        &self,
        tensors: &[Tensor],
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
    ) -> Result<(Tensor, Tensor)> {
        let width = hidden.dims()[hidden.rank() - 1];
        let tokens: i64 = targets.dims().iter().product();
        let chunk = (1..=HEAD_CHUNK).rev().find(|&c| tokens % c == 0).unwrap_or(1);
        linear_log_probs(
            &hidden.reshape(&[tokens, width])?,
            self.head_weight(tensors)?,
            &targets.reshape(&[tokens])?,
            chunk,
            HeadScale {
                temperature,
                softcap: self.config.final_softcap(),
            },
        )
    }
}
