//! What a caller asks the engine for — a prompt, how many samples and how
//! to sample them — and the checks that refuse what the engine cannot serve.

use crate::adapters::AdapterId;
use crate::guided::Guide;

/// Most top log-probs a token can carry ([`SamplingParams::logprobs`]), as vLLM's default `max_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How the samples of one request are drawn (vLLM's `SamplingParams`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Samples of the prompt; they share one prefill. Default 1.
    pub n: usize,
    /// Most tokens to generate per sample (≥ 1). Default 16.
    pub max_tokens: usize,
    /// Stop tokens (EOS, `stop_token_ids`) cannot end a sample before this
    /// many tokens. Default 0.
    pub min_tokens: usize,
    /// 0 is greedy. Default 1.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all. Default 0.
    pub top_k: i32,
    /// Nucleus mass, in (0, 1]. Default 1.
    pub top_p: f32,
    /// Drop tokens below this fraction of the most likely one, in [0, 1). Default 0.
    pub min_p: f32,
    /// Subtracted once from the logit of every token already in the output, in [-2, 2]. Default 0.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of tokens in the output, in [-2, 2]. Default 0.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt
    /// or output; > 0, 1 is off. Default 1.
    pub repetition_penalty: f32,
    /// The seed of sample 0; sample `i` derives its own from it, so a
    /// request's draws do not depend on what shares its batch. Default 0.
    pub seed: u32,
    /// Tokens that end a sample (the model's EOS is added unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a sample; the text is cut before the stop string.
    /// Needs an engine with a tokenizer.
    pub stop: Vec<String>,
    /// Keep the matched stop string at the end of the text. Default false.
    pub include_stop_str_in_output: bool,
    /// Keep going past EOS. Default false.
    pub ignore_eos: bool,
    /// Also return this many most likely tokens with their log-probs at
    /// each step (≤ [`MAX_TOP_LOGPROBS`]). Default none.
    pub logprobs: Option<usize>,
    /// Leave special tokens out of the returned text. Default true.
    pub skip_special_tokens: bool,
    /// Which distribution the returned log-probs are taken from. Default
    /// [`LogprobsMode::Raw`].
    pub logprobs_mode: LogprobsMode,
    /// What the text must be (guided decoding); needs an engine with a
    /// tokenizer. The log-probs stay those of the distribution before the
    /// grammar's mask (see [`LogprobsMode`]). Default none.
    pub guide: Option<Guide>,
    /// The LoRA adapter whose model draws the samples, one loaded into an
    /// engine with adapter slots ([`crate::engine::Engine::load_adapter`]).
    /// Default none: the engine's own weights.
    pub adapter: Option<AdapterId>,
}

/// Which distribution a sample's log-probs (each token's and the top
/// ones) are taken from (vLLM's `logprobs_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogprobsMode {
    /// The model's own: `log_softmax(z)` of the raw logits `z`.
    #[default]
    Raw,
    /// The sampling distribution's: `log_softmax(z' / T)` of the logits
    /// `z'` after the penalties, at the request's temperature `T` (1 for
    /// greedy rows), before top-k / top-p / min-p filtering. What a GRPO
    /// learner scoring at the same temperature needs as the behaviour
    /// policy.
    Processed,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            include_stop_str_in_output: false,
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            logprobs_mode: LogprobsMode::Raw,
            guide: None,
            adapter: None,
        }
    }
}

impl SamplingParams {
    /// Whether a repetition, frequency or presence penalty is set.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// The seed of sample `index`: the request's seed for sample 0, a
    /// hash-mixed variant for the others (distinct streams per sample).
    pub fn sample_seed(&self, index: usize) -> u32 {
        if index == 0 {
            return self.seed;
        }
        let mut x = (index as u32).wrapping_mul(0x9E37_79B9) ^ 0x85EB_CA6B;
        x ^= x >> 16;
        x = x.wrapping_mul(0x7FEB_352D);
        x ^= x >> 15;
        x = x.wrapping_mul(0x846C_A68B);
        x ^= x >> 16;
        self.seed ^ x
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

/// What the engine can serve, for [`Request::check`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub vocab_size: usize,
    pub has_tokenizer: bool,
}

impl Request {
    /// Why the engine cannot serve this request, if it cannot.
    pub(crate) fn check(&self, limits: &Limits) -> Result<(), String> {
        let p = &self.params;
        let vocab = limits.vocab_size as u32;
        if self.prompt.is_empty() {
            return Err("the prompt is empty".to_string());
        }
        if self.prompt.len() >= limits.max_model_len {
            return Err(format!(
                "the prompt has {} tokens; max_model_len is {} (leave room for at least one new token)",
                self.prompt.len(),
                limits.max_model_len
            ));
        }
        if let Some(bad) = self.prompt.iter().chain(&p.stop_token_ids).find(|&&t| t >= vocab) {
            return Err(format!("token {bad} is outside the vocabulary of {vocab}"));
        }
        if p.n == 0 || p.n > limits.max_num_seqs {
            return Err(format!(
                "n is {}; it must be between 1 and max_num_seqs ({})",
                p.n, limits.max_num_seqs
            ));
        }
        if p.max_tokens == 0 {
            return Err("max_tokens must be at least 1".to_string());
        }
        let room = limits.max_model_len - self.prompt.len();
        if p.max_tokens > room {
            return Err(format!(
                "max_tokens is {} but the {}-token prompt leaves {room} of max_model_len {}",
                p.max_tokens,
                self.prompt.len(),
                limits.max_model_len
            ));
        }
        if p.min_tokens > p.max_tokens {
            return Err(format!(
                "min_tokens {} is more than max_tokens {}",
                p.min_tokens, p.max_tokens
            ));
        }
        if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
            return Err(format!("temperature {} must be ≥ 0", p.temperature));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(format!("top_p {} must be in (0, 1]", p.top_p));
        }
        if !(0.0..1.0).contains(&p.min_p) {
            return Err(format!("min_p {} must be in [0, 1)", p.min_p));
        }
        if p.top_k < 0 {
            return Err(format!("top_k {} must be ≥ 0 (0 keeps all tokens)", p.top_k));
        }
        for (name, value) in [
            ("presence_penalty", p.presence_penalty),
            ("frequency_penalty", p.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(format!("{name} {value} must be in [-2, 2]"));
            }
        }
        if !(p.repetition_penalty > 0.0 && p.repetition_penalty.is_finite()) {
            return Err(format!("repetition_penalty {} must be > 0", p.repetition_penalty));
        }
        if p.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(format!(
                "logprobs {} is more than the {MAX_TOP_LOGPROBS} most likely tokens the engine returns",
                p.logprobs.unwrap_or_default()
            ));
        }
        if !p.stop.is_empty() && !limits.has_tokenizer {
            return Err("stop strings need an engine with a tokenizer".to_string());
        }
        if p.stop.iter().any(String::is_empty) {
            return Err("a stop string is empty".to_string());
        }
        if p.guide.is_some() {
            if !limits.has_tokenizer {
                return Err("structured outputs need an engine with a tokenizer".to_string());
            }
            if p.ignore_eos {
                return Err("ignore_eos cannot be combined with a structured output, which ends with EOS".to_string());
            }
            if p.min_tokens > 0 {
                return Err(
                    "min_tokens cannot be combined with a structured output: its grammar decides where the answer ends"
                        .to_string(),
                );
            }
        }
        Ok(())
    }
}
