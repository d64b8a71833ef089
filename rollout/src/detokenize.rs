//! Incremental detokenization: the text of a growing token sequence, streamed
//! as it becomes final (vLLM's `detokenize_incrementally`, TGI's `decode_token`).
//!
//! Decoding each token alone is wrong: a byte-level BPE token may hold part
//! of a UTF-8 character, and SentencePiece-style decoders drop the leading
//! space of the first token they see. So each step decodes a short window,
//! the tokens of the last emitted text (the *prefix*) followed by the new
//! ones, and emits what the window's text adds to the prefix's text; while
//! that ends in U+FFFD (an incomplete UTF-8 sequence) it holds back and waits
//! for the next token. The first window starts in the prompt's tail, so the
//! first generated token reads as it does after the prompt.
//!
//! For byte-level tokenizers (GPT-2, Llama 3, Qwen, SmolLM2) the deltas, with
//! [`IncrementalDetokenizer::finish`]'s, join into exactly
//! `tokenizer.decode(completion, skip_special_tokens)`. A decoder that drops
//! the text's first space (SentencePiece's) drops it from `decode(completion)`
//! but not from the streamed text, which reads as after the prompt (as vLLM's).

use std::sync::Arc;

use grpo_model::tokenizer::Tokenizer;
use grpo_model::{Error, Result};

/// Prompt tokens decoded before the first generated token, as context
/// (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// What a decoder gives for an incomplete or invalid UTF-8 sequence.
const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// Streams the completion text of a sequence, one token at a time.
#[derive(Clone, Debug)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The tokens from the prefix offset on: the prefix, then those not yet emitted.
    window: Vec<u32>,
    /// How many tokens of `window` the prefix is (the read offset).
    prefix_len: usize,
    /// The text of the prefix: `decode(window[..prefix_len])`.
    prefix_text: String,
    /// The completion text emitted so far.
    text: String,
}

impl IncrementalDetokenizer {
    /// A detokenizer for a completion of `prompt`, leaving special tokens out
    /// of the text if `skip_special_tokens`.
    ///
    /// The prompt's last tokens are context; a prompt that ends inside a
    /// UTF-8 character gives none (the character's completion bytes are then
    /// decoded alone, as `decode(completion)` does).
    pub fn new(tokenizer: Arc<Tokenizer>, prompt: &[u32], skip_special_tokens: bool) -> Result<Self> {
        let context = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        let mut window = context.to_vec();
        let mut prefix_text = tokenizer.decode(context, skip_special_tokens)?;
        if prefix_text.ends_with(REPLACEMENT) {
            window.clear();
            prefix_text.clear();
        }
        Ok(IncrementalDetokenizer {
            tokenizer,
            skip_special_tokens,
            prefix_len: window.len(),
            window,
            prefix_text,
            text: String::new(),
        })
    }

    /// Appends a generated token and returns the text that became final
    /// (empty while it ends in an incomplete character, or for a skipped
    /// special token).
    pub fn push(&mut self, token: u32) -> Result<&str> {
        self.window.push(token);
        self.advance(false)
    }

    /// Emits the text still held back (an incomplete character, decoded as
    /// U+FFFD) and returns it; call it once, after the last token.
    pub fn finish(&mut self) -> Result<&str> {
        self.advance(true)
    }

    /// The completion text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Emits what the window's text adds to the prefix's, unless it is empty
    /// or (without `flush`) ends in an incomplete character; the emitted
    /// tokens then become the prefix.
    fn advance(&mut self, flush: bool) -> Result<&str> {
        let start = self.text.len();
        let decoded = self.tokenizer.decode(&self.window, self.skip_special_tokens)?;
        let Some(delta) = decoded.strip_prefix(self.prefix_text.as_str()) else {
            return Err(Error::Tokenizer(format!(
                "cannot stream text: {} more tokens change the text {:?} of the {} before them to {decoded:?}",
                self.window.len() - self.prefix_len,
                self.prefix_text,
                self.prefix_len,
            )));
        };
        if !delta.is_empty() && (flush || !delta.ends_with(REPLACEMENT)) {
            self.text.push_str(delta);
            self.window.drain(..self.prefix_len);
            self.prefix_len = self.window.len();
            self.prefix_text = self.tokenizer.decode(&self.window, self.skip_special_tokens)?;
        }
        Ok(&self.text[start..])
    }
}
