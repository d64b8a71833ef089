//! `POST /v1/chat/completions`: the request, the response and its stream chunks.

use serde::{Deserialize, Serialize};

use crate::protocol::common::{Usage, default_true};

/// A message's content: text, or a list of parts (only text parts are read).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": ...}, ...]`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other kinds are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// A message of the conversation.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// What it says (null is empty).
    pub content: Option<Content>,
    /// The tools an assistant message called.
    pub tool_calls: Option<Vec<ToolCallIn>>,
}

/// A call of an assistant message in the history.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    /// `function` (the only kind).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function called.
    pub function: FunctionIn,
}

/// The function of a call in the history.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionIn {
    /// The tool's name.
    pub name: String,
    /// Its arguments: OpenAI's JSON text of an object, or the object.
    pub arguments: serde_json::Value,
}

/// A chat completions request (its sampling fields are read into [`crate::protocol::common::SamplingFields`]).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Checked against the served model when given.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<ChatMessageIn>,
    /// Most new tokens per sample; default: the rest of the context.
    pub max_completion_tokens: Option<i64>,
    /// The older name of `max_completion_tokens`.
    pub max_tokens: Option<i64>,
    /// Return each token's log-prob.
    #[serde(default)]
    pub logprobs: bool,
    /// With `logprobs`, this many most likely tokens per step (0–20).
    pub top_logprobs: Option<i64>,
    /// Open the assistant's turn after the messages. Default true.
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// Leave the last message open, for the model to continue it.
    #[serde(default)]
    pub continue_final_message: bool,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Tools on offer, in OpenAI's shape, rendered by the chat template.
    pub tools: Option<serde_json::Value>,
    /// `auto` (the default with tools) or `none`.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether an answer may make several calls. Default true.
    pub parallel_tool_calls: Option<bool>,
}

/// One token's log-prob in OpenAI's chat shape.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-prob.
    pub logprob: f32,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
}

/// A generated token's log-prob and the most likely alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-prob.
    pub logprob: f32,
    /// The UTF-8 bytes of its text.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this step.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `{"content": [...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<TokenLogprob>,
}

/// The assistant's message, or a stream chunk's delta of it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatMessageOut {
    /// `assistant` (a stream: only in each choice's first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// The text (a stream chunk: the new text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The tools the answer calls (a stream chunk: the calls completed in it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A tool call of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    /// Its place among the answer's calls (stream chunks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `chatcmpl-tool-…`.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function called.
    pub function: FunctionOut,
}

/// The function of an answer's call.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionOut {
    /// The tool's name.
    pub name: String,
    /// Its arguments as JSON text, as OpenAI sends them.
    pub arguments: String,
}

/// One choice of a response (or of a stream chunk).
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// `sample_index`.
    pub index: usize,
    /// The message (in a response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessageOut>,
    /// The new part of the message (in a stream chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatMessageOut>,
    /// Log-probs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, `tool_calls` or `abort`; null until the sample ends.
    pub finish_reason: Option<&'static str>,
    /// The stop token id or stop string that ended the sample.
    pub stop_reason: Option<serde_json::Value>,
    /// The sample's ids, with `return_token_ids` (a stream chunk: the new ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A chat response, or one chunk of its stream.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    /// `chatcmpl-…`, the same in every chunk.
    pub id: String,
    /// `chat.completion`, or `chat.completion.chunk` in a stream.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Tokens used (a stream: only the last chunk, with `include_usage`).
    pub usage: Option<Usage>,
    /// The prompt's ids, with `return_token_ids` (a stream: in the first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}
