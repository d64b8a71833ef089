//! The engine's three compiled programs and their shape buckets.
//!
//! The device state they share (all donated where they change it):
//! - the KV cache: per layer keys then values, `[slots, kv_heads,
//!   max_model_len, head_dim]` in the parameter dtype — row `s` is slot `s`;
//! - the token history of each slot, `[slots, vocab]` f32 each: output
//!   token counts, prompt-token marks, stop-token marks (see
//!   [`TokenHistory`]).
//!
//! Programs:
//! - **prefill** (buckets: prompts `P` and tokens `T`, powers of two; `T`
//!   ≥ the prompt lengths): the keys and values of each prompt's tokens
//!   but its last, written into its slot from position 0; the slot's
//!   history reset (prompt marks, stop marks, zero counts). No output
//!   head: the last prompt token is fed by the next decode step, which
//!   samples from it.
//! - **extend** (buckets: sequences `P`, new tokens `T` and attention
//!   window `W`, powers of two): continues sequences whose slots hold the
//!   keys and values of their prompts' first positions — the new tokens
//!   but the last written after them, attending to them — and resets each
//!   slot's history as a prefill of the whole prompt does.
//! - **write adapter** (one per engine): writes one adapter into its slot
//!   of the parameters of a decoder with adapter slots (see
//!   [`crate::adapters`]).
//! - **fork** (bucket `T`): copies a slot's first `T` cache positions and
//!   its history into another slot — the other samples of a group start
//!   from one prefill, and a prompt from a prefix another slot holds.
//! - **decode** (buckets: rows `B` and attention window `W`, powers of two;
//!   the cheapest [`SamplerKind`] the rows need; reading the token history
//!   only while a row has a penalty or suppresses its stop tokens; with or without top
//!   log-probs; with or without the rows' allowed-token bitmasks, present
//!   only while a guided sample runs): one token for each of slots `0..B`
//!   (position −1 = idle row, writes nothing), sampled with the rows'
//!   settings; returns tokens, raw log-probs (and the top-k), and adds each
//!   token to its slot's counts.
//!
//! With adapter slots, prefill, extend and decode come in two kinds: one
//! that runs the base decoder alone (every row unadapted) and one that
//! takes the adapter banks and each row's adapter columns after the base
//! parameters (`adapted` in the key).

use std::collections::HashMap;

use grpo_model::decoder::Decoder;
use grpo_xla::trace::{Graph, ScatterDims, Tensor};
use grpo_xla::{Buffer, Client, CompileOptions, Device, ElementType, Executable, TensorType};

use crate::error::Result;
use crate::request::MAX_TOP_LOGPROBS;
use crate::sampling::{SamplerKind, SamplingInputs, TokenHistory, sample, top_logprobs, unpack_allowed};

/// The smallest prefill bucket (prompt tokens).
const MIN_PREFILL: usize = 8;
/// The smallest attention window of decode.
const MIN_WINDOW: usize = 16;

/// A compiled program's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ProgramKey {
    /// Prefill of up to `prompts` prompts of up to `tokens` tokens each.
    Prefill {
        prompts: usize,
        tokens: usize,
        adapted: bool,
    },
    /// Extension of up to `prompts` cached sequences by up to `tokens`
    /// tokens each, attending within `window` positions.
    Extend {
        prompts: usize,
        tokens: usize,
        window: usize,
        adapted: bool,
    },
    /// Fork of the first `tokens` cache positions.
    Fork { tokens: usize },
    /// The write of one adapter into its slot of `rank` rows and columns.
    WriteAdapter { rank: usize },
    /// Decode of one token for slots `0..rows`.
    Decode(DecodeKey),
}

/// The shape of a decode program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DecodeKey {
    /// Slots `0..rows` are decoded.
    pub rows: usize,
    /// Attention within the first `window` cache positions.
    pub window: usize,
    /// The cheapest sampler the rows need.
    pub sampler: SamplerKind,
    /// Whether a row reads its token history (a penalty, or stop tokens
    /// still suppressed); without, the history is neither read nor
    /// needed (the counts are kept either way).
    pub history: bool,
    /// Whether the top log-probs are returned.
    pub top: bool,
    /// Whether the rows' allowed-token bitmasks are taken (guided rows).
    pub guided: bool,
    /// Whether the adapter banks and the rows' adapter columns are taken.
    pub adapted: bool,
}

