//! `POST /tokenize` and `POST /detokenize` (vLLM's schemas).

use serde::{Deserialize, Serialize};

use crate::protocol::chat::ChatMessageIn;
use crate::protocol::common::default_true;

/// A prompt to tokenize, or messages to render with the chat template first.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// Checked against the served model when given.
    pub model: Option<String>,
    /// The text (completion form).
    pub prompt: Option<String>,
    /// The conversation (chat form).
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Run the tokenizer's post-processor; default true for a prompt, false for messages.
    pub add_special_tokens: Option<bool>,
    /// Chat form: open the assistant's turn. Default true.
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// Chat form: leave the last message open.
    #[serde(default)]
    pub continue_final_message: bool,
    /// Chat form: extra variables for the chat template.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Chat form: tools on offer, rendered by the chat template.
    pub tools: Option<serde_json::Value>,
    /// Also return each token as spelled in the vocabulary.
    #[serde(default)]
    pub return_token_strs: bool,
}

/// The tokens of a prompt.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    /// How many.
    pub count: usize,
    /// The server's context length.
    pub max_model_len: usize,
    /// The ids.
    pub tokens: Vec<u32>,
    /// Each token as spelled in the vocabulary, when asked for.
    pub token_strs: Option<Vec<String>>,
}

/// Ids to turn back into text.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Checked against the served model when given.
    pub model: Option<String>,
    /// The ids.
    pub tokens: Vec<i64>,
}

/// The text of some ids.
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    /// The text.
    pub prompt: String,
}
