//! The served model as the HTTP layer sees it: its name, limits, tokenizer,
//! chat template and parameter names (for checkpoints loaded from disk).

use std::sync::Arc;

use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::config::ModelConfig;
use grpo_model::names::ParamSpec;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::{Tool, ToolCallFormat};
use grpo_rollout::output::StopReason;
use serde_json::Value;

use crate::error::{Error, Result};

/// What the routes need to know of the model.
pub struct ServedModel {
    /// The name requests use (`--served-model-name`, else `--model`).
    pub name: String,
    /// The model as `--model` named it.
    pub root: String,
    /// Its architecture (what adapters must fit).
    pub config: ModelConfig,
    /// Longest prompt + completion.
    pub max_model_len: usize,
    /// Sequences the engine decodes together (a request's prompts are
    /// queued about this many samples at a time).
    pub max_num_seqs: usize,
    /// Bytes of the tokenizer's longest token ([`longest_token_bytes`]):
    /// a text of more than twice this many bytes a position cannot fit
    /// and is refused before it is tokenized.
    pub longest_token_bytes: usize,
    /// The engine's parameters, in order (names and shapes).
    pub parameters: Vec<ParamSpec>,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The compiled chat template, when the tokenizer has one.
    pub chat_template: Option<ChatTemplate>,
    /// How the chat template's family writes tool calls.
    pub tool_format: ToolCallFormat,
    /// The model's end-of-sequence tokens.
    pub eos_token_ids: Vec<u32>,
}

/// Bytes of `tokenizer`'s longest token as its vocabulary spells it (at
/// least the bytes it stands for: byte-level and SentencePiece spellings
/// are longer than the text, not shorter).
pub fn longest_token_bytes(tokenizer: &Tokenizer) -> usize {
    (0..tokenizer.vocab_size() as u32)
        .filter_map(|id| tokenizer.id_to_token(id))
        .map(|token| token.len())
        .max()
        .unwrap_or(1)
        .max(1)
}

impl ServedModel {
    /// Refuses text `text` of field `param` that is too long for the
    /// model's context whatever its tokens, without tokenizing it.
    pub fn check_text_bytes(&self, param: &str, bytes: usize) -> Result<()> {
        let fewest_tokens = bytes / (2 * self.longest_token_bytes);
        if fewest_tokens > self.max_model_len {
            return Err(Error::invalid(
                param,
                format!(
                    "the text is {bytes} bytes, at least {fewest_tokens} tokens: over max_model_len = {}",
                    self.max_model_len
                ),
            ));
        }
        Ok(())
    }

    /// The token ids of `text`, as vLLM tokenizes a completion prompt.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, add_special_tokens)?)
    }

    /// The JSON `stop_reason` of a sample, as vLLM gives it: the stop
    /// string or stop token id, null for EOS (or no stop).
    pub fn stop_reason(&self, reason: &Option<StopReason>) -> Option<Value> {
        match reason {
            Some(StopReason::Token(id)) if !self.eos_token_ids.contains(id) => Some(Value::from(*id)),
            Some(StopReason::String(s)) => Some(Value::from(s.as_str())),
            _ => None,
        }
    }

    /// The text of one token, as vLLM shows it in log-probs.
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(self.tokenizer.decode(ids, false)?)
    }

    /// Renders `messages` with the chat template. With
    /// `continue_final_message` the text ends right after the last
    /// message's content (as vLLM cuts it), for the model to continue.
    /// `tools` on offer are refused if the template does not render them.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| Error::InvalidRequest {
            message: "the model's tokenizer has no chat template: use /v1/completions".to_string(),
            param: None,
        })?;
        if continue_final_message && add_generation_prompt {
            return Err(Error::invalid(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ));
        }
        let special = self.tokenizer.special_tokens();
        let token = |id: Option<u32>| id.and_then(|i| self.tokenizer.id_to_token(i)).unwrap_or_default();
        let render = |tools: &[Tool]| {
            template.render_with(
                messages,
                add_generation_prompt,
                &token(special.bos),
                &token(special.eos),
                tools,
                template_kwargs,
            )
        };
        let text = render(tools)?;
        if !tools.is_empty() && text == render(&[])? {
            return Err(Error::invalid(
                "tools",
                "the chat template does not render `tools`: start the server with --chat-template FILE of a \
                 template that does (for example model/templates/chatml_tools.jinja)",
            ));
        }
        if !continue_final_message {
            return Ok(text);
        }
        let last = messages.last().map(|m| m.content.trim()).unwrap_or_default();
        match text.rfind(last) {
            Some(at) if !last.is_empty() => Ok(text[..at + last.len()].to_string()),
            _ => Ok(text),
        }
    }
}