/// The fewest rows a decode program has for `dtype` parameters. XLA's CPU
/// matrix-vector product in bf16 is about 5x slower than its two-row
/// matrix product (a SmolLM2 step: 147 vs 31 ms), while in f32 the one-row
/// product is the faster (31 vs 57 ms).
pub(crate) fn min_rows(dtype: ElementType) -> usize {
    if dtype == ElementType::Bf16 { 2 } else { 1 }
}

/// The power-of-two bucket holding `n`, at least `min`, at most `max`.
fn bucket(n: usize, min: usize, max: usize) -> usize {
    n.next_power_of_two().max(min).min(max)
}

/// The engine's programs, compiled on first use and kept.
pub(crate) struct Programs {
    client: Client,
    /// Where they run: the device of the engine's weights.
    options: CompileOptions,
    decoder: Decoder,
    dtype: ElementType,
    slots: usize,
    capacity: usize,
    compiled: HashMap<ProgramKey, Executable>,
}

impl Programs {
    /// Programs on `device` for `slots` sequences of up to `capacity`
    /// tokens with `dtype` parameters (the state has at least [`min_rows`] rows).
    pub fn new(
        client: &Client,
        device: &Device,
        decoder: Decoder,
        dtype: ElementType,
        slots: usize,
        capacity: usize,
    ) -> Programs {
        Programs {
            client: client.clone(),
            options: CompileOptions::on_device(device),
            decoder,
            dtype,
            slots: slots.max(min_rows(dtype)),
            capacity,
            compiled: HashMap::new(),
        }
    }

    /// The decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The prefill bucket for `count` prompts prefilled together.
    pub fn prefill_rows(&self, count: usize) -> usize {
        bucket(count, 1, self.slots)
    }

    /// The prefill (and fork) bucket of a prompt of `len` tokens.
    pub fn prefill_bucket(&self, len: usize) -> usize {
        bucket(len, MIN_PREFILL, self.capacity)
    }

    /// The attention window bucket of sequences of up to `len` tokens.
    pub fn window_bucket(&self, len: usize) -> usize {
        bucket(len, MIN_WINDOW, self.capacity)
    }

    /// The decode buckets for a highest busy slot `top_slot` and a longest
    /// sequence (after this step's token) of `len` tokens.
    pub fn decode_bucket(&self, top_slot: usize, len: usize) -> (usize, usize) {
        (
            bucket(top_slot + 1, min_rows(self.dtype), self.slots),
            self.window_bucket(len),
        )
    }

    /// Types of the device state, in program order: cache, then counts, prompt marks, stop marks.
    pub fn state_types(&self) -> Vec<TensorType> {
        let mut types = self
            .decoder
            .cache_types(self.slots as i64, self.capacity as i64, self.dtype);
        let history = TensorType::new(ElementType::F32, [self.slots as i64, self.vocab()]);
        types.extend(std::iter::repeat_n(history, 3));
        types
    }

    /// The device state, zeroed on the device (no host copy of the cache is made).
    pub fn zero_state(&self) -> Result<Vec<Buffer>> {
        self.zeros(&self.state_types())
    }

    /// Tensors of `types`, zeroed on the device.
    pub fn zeros(&self, types: &[TensorType]) -> Result<Vec<Buffer>> {
        let graph = Graph::new("engine_zeros");
        let zeros: Vec<Tensor> = types
            .iter()
            .map(|ty| graph.full(0.0, ty.dtype, &ty.dims))
            .collect::<grpo_xla::Result<_>>()?;
        let program = graph
            .build(&zeros.iter().collect::<Vec<_>>())?
            .compile_with(&self.client, &self.options)?;
        Ok(program.execute(&[])?)
    }

    fn vocab(&self) -> i64 {
        self.decoder.config().vocab_size as i64
    }

    /// The program of `key`, compiling it the first time.
    pub fn get(&mut self, key: ProgramKey) -> Result<&Executable> {
        if !self.compiled.contains_key(&key) {
            let program = match key {
                ProgramKey::Prefill {
                    prompts,
                    tokens,
                    adapted,
                } => self.prefill(prompts as i64, tokens as i64, adapted)?,
                ProgramKey::Extend {
                    prompts,
                    tokens,
                    window,
                    adapted,
                } => self.extend(prompts as i64, tokens as i64, window as i64, adapted)?,
                ProgramKey::Fork { tokens } => self.fork(tokens as i64)?,
                ProgramKey::WriteAdapter { rank } => self.write_adapter(rank as i64)?,
                ProgramKey::Decode(key) => self.decode(key)?,
            };
            self.compiled.insert(key, program);
        }
        Ok(&self.compiled[&key])
    }

