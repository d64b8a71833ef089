//! The generation engine: continuous batching of requests over a per-slot
//! contiguous KV cache on the device (`max_num_seqs` slots).
//!
//! One program shape serves prefill and decode: `(params, ids [B, T],
//! positions [B, T], last [B], sampling inputs, cache) → (tokens [B],
//! log-probs [B], cache')` with the cache donated. A position of −1 marks
//! "no token here": nothing is written to the cache and nothing attends to
//! it, so idle slots and prompt padding cost compute but never change
//! results. Prefill uses `T` = the prompt-length bucket (a power of two),
//! decode `T = 1`; every program is compiled once.
//!
//! Memory: the cache holds `2 · layers · max_num_seqs · kv_heads ·
//! max_model_len · head_dim` elements of the parameter dtype; slots are
//! reused without clearing, because a slot's positions up to its current
//! length are always rewritten by its own request before they are read.

use std::collections::HashMap;

use grpo_model::decoder::Decoder;
use grpo_xla::trace::{Graph, Tensor};
use grpo_xla::{Arg, Buffer, Client, ElementType, Executable};

use crate::error::{Error, Result};
use crate::sampling::{SamplingInputs, sample};

/// How big the engine is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// Sequences decoded together (cache slots). Default 8.
    pub max_num_seqs: usize,
    /// Longest prompt + completion. Default 1024.
    pub max_model_len: usize,
    /// Parameter and cache dtype. Default f32.
    pub dtype: ElementType,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 8,
            max_model_len: 1024,
            dtype: ElementType::F32,
        }
    }
}

/// How one request is sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    /// 0 keeps all tokens.
    pub top_k: i32,
    /// In (0, 1].
    pub top_p: f32,
    /// In [0, 1).
    pub min_p: f32,
    /// The request's seed.
    pub seed: u32,
    /// Tokens that end the completion (the model's EOS is added unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past EOS.
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: 16,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// A prompt and how to continue it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub params: SamplingParams,
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated (it is the last token).
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

/// A finished completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Each token's log-prob under the unmodified policy.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// The engine: weights, cache and compiled programs on one device.
pub struct Engine {
    client: Client,
    decoder: Decoder,
    config: EngineConfig,
    eos: Vec<u32>,
    params: Vec<Buffer>,
    cache: Vec<Buffer>,
    programs: HashMap<i64, Executable>,
}

/// The request a cache slot is serving.
struct Slot {
    index: usize,
    length: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
}

impl Slot {
    fn new(index: usize, length: usize) -> Slot {
        Slot {
            index,
            length,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
        }
    }
}

/// The sampler's inputs for one slot of a step (idle slots: greedy, seed 0).
#[derive(Debug, Clone, Copy)]
struct RowSettings {
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    seed: u32,
    step: u32,
}

/// The sampler's inputs of every slot.
fn row_settings(requests: &[Request], slots: &[Option<Slot>]) -> Vec<RowSettings> {
    slots
        .iter()
        .map(|slot| match slot {
            Some(slot) => {
                let p = &requests[slot.index].params;
                RowSettings {
                    temperature: p.temperature,
                    top_k: p.top_k,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    seed: p.seed,
                    step: slot.tokens.len() as u32,
                }
            }
            None => RowSettings {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 0,
                step: 0,
            },
        })
        .collect()
}

/// Moves finished slots' completions into `done`, freeing the slots.
fn retire(slots: &mut [Option<Slot>], done: &mut [Option<Completion>]) {
    for entry in slots.iter_mut() {
        if entry.as_ref().is_some_and(|s| s.finish.is_some()) {
            let slot = entry.take().expect("checked");
            done[slot.index] = Some(Completion {
                tokens: slot.tokens,
                logprobs: slot.logprobs,
                finish_reason: slot.finish.expect("checked"),
            });
        }
    }
}

impl Engine {
    /// An engine serving `decoder` with `params` (uploaded in `config.dtype`).
    pub fn new(client: &Client, decoder: Decoder, params: Vec<Buffer>, config: EngineConfig) -> Result<Engine> {
        let device = client.device(0)?;
        let cache = decoder
            .cache_types(config.max_num_seqs as i64, config.max_model_len as i64, config.dtype)
            .iter()
            .map(|t| client.buffer_from_host_bytes(&vec![0u8; t.byte_size()], t, device))
            .collect::<grpo_xla::Result<Vec<_>>>()?;
        let eos = decoder.config().eos_token_ids.clone();
        Ok(Engine {
            client: client.clone(),
            decoder,
            config,
            eos,
            params,
            cache,
            programs: HashMap::new(),
        })
    }

    /// Bytes the KV cache holds on the device.
    pub fn cache_bytes(&self) -> usize {
        self.cache.iter().map(Buffer::device_bytes).sum()
    }

