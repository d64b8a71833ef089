//! The host-side inputs of the engine's programs, built per call from
//! what the engine holds: the decode step's per-row settings, and the
//! tokens of the prompts a prefill or extend program writes.

use std::collections::HashMap;

use grpo_xla::{Buffer, Client, Device};

use crate::engine::{Held, Sequence};
use crate::error::Result;
use crate::output::RequestId;
use crate::programs::upload;
use crate::request::LogprobsMode;

/// The decode program's per-row inputs (idle rows: position −1, greedy, no penalties).
pub(crate) struct RowInputs {
    ids: Vec<i32>,
    positions: Vec<i32>,
    repetition: Vec<f32>,
    frequency: Vec<f32>,
    presence: Vec<f32>,
    suppress_stops: Vec<f32>,
    temperature: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    min_p: Vec<f32>,
    seed: Vec<u32>,
    step: Vec<u32>,
    processed_logprobs: Vec<f32>,
    /// Whether a row has a repetition, frequency or presence penalty.
    penalized: bool,
    /// The guided decode program's bitmask words, `[rows, words]` (all
    /// ones on unguided and idle rows).
    allowed: Option<(Vec<u32>, usize)>,
}

impl RowInputs {
    /// Inputs of the first `rows` rows (past the engine's slots: idle rows).
    pub fn new(slots: &[Option<Sequence>], rows: usize, held: &HashMap<RequestId, Held>) -> RowInputs {
        let mut r = RowInputs {
            ids: Vec::new(),
            positions: Vec::new(),
            repetition: Vec::new(),
            frequency: Vec::new(),
            presence: Vec::new(),
            suppress_stops: Vec::new(),
            temperature: Vec::new(),
            top_k: Vec::new(),
            top_p: Vec::new(),
            min_p: Vec::new(),
            seed: Vec::new(),
            step: Vec::new(),
            processed_logprobs: Vec::new(),
            penalized: false,
            allowed: None,
        };
        let idle = crate::request::SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        for row in 0..rows {
            let sequence = slots.get(row).and_then(Option::as_ref);
            let p = sequence.map_or(&idle, |s| &held[&s.request].request.params);
            let generated = sequence.map_or(0, |s| s.tokens.len());
            r.ids.push(sequence.map_or(0, |s| s.next_input as i32));
            r.positions.push(sequence.map_or(-1, |s| s.position() as i32));
            r.penalized |= p.has_penalties();
            r.repetition.push(p.repetition_penalty);
            r.frequency.push(p.frequency_penalty);
            r.presence.push(p.presence_penalty);
            r.suppress_stops.push(if generated < p.min_tokens { 1.0 } else { 0.0 });
            r.temperature.push(p.temperature);
            r.top_k.push(p.top_k);
            r.top_p.push(p.top_p);
            r.min_p.push(p.min_p);
            r.seed.push(p.sample_seed(sequence.map_or(0, |s| s.index)));
            r.step.push(generated as u32);
            let processed = p.logprobs_mode == LogprobsMode::Processed;
            r.processed_logprobs.push(if processed { 1.0 } else { 0.0 });
        }
        r
    }

    /// Whether a row reads its token history: it has a penalty, or its
    /// stop tokens are still suppressed.
    pub fn reads_history(&self) -> bool {
        self.penalized || self.suppress_stops.iter().any(|&s| s > 0.0)
    }

    /// Gives the rows the bitmasks of the guided decode program: `masks`
    /// per slot, of `words` words each (a row without one allows every token).
    pub fn allow(&mut self, masks: &[Option<Vec<u32>>], words: usize) {
        let rows = self.ids.len();
        let mut allowed = vec![u32::MAX; rows * words];
        for (row, mask) in masks.iter().enumerate().take(rows) {
            if let Some(mask) = mask {
                allowed[row * words..(row + 1) * words].copy_from_slice(mask);
            }
        }
        self.allowed = Some((allowed, words));
    }