    /// The weights a program of kind `adapted` takes, as inputs of
    /// `graph` for `rows` rows: the decoder's parameters (the base
    /// model's alone for an unadapted program of a decoder with adapter
    /// slots), then the rows' adapter columns when the decoder has slots
    /// and the program is adapted. Returns the traced decoder too.
    fn weights(&self, graph: &Graph, rows: i64, adapted: bool) -> Result<(Decoder, Vec<Tensor>)> {
        let slots = self.decoder.has_adapter_slots();
        let decoder = if slots && !adapted {
            self.decoder.base()
        } else {
            self.decoder.clone()
        };
        let mut params = decoder.parameter_tensors(graph, self.dtype)?;
        if slots && adapted {
            params.push(decoder.adapter_columns(graph, rows)?);
        }
        Ok((decoder, params))
    }

    /// The state as parameters of `graph`.
    fn state_parameters(&self, graph: &Graph) -> Result<Vec<Tensor>> {
        Ok(self
            .state_types()
            .iter()
            .map(|ty| graph.parameter(ty.dtype, &ty.dims))
            .collect::<grpo_xla::Result<_>>()?)
    }

    /// `(params, ids [P,T], positions [P,T], prompt_rows [P,V], stop_rows
    /// [P,V], slots [P], state) → state`: prompt `p`'s keys and values
    /// written into slot `slots[p]` from position 0 and its history reset;
    /// a slot of −1 (a padding prompt) writes nothing.
    fn prefill(&self, p: i64, t: i64, adapted: bool) -> Result<Executable> {
        let graph = Graph::new(&format!("engine_prefill_{p}x{t}{}", adapted_name(adapted)));
        let (decoder, params) = self.weights(&graph, p, adapted)?;
        let ids = graph.parameter(ElementType::S32, &[p, t])?;
        let positions = graph.parameter(ElementType::S32, &[p, t])?;
        let prompt_rows = graph.parameter(ElementType::F32, &[p, self.vocab()])?;
        let stop_rows = graph.parameter(ElementType::F32, &[p, self.vocab()])?;
        let slots = graph.parameter(ElementType::S32, &[p])?;
        let state = self.state_parameters(&graph)?;
        let layers = state.len() - 3;
        let kv = decoder.prompt_kv(&params, &ids, &positions)?;
        let at_slot = slots.reshape(&[p, 1])?;
        let mut outputs: Vec<Tensor> = state[..layers]
            .iter()
            .zip(&kv)
            .map(|(cache, new)| cache.scatter(&at_slot, new, &whole_rows(4)))
            .collect::<grpo_xla::Result<_>>()?;
        outputs.extend(reset_history(&state[layers..], &at_slot, &prompt_rows, &stop_rows)?);
        let first_state = params.len() + 5;
        let function = graph
            .build(&outputs.iter().collect::<Vec<_>>())?
            .donate_range_from(first_state, 0..outputs.len())?;
        Ok(function.compile_with(&self.client, &self.options)?)
    }

    /// `(params, ids [P,T], positions [P,T], prompt_rows [P,V], stop_rows
    /// [P,V], slots [P], state) → state`: sequence `p`'s new tokens written
    /// into slot `slots[p]` at their positions (−1: padding), attending to
    /// what the slot holds within the first `window` positions; the slot's
    /// history reset as a prefill's. A slot of −1 writes nothing.
    fn extend(&self, p: i64, t: i64, window: i64, adapted: bool) -> Result<Executable> {
        let graph = Graph::new(&format!("engine_extend_{p}x{t}x{window}{}", adapted_name(adapted)));
        let (decoder, params) = self.weights(&graph, p, adapted)?;
        let ids = graph.parameter(ElementType::S32, &[p, t])?;
        let positions = graph.parameter(ElementType::S32, &[p, t])?;
        let prompt_rows = graph.parameter(ElementType::F32, &[p, self.vocab()])?;
        let stop_rows = graph.parameter(ElementType::F32, &[p, self.vocab()])?;
        let slots = graph.parameter(ElementType::S32, &[p])?;
        let state = self.state_parameters(&graph)?;
        let layers = state.len() - 3;
        let mut outputs = decoder.extend_cache(&params, &ids, &positions, &slots, &state[..layers], window)?;
        let at_slot = slots.reshape(&[p, 1])?;
        outputs.extend(reset_history(&state[layers..], &at_slot, &prompt_rows, &stop_rows)?);
        let first_state = params.len() + 5;
        let function = graph
            .build(&outputs.iter().collect::<Vec<_>>())?
            .donate_range_from(first_state, 0..outputs.len())?;
        Ok(function.compile_with(&self.client, &self.options)?)
    }