    /// Generates a completion for every request, returned in request order.
    ///
    /// Continuous batching: requests wait in a first-come queue and take a
    /// cache slot as soon as one is free; newly admitted requests are
    /// prefilled together between decode steps of the running ones, and a
    /// finished request leaves its slot at once.
    pub fn generate(&mut self, requests: &[Request]) -> Result<Vec<Completion>> {
        for (index, request) in requests.iter().enumerate() {
            self.check(index, request)?;
        }
        let mut queue: std::collections::VecDeque<usize> = (0..requests.len()).collect();
        let mut slots: Vec<Option<Slot>> = (0..self.config.max_num_seqs).map(|_| None).collect();
        let mut done: Vec<Option<Completion>> = vec![None; requests.len()];
        loop {
            let admitted: Vec<usize> = slots
                .iter_mut()
                .enumerate()
                .filter(|(_, slot)| slot.is_none())
                .map_while(|(row, slot)| {
                    let index = queue.pop_front()?;
                    *slot = Some(Slot::new(index, requests[index].prompt.len()));
                    Some(row)
                })
                .collect();
            if !admitted.is_empty() {
                self.prefill(requests, &mut slots, &admitted)?;
                retire(&mut slots, &mut done);
            }
            if slots.iter().all(Option::is_none) {
                if queue.is_empty() {
                    break;
                }
                continue;
            }
            self.decode(requests, &mut slots)?;
            retire(&mut slots, &mut done);
        }
        Ok(done.into_iter().map(|c| c.expect("every request finishes")).collect())
    }

