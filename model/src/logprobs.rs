//! The per-token log-prob program: token ids and a mask in, log-probs and
//! entropies of every next token out. One executable per (batch, length)
//! bucket; lengths are padded up to a power of two so a steady stream of
//! requests compiles only a handful of programs.

use std::collections::HashMap;
use std::sync::Mutex;

use grpo_xla::trace::Graph;
use grpo_xla::{Buffer, Client, ElementType, Executable, Pred};

use crate::decoder::Decoder;
use crate::error::{Error, Result};

/// Compiles and runs the log-prob program of a decoder, per shape bucket.
pub struct LogprobsRunner {
    client: Client,
    decoder: Decoder,
    dtype: ElementType,
    /// The logits are divided by it (1: the model's own distribution).
    temperature: f64,
    programs: Mutex<HashMap<(i64, i64), Executable>>,
}

/// Log-probs and entropies of the tokens after the first, per sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenStats {
    /// `log p(ids[t+1] | ids[..=t])` for each `t` below the sequence length − 1.
    pub logprobs: Vec<f32>,
    /// Entropy of each of those next-token distributions.
    pub entropies: Vec<f32>,
}

/// The smallest power of two ≥ `n` (at least 8).
pub fn length_bucket(n: usize) -> usize {
    n.max(8).next_power_of_two()
}

impl LogprobsRunner {
    /// A runner for `decoder` computing with parameters of `dtype` (a
    /// parameter buffer of another dtype is converted in the program).
    pub fn new(client: &Client, decoder: Decoder, dtype: ElementType) -> LogprobsRunner {
        LogprobsRunner {
            client: client.clone(),
            decoder,
            dtype,
            temperature: 1.0,
            programs: Mutex::new(HashMap::new()),
        }
    }

    /// The runner scoring under the logits divided by `temperature` (> 0),
    /// as a sampler at that temperature draws.
    pub fn at_temperature(self, temperature: f64) -> LogprobsRunner {
        LogprobsRunner { temperature, ..self }
    }

    /// The program for `batch` sequences of `length` tokens whose parameter
    /// buffers are of the dtypes `inputs` (the same for every call).
    fn program(&self, batch: i64, length: i64, inputs: &[ElementType]) -> Result<Executable> {
        let mut programs = self.programs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(program) = programs.get(&(batch, length)) {
            return Ok(program.clone());
        }
        let graph = Graph::new(&format!("logprobs_{batch}x{length}"));
        let params = self
            .decoder
            .parameters()
            .iter()
            .zip(inputs)
            .map(|(spec, &input)| {
                let dims: Vec<i64> = spec.dims.iter().map(|&d| d as i64).collect();
                let param = graph.parameter(input, &dims)?;
                if input == self.dtype {
                    Ok(param)
                } else {
                    param.convert(self.dtype)
                }
            })
            .collect::<grpo_xla::Result<Vec<_>>>()?;
        let ids = graph.parameter(ElementType::S32, &[batch, length])?;
        let mask = graph.parameter(ElementType::Pred, &[batch, length])?;
        let scores = self
            .decoder
            .token_logprobs(&params, &ids, &mask, length - 1, self.temperature)?;
        let program = graph
            .build(&[&scores.logprobs, &scores.entropy])?
            .compile(&self.client)?;
        programs.insert((batch, length), program.clone());
        Ok(program)
    }

    /// Log-probs of every sequence in `sequences` (each at least 2 tokens),
    /// run together as one right-padded batch.
    pub fn run<B: std::borrow::Borrow<Buffer>>(&self, params: &[B], sequences: &[Vec<u32>]) -> Result<Vec<TokenStats>> {
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
        if sequences.iter().any(|s| s.len() < 2) {
            return Err(Error::Config {
                field: "sequence".to_string(),
                message: "each sequence needs at least 2 tokens (a context and a token to score)".to_string(),
            });
        }
        let vocab = self.decoder.config().vocab_size as u32;
        if let Some(&bad) = sequences.iter().flatten().find(|&&id| id >= vocab) {
            return Err(Error::Config {
                field: "token id".to_string(),
                message: format!("{bad} is outside the vocabulary of {vocab} tokens"),
            });
        }
        let (batch, length) = (sequences.len(), length_bucket(longest));
        let mut ids = vec![0i32; batch * length];
        let mut mask = vec![Pred::from(false); batch * length];
        for (row, sequence) in sequences.iter().enumerate() {
            for (t, &id) in sequence.iter().enumerate() {
                ids[row * length + t] = id as i32;
                mask[row * length + t] = Pred::from(true);
            }
        }
        let inputs: Vec<ElementType> = params.iter().map(|p| p.borrow().dtype()).collect();
        let program = self.program(batch as i64, length as i64, &inputs)?;
        let device = program
            .devices()
            .first()
            .ok_or_else(|| Error::Config {
                field: "device".to_string(),
                message: "the program has no device".to_string(),
            })?
            .clone();
        let dims = [batch as i64, length as i64];
        let ids = self.client.buffer_from_host(&ids, &dims, &device)?;
        let mask = self.client.buffer_from_host(&mask, &dims, &device)?;
        let mut args: Vec<&Buffer> = params.iter().map(B::borrow).collect();
        args.push(&ids);
        args.push(&mask);
        let out = program.execute(&args)?;
        let (logprobs, entropies) = (out[0].to_host::<f32>()?, out[1].to_host::<f32>()?);
        Ok(sequences
            .iter()
            .enumerate()
            .map(|(row, sequence)| {
                let range = row * (length - 1)..row * (length - 1) + sequence.len() - 1;
                TokenStats {
                    logprobs: logprobs[range.clone()].to_vec(),
                    entropies: entropies[range].to_vec(),
                }
            })
            .collect())
    }
}