    /// `(src, dst, state) → state` with slot `dst` a copy of slot `src`
    /// (its first `t` cache positions and its history).
    fn fork(&self, t: i64) -> Result<Executable> {
        let graph = Graph::new(&format!("engine_fork_{t}"));
        let src = graph.parameter(ElementType::S32, &[])?;
        let dst = graph.parameter(ElementType::S32, &[])?;
        let state = self.state_parameters(&graph)?;
        let zero = src.zeros_like()?;
        let outputs: Vec<Tensor> = state
            .iter()
            .map(|x| {
                let mut sizes = x.dims().to_vec();
                sizes[0] = 1;
                if sizes.len() == 4 {
                    sizes[2] = t;
                }
                let mut starts = vec![&src; sizes.len()];
                starts[1..].fill(&zero);
                let copied = x.dynamic_slice(&starts, &sizes)?;
                starts[0] = &dst;
                x.dynamic_update_slice(&copied, &starts)
            })
            .collect::<grpo_xla::Result<_>>()?;
        let function = graph
            .build(&outputs.iter().collect::<Vec<_>>())?
            .donate_range_from(2, 0..outputs.len())?;
        Ok(function.compile_with(&self.client, &self.options)?)
    }

    /// `(params, ids [B,1], positions [B,1], sampling inputs, [allowed
    /// words [B, ⌈V/32⌉] u32], state) → (tokens, log-probs, [top ids, top
    /// log-probs], cache, counts)`.
    fn decode(&self, key: DecodeKey) -> Result<Executable> {
        let (b, window) = (key.rows as i64, key.window as i64);
        let top_name = if key.top { "_top" } else { "" };
        let guided_name = if key.guided { "_guided" } else { "" };
        let history_name = if key.history { "_history" } else { "" };
        let graph = Graph::new(&format!(
            "engine_decode_{b}x{window}_{:?}{history_name}{top_name}{guided_name}{}",
            key.sampler,
            adapted_name(key.adapted)
        ));
        let (decoder, params) = self.weights(&graph, b, key.adapted)?;
        let ids = graph.parameter(ElementType::S32, &[b, 1])?;
        let positions = graph.parameter(ElementType::S32, &[b, 1])?;
        let mut settings = SamplingInputs::parameters(&graph, b)?;
        let words = crate::guided::Grammars::words(self.vocab() as usize) as i64;
        let allowed = if key.guided {
            let words = graph.parameter(ElementType::U32, &[b, words])?;
            settings.push(words.clone());
            Some(unpack_allowed(&words, self.vocab())?)
        } else {
            None
        };
        let state = self.state_parameters(&graph)?;
        let layers = state.len() - 3;
        let (logits, cache) = decoder.logits_with_cache(&params, &ids, &positions, &state[..layers], window)?;
        let logits = logits.reshape(&[b, self.vocab()])?;
        let rows = |x: &Tensor| x.slice(&[0, 0], &[b, self.vocab()], &[1, 1]);
        let inputs = SamplingInputs::from_tensors(&settings);
        let (tokens, scored) = if key.history {
            let history = TokenHistory {
                output_counts: &rows(&state[layers])?,
                in_prompt: &rows(&state[layers + 1])?,
                stop_tokens: &rows(&state[layers + 2])?,
            };
            sample(&logits, &inputs, Some(&history), key.sampler, allowed.as_ref())?
        } else {
            sample(&logits, &inputs, None, key.sampler, allowed.as_ref())?
        };
        let logprobs = scored.gathered_log_probs(&tokens)?;
        let new_counts = count_tokens(&state[layers], &tokens, &positions)?;
        let mut outputs = vec![tokens, logprobs];
        if key.top {
            let (ids, values) = top_logprobs(&scored, MAX_TOP_LOGPROBS as i64)?;
            outputs.extend([ids, values]);
        }
        let first_result = outputs.len();
        outputs.extend(cache);
        outputs.push(new_counts);
        let first_state = params.len() + 2 + settings.len();
        let function = graph
            .build(&outputs.iter().collect::<Vec<_>>())?
            .donate_range_from(first_state, first_result..outputs.len())?;
        Ok(function.compile_with(&self.client, &self.options)?)
    }

