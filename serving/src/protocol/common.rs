//! Parts shared by completions and chat: the sampling fields, stop strings,
//! stream options and token usage.

use serde::{Deserialize, Serialize};

/// One stop string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage of the whole request.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and streaming fields completions and chat share (vLLM's names and defaults).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    /// Samples per prompt. Default 1.
    pub n: Option<i64>,
    /// Default 1; 0 is greedy.
    pub temperature: Option<f64>,
    /// Default 1.
    pub top_p: Option<f64>,
    /// Default 0 (or -1): all tokens.
    pub top_k: Option<i64>,
    /// Default 0.
    pub min_p: Option<f64>,
    /// Seed of the first sample; without it each request draws a random one.
    pub seed: Option<i64>,
    /// Strings that end a sample.
    pub stop: Option<Stop>,
    /// Tokens that end a sample.
    #[serde(default)]
    pub stop_token_ids: Vec<i64>,
    /// Keep going past EOS.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Stop tokens cannot end a sample before this many tokens. Default 0.
    pub min_tokens: Option<i64>,
    /// In [-2, 2]. Default 0.
    pub presence_penalty: Option<f64>,
    /// In [-2, 2]. Default 0.
    pub frequency_penalty: Option<f64>,
    /// > 0. Default 1.
    pub repetition_penalty: Option<f64>,
    /// Keep a matched stop string in the text.
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// Leave special tokens out of the text. Default true.
    pub skip_special_tokens: Option<bool>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Return the prompt's and each sample's token ids.
    #[serde(default)]
    pub return_token_ids: bool,
    /// The end user (accepted, not used).
    pub user: Option<String>,
    /// OpenAI's answer format (`text`, `json_object`, `json_schema`).
    pub response_format: Option<serde_json::Value>,
    /// vLLM's structured-output options (one of json, regex, choice, grammar, json_object).
    pub structured_outputs: Option<serde_json::Value>,
    /// vLLM's older JSON-schema guide (an object or JSON text).
    pub guided_json: Option<serde_json::Value>,
    /// vLLM's older regular-expression guide.
    pub guided_regex: Option<String>,
    /// vLLM's older choice guide.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM's older grammar guide (llguidance's Lark syntax).
    pub guided_grammar: Option<String>,
}

impl SamplingFields {
    /// Whether a final usage chunk was asked for.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

/// Tokens a request used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Tokens of all samples.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of `prompt_tokens` and `completion_tokens`.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// `true`, for fields that default to it.
pub fn default_true() -> bool {
    true
}