    /// The buffers in the decode program's order.
    pub fn upload(&self, client: &Client, device: &Device) -> Result<Vec<Buffer>> {
        let b = self.ids.len() as i64;
        let (column, vector) = ([b, 1], [b]);
        let mut buffers = vec![
            upload(client, device, &self.ids, &column)?,
            upload(client, device, &self.positions, &column)?,
            upload(client, device, &self.repetition, &vector)?,
            upload(client, device, &self.frequency, &vector)?,
            upload(client, device, &self.presence, &vector)?,
            upload(client, device, &self.suppress_stops, &vector)?,
            upload(client, device, &self.temperature, &vector)?,
            upload(client, device, &self.top_k, &vector)?,
            upload(client, device, &self.top_p, &vector)?,
            upload(client, device, &self.min_p, &vector)?,
            upload(client, device, &self.seed, &vector)?,
            upload(client, device, &self.step, &vector)?,
            upload(client, device, &self.processed_logprobs, &vector)?,
        ];
        if let Some((allowed, words)) = &self.allowed {
            buffers.push(upload(client, device, allowed, &[b, *words as i64])?);
        }
        Ok(buffers)
    }
}

/// The token inputs of a prefill or extend program: `P` sequences of up to
/// `T` new tokens (padding: token 0 at position −1, slot −1), with each
/// sequence's prompt tokens and stop tokens as `[P, vocab]` mark rows.
pub(crate) struct TokenInputs {
    t: usize,
    vocab: usize,
    ids: Vec<i32>,
    positions: Vec<i32>,
    prompt_rows: Vec<f32>,
    stop_rows: Vec<f32>,
    slots: Vec<i32>,
}

impl TokenInputs {
    /// All padding, for `p` sequences of `t` tokens over `vocab` tokens.
    pub fn new(p: usize, t: usize, vocab: usize) -> TokenInputs {
        TokenInputs {
            t,
            vocab,
            ids: vec![0; p * t],
            positions: vec![-1; p * t],
            prompt_rows: vec![0.0; p * vocab],
            stop_rows: vec![0.0; p * vocab],
            slots: vec![-1; p],
        }
    }

    /// The sequences (`P`).
    pub fn rows(&self) -> usize {
        self.slots.len()
    }

    /// Row `row`: `prompt`, whose first `cached` positions `slot` already
    /// holds, into `slot`: the tokens after those but the last are computed
    /// (the next decode step feeds the last); every prompt token and every
    /// one of `stops` marked.
    pub fn add(&mut self, row: usize, prompt: &[u32], cached: usize, stops: &[u32], slot: usize) {
        let (t, vocab) = (self.t, self.vocab);
        let computed = &prompt[cached..prompt.len() - 1];
        debug_assert!(computed.len() < t, "the bucket holds the new tokens");
        for (j, &token) in computed.iter().enumerate() {
            self.ids[row * t + j] = token as i32;
            self.positions[row * t + j] = (cached + j) as i32;
        }
        for &token in prompt {
            self.prompt_rows[row * vocab + token as usize] = 1.0;
        }
        for &token in stops {
            self.stop_rows[row * vocab + token as usize] = 1.0;
        }
        self.slots[row] = slot as i32;
    }

    /// The buffers in the programs' order: ids, positions, prompt rows, stop rows, slots.
    pub fn upload(&self, client: &Client, device: &Device) -> Result<Vec<Buffer>> {
        let (p, t) = (self.slots.len() as i64, self.t as i64);
        let (matrix, rows) = ([p, t], [p, self.vocab as i64]);
        Ok(vec![
            upload(client, device, &self.ids, &matrix)?,
            upload(client, device, &self.positions, &matrix)?,
            upload(client, device, &self.prompt_rows, &rows)?,
            upload(client, device, &self.stop_rows, &rows)?,
            upload(client, device, &self.slots, &[p])?,
        ])
    }
}