    /// `(banks, offset, slot tensors) → banks`: each bank (the adapter
    /// parameters of a decoder with adapter slots, donated) with one
    /// slot's tensors (`[rank, in]` and `[out, rank]`) written at
    /// `offset` — rows of an `A` `[slots·rank, in]`, columns of a `B`
    /// `[out, slots·rank]`.
    fn write_adapter(&self, rank: i64) -> Result<Executable> {
        let graph = Graph::new("engine_write_adapter");
        let specs = self.decoder.adapter_parameters();
        let banks: Vec<Tensor> = specs
            .iter()
            .map(|s| graph.parameter(self.dtype, &[s.dims[0] as i64, s.dims[1] as i64]))
            .collect::<grpo_xla::Result<_>>()?;
        let offset = graph.parameter(ElementType::S32, &[])?;
        let zero = offset.zeros_like()?;
        let outputs: Vec<Tensor> = banks
            .iter()
            .zip(specs)
            .map(|(bank, spec)| {
                let is_a = spec.name.ends_with(".lora_A.weight");
                let (rows, cols) = (spec.dims[0] as i64, spec.dims[1] as i64);
                let dims = if is_a { [rank, cols] } else { [rows, rank] };
                let slot = graph.parameter(self.dtype, &dims)?;
                let starts = if is_a { [&offset, &zero] } else { [&zero, &offset] };
                bank.dynamic_update_slice(&slot, &starts)
            })
            .collect::<grpo_xla::Result<_>>()?;
        let function = graph
            .build(&outputs.iter().collect::<Vec<_>>())?
            .donate_range_from(0, 0..outputs.len())?;
        Ok(function.compile_with(&self.client, &self.options)?)
    }

    /// Number of programs compiled so far.
    pub fn compiled(&self) -> usize {
        self.compiled.len()
    }
}

/// `counts` `[slots, V]` with one more of `tokens[b]` (s32 `[B]`) in row
/// `b` of each busy row (`positions` `[B, 1]` ≥ 0): a scatter of `B`
/// values, not a pass over the vocabulary.
fn count_tokens(counts: &Tensor, tokens: &Tensor, positions: &Tensor) -> grpo_xla::Result<Tensor> {
    let b = tokens.dims()[0];
    let rows = counts.graph().iota(ElementType::S32, &[b, 1], 0)?;
    let indices = Tensor::concatenate(&[&rows, &tokens.reshape(&[b, 1])?], 1)?;
    let positions = positions.reshape(&[b])?;
    let busy = positions.ge(&positions.zeros_like()?)?;
    let zeros = tokens.convert(ElementType::F32)?.zeros_like()?;
    let ones = busy.select(&zeros.ones_like()?, &zeros)?;
    let dims = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: vec![0, 1],
        scatter_dims_to_operand_dims: vec![0, 1],
        index_vector_dim: 1,
    };
    counts.scatter_add(&indices, &ones, &dims)
}

/// The name suffix of an adapted program.
fn adapted_name(adapted: bool) -> &'static str {
    if adapted { "_adapted" } else { "" }
}

/// Scatter dimensions that write whole rows of a rank-`rank` state at
/// indices `[P, 1]` (a prompt's cache block, or a history row, at its slot).
fn whole_rows(rank: usize) -> ScatterDims {
    ScatterDims {
        update_window_dims: (1..rank).collect(),
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
    }
}

/// The history tables `[counts, prompt marks, stop marks]` (`[S, V]`
/// each) with rows `at_slot` (`[P, 1]`; −1 writes nothing) reset for new
/// prompts: counts zeroed, prompt and stop marks from `prompt_rows` and
/// `stop_rows` (`[P, V]`).
fn reset_history(
    history: &[Tensor],
    at_slot: &Tensor,
    prompt_rows: &Tensor,
    stop_rows: &Tensor,
) -> Result<Vec<Tensor>> {
    let rows = whole_rows(2);
    Ok(vec![
        history[0].scatter(at_slot, &stop_rows.zeros_like()?, &rows)?,
        history[1].scatter(at_slot, prompt_rows, &rows)?,
        history[2].scatter(at_slot, stop_rows, &rows)?,
    ])
}

/// A `[B, 1]`-or-`[B]` host vector uploaded as `dims` to `device`.
pub(crate) fn upload<T: grpo_xla::NativeType>(
    client: &Client,
    device: &Device,
    values: &[T],
    dims: &[i64],
) -> Result<Buffer> {
    Ok(client.buffer_from_host(values, dims, device)?)
}
