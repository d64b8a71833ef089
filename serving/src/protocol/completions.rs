//! `POST /v1/completions`: the request, the response and its stream chunks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::protocol::common::Usage;

/// A prompt as text, texts, token ids or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt's token ids.
    Tokens(Vec<i64>),
    /// Several prompts' token ids.
    TokenLists(Vec<Vec<i64>>),
}

/// A completions request (its sampling fields are read into [`crate::protocol::common::SamplingFields`]).
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Checked against the served model when given.
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Most new tokens per sample. Default 16.
    pub max_tokens: Option<i64>,
    /// Return this many most likely tokens per step (0–20) with each token's log-prob.
    pub logprobs: Option<i64>,
    /// Put the prompt before the completion's text.
    #[serde(default)]
    pub echo: bool,
}

/// Log-probs of a choice's tokens (OpenAI's legacy completions shape).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Where each token's text starts in the choice's text.
    pub text_offset: Vec<usize>,
    /// Each token's log-prob.
    pub token_logprobs: Vec<f32>,
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each step's most likely tokens, text → log-prob.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
}

/// One choice of a response (or its delta in a stream chunk).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// `prompt_index * n + sample_index`.
    pub index: usize,
    /// The text (a stream chunk: the new text).
    pub text: String,
    /// Log-probs, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop`, `length` or `abort`; null until the sample ends.
    pub finish_reason: Option<&'static str>,
    /// The stop token id or stop string that ended the sample.
    pub stop_reason: Option<serde_json::Value>,
    /// The prompt's ids, with `return_token_ids` (a stream: in the first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The sample's ids, with `return_token_ids` (a stream chunk: the new ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A completions response, or one chunk of its stream.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-…`, the same in every chunk.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Tokens used (a stream: only the last chunk, with `include_usage`).
    pub usage: Option<Usage>,
}
