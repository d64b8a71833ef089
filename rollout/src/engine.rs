//! The generation engine, first form: requests run in waves of up to
//! `max_num_seqs` slots over a per-slot contiguous KV cache on the device.
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

/// One slot's request in a wave.
struct Slot {
    index: usize,
    length: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
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

    /// Generates a completion for every request, in order.
    pub fn generate(&mut self, requests: &[Request]) -> Result<Vec<Completion>> {
        for (index, request) in requests.iter().enumerate() {
            self.check(index, request)?;
        }
        let mut completions = Vec::with_capacity(requests.len());
        for wave in requests.chunks(self.config.max_num_seqs) {
            completions.extend(self.run_wave(wave)?);
        }
        Ok(completions)
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
        let params: Vec<Tensor> = self
            .decoder
            .parameters()
            .iter()
            .map(|p| graph.parameter(dtype, &p.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
            .collect::<grpo_xla::Result<_>>()?;
        let ids = graph.parameter(ElementType::S32, &[b, t])?;
        let positions = graph.parameter(ElementType::S32, &[b, t])?;
        let last = graph.parameter(ElementType::S32, &[b])?;
        let settings: Vec<Tensor> = [
            ElementType::F32,
            ElementType::S32,
            ElementType::F32,
            ElementType::F32,
            ElementType::U32,
            ElementType::U32,
        ]
        .iter()
        .map(|&d| graph.parameter(d, &[b]))
        .collect::<grpo_xla::Result<_>>()?;
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
        let inputs = SamplingInputs {
            temperature: &settings[0],
            top_k: &settings[1],
            top_p: &settings[2],
            min_p: &settings[3],
            seed: &settings[4],
            step: &settings[5],
        };
        let (tokens, logprobs) = sample(&picked, &inputs)?;
        let mut outputs = vec![&tokens, &logprobs];
        outputs.extend(cache.iter());
        let first_cache = params.len() + 3 + settings.len();
        let function = (0..cache.len()).try_fold(graph.build(&outputs)?, |f, i| f.donate(first_cache + i, 2 + i))?;
        let program = function.compile(&self.client)?;
        self.programs.insert(t, program.clone());
        Ok(program)
    }

    /// Prefills and decodes one wave of at most `max_num_seqs` requests.
    fn run_wave(&mut self, wave: &[Request]) -> Result<Vec<Completion>> {
        let b = self.config.max_num_seqs;
        let mut slots: Vec<Slot> = wave
            .iter()
            .enumerate()
            .map(|(index, r)| Slot {
                index,
                length: r.prompt.len(),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: None,
            })
            .collect();
        // Prefill: every prompt at once, padded to a power-of-two length.
        let longest = wave.iter().map(|r| r.prompt.len()).max().unwrap_or(1);
        let t = longest.next_power_of_two().max(8).min(self.config.max_model_len);
        let mut ids = vec![0i32; b * t];
        let mut positions = vec![-1i32; b * t];
        let mut last = vec![0i32; b];
        for (row, request) in wave.iter().enumerate() {
            for (j, &token) in request.prompt.iter().enumerate() {
                ids[row * t + j] = token as i32;
                positions[row * t + j] = j as i32;
            }
            last[row] = request.prompt.len() as i32 - 1;
        }
        let mut drawn = self.step(t as i64, &ids, &positions, &last, wave, &slots)?;
        loop {
            for (slot, (token, logprob)) in slots.iter_mut().zip(drawn) {
                if slot.finish.is_none() {
                    self.record(slot, &wave[slot.index].params, token, logprob);
                }
            }
            if slots.iter().all(|s| s.finish.is_some()) {
                break;
            }
            // Decode: each running slot feeds its last token at the next position.
            let mut ids = vec![0i32; b];
            let mut positions = vec![-1i32; b];
            for (row, slot) in slots.iter().enumerate() {
                if slot.finish.is_none() {
                    ids[row] = *slot.tokens.last().expect("a drawn token") as i32;
                    positions[row] = (slot.length + slot.tokens.len() - 1) as i32;
                }
            }
            drawn = self.step(1, &ids, &positions, &vec![0; b], wave, &slots)?;
        }
        Ok(slots
            .into_iter()
            .map(|s| Completion {
                tokens: s.tokens,
                logprobs: s.logprobs,
                finish_reason: s.finish.unwrap_or(FinishReason::Length),
            })
            .collect())
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
        wave: &[Request],
        slots: &[Slot],
    ) -> Result<Vec<(u32, f32)>> {
        let program = self.program(t)?;
        let b = self.config.max_num_seqs;
        let device = self.client.device(0)?.clone();
        let setting = |f: &dyn Fn(&SamplingParams) -> f32| -> Vec<f32> {
            (0..b).map(|row| wave.get(row).map_or(0.0, |r| f(&r.params))).collect()
        };
        let temperature = setting(&|p| p.temperature);
        let top_p = setting(&|p| p.top_p);
        let min_p = setting(&|p| p.min_p);
        let top_k: Vec<i32> = (0..b).map(|row| wave.get(row).map_or(0, |r| r.params.top_k)).collect();
        let seed: Vec<u32> = (0..b).map(|row| wave.get(row).map_or(0, |r| r.params.seed)).collect();
        let step: Vec<u32> = (0..b)
            .map(|row| slots.get(row).map_or(0, |s| s.tokens.len() as u32))
            .collect();
        let (rows, vector) = ([b as i64, t], [b as i64]);
        let c = &self.client;
        let inputs = [
            c.buffer_from_host(ids, &rows, &device)?,
            c.buffer_from_host(positions, &rows, &device)?,
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