    fn check(&self, index: usize, request: &Request) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidRequest { index, message });
        let p = &request.params;
        let vocab = self.decoder.config().vocab_size as u32;
        if request.prompt.is_empty() {
            return invalid("the prompt is empty".to_string());
        }
        if request.prompt.len() >= self.config.max_model_len {
            return invalid(format!(
                "the prompt has {} tokens; max_model_len is {}",
                request.prompt.len(),
                self.config.max_model_len
            ));
        }
        if let Some(bad) = request.prompt.iter().find(|&&t| t >= vocab) {
            return invalid(format!("token {bad} is outside the vocabulary of {vocab}"));
        }
        if p.max_tokens == 0 {
            return invalid("max_tokens must be at least 1".to_string());
        }
        if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
            return invalid(format!("temperature {} must be ≥ 0", p.temperature));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return invalid(format!("top_p {} must be in (0, 1]", p.top_p));
        }
        if !(0.0..1.0).contains(&p.min_p) {
            return invalid(format!("min_p {} must be in [0, 1)", p.min_p));
        }
        if p.top_k < 0 {
            return invalid(format!("top_k {} must be ≥ 0", p.top_k));
        }
        Ok(())
    }

    /// The step program for `t` tokens per slot.
    fn program(&mut self, t: i64) -> Result<Executable> {
        if let Some(program) = self.programs.get(&t) {
            return Ok(program.clone());
        }
        let b = self.config.max_num_seqs as i64;
        let graph = Graph::new(&format!("engine_step_{b}x{t}"));
        let dtype = self.config.dtype;
        let params = self.decoder.parameter_tensors(&graph, dtype)?;
        let ids = graph.parameter(ElementType::S32, &[b, t])?;
        let positions = graph.parameter(ElementType::S32, &[b, t])?;
        let last = graph.parameter(ElementType::S32, &[b])?;
        let settings = SamplingInputs::parameters(&graph, b)?;
        let cache: Vec<Tensor> = self
            .decoder
            .cache_types(b, self.config.max_model_len as i64, dtype)
            .iter()
            .map(|ty| graph.parameter(ty.dtype, &ty.dims))
            .collect::<grpo_xla::Result<_>>()?;
        let (logits, cache) = self.decoder.logits_with_cache(&params, &ids, &positions, &cache)?;
        // The logits of each slot's `last` token: a one-hot over T, contracted.
        let at = graph.iota(ElementType::S32, &[b, t], 1)?.eq(&last.reshape(&[b, 1])?)?;
        let one_hot = at.select(
            &graph.full(1.0, ElementType::F32, &[b, t])?,
            &graph.full(0.0, ElementType::F32, &[b, t])?,
        )?;
        let picked = one_hot.dot_general(&logits, &[0], &[0], &[1], &[1])?;
        let inputs = SamplingInputs::from_tensors(&settings);
        let (tokens, logprobs) = sample(&picked, &inputs)?;
        let mut outputs = vec![&tokens, &logprobs];
        outputs.extend(cache.iter());
        let first_cache = params.len() + 3 + settings.len();
        let function = (0..cache.len()).try_fold(graph.build(&outputs)?, |f, i| f.donate(first_cache + i, 2 + i))?;
        let program = function.compile(&self.client)?;
        self.programs.insert(t, program.clone());
        Ok(program)
    }

    /// Prefills the prompts of the slots in `rows` together (a power-of-two
    /// length bucket); the other slots sit the step out.
    fn prefill(&mut self, requests: &[Request], slots: &mut [Option<Slot>], rows: &[usize]) -> Result<()> {
        let b = self.config.max_num_seqs;
        let prompt = |row: usize| &requests[slots[row].as_ref().expect("admitted").index].prompt;
        let longest = rows.iter().map(|&row| prompt(row).len()).max().unwrap_or(1);
        let t = longest.next_power_of_two().max(8).min(self.config.max_model_len);
        let mut ids = vec![0i32; b * t];
        let mut positions = vec![-1i32; b * t];
        let mut last = vec![0i32; b];
        for &row in rows {
            for (j, &token) in prompt(row).iter().enumerate() {
                ids[row * t + j] = token as i32;
                positions[row * t + j] = j as i32;
            }
            last[row] = prompt(row).len() as i32 - 1;
        }
        let drawn = self.step(t as i64, &ids, &positions, &last, &row_settings(requests, slots))?;
        for &row in rows {
            let slot = slots[row].as_mut().expect("admitted");
            let (token, logprob) = drawn[row];
            self.record(slot, &requests[slot.index].params, token, logprob);
        }
        Ok(())
    }

    /// One decode step: every running slot feeds its last token at its next position.
    fn decode(&mut self, requests: &[Request], slots: &mut [Option<Slot>]) -> Result<()> {
        let b = self.config.max_num_seqs;
        let mut ids = vec![0i32; b];
        let mut positions = vec![-1i32; b];
        for (row, slot) in slots.iter().enumerate() {
            if let Some(slot) = slot {
                ids[row] = *slot.tokens.last().expect("prefill drew a token") as i32;
                positions[row] = (slot.length + slot.tokens.len() - 1) as i32;
            }
        }
        let drawn = self.step(1, &ids, &positions, &vec![0; b], &row_settings(requests, slots))?;
        for (slot, (token, logprob)) in slots.iter_mut().zip(drawn) {
            if let Some(slot) = slot {
                self.record(slot, &requests[slot.index].params, token, logprob);
            }
        }
        Ok(())
    }

    /// Appends a drawn token and decides whether the slot is done.
    fn record(&self, slot: &mut Slot, params: &SamplingParams, token: u32, logprob: f32) {
        slot.tokens.push(token);
        slot.logprobs.push(logprob);
        let stops = params.stop_token_ids.contains(&token) || (!params.ignore_eos && self.eos.contains(&token));
        if stops {
            slot.finish = Some(FinishReason::Stop);
        } else if slot.tokens.len() >= params.max_tokens || slot.length + slot.tokens.len() >= self.config.max_model_len
        {
            slot.finish = Some(FinishReason::Length);
        }
    }

    /// Runs one step program; returns each slot's drawn (token, log-prob).
    fn step(
        &mut self,
        t: i64,
        ids: &[i32],
        positions: &[i32],
        last: &[i32],
        rows: &[RowSettings],
    ) -> Result<Vec<(u32, f32)>> {
        let program = self.program(t)?;
        let b = self.config.max_num_seqs;
        let device = self.client.device(0)?.clone();
        let temperature: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let min_p: Vec<f32> = rows.iter().map(|r| r.min_p).collect();
        let top_k: Vec<i32> = rows.iter().map(|r| r.top_k).collect();
        let seed: Vec<u32> = rows.iter().map(|r| r.seed).collect();
        let step: Vec<u32> = rows.iter().map(|r| r.step).collect();
        let (matrix, vector) = ([b as i64, t], [b as i64]);
        let c = &self.client;
        let inputs = [
            c.buffer_from_host(ids, &matrix, &device)?,
            c.buffer_from_host(positions, &matrix, &device)?,
            c.buffer_from_host(last, &vector, &device)?,
            c.buffer_from_host(&temperature, &vector, &device)?,
            c.buffer_from_host(&top_k, &vector, &device)?,
            c.buffer_from_host(&top_p, &vector, &device)?,
            c.buffer_from_host(&min_p, &vector, &device)?,
            c.buffer_from_host(&seed, &vector, &device)?,
            c.buffer_from_host(&step, &vector, &device)?,
        ];
        let mut args: Vec<Arg<'_>> = self.params.iter().map(Arg::Borrow).collect();
        args.extend(inputs.iter().map(Arg::Borrow));
        args.extend(self.cache.iter().map(Arg::Donate));
        let mut out = program.execute_args(&args)?;
        self.cache = out.split_off(2);
        let tokens = out[0].to_host::<i32>()?;
        let logprobs = out[1].to_host::<f32>()?;
        Ok(tokens.into_iter().map(|t| t as u32).zip(logprobs).collect())
    }
}
