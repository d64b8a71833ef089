//! A chat rendered turn by turn, as training on several turns needs it:
//! each new turn's text is what the chat template adds to the conversation
//! so far, tokenized on its own and appended. The ids of earlier turns
//! never change, so the ids trained on are the ids the model read or
//! wrote; a template that would change the text of earlier turns when a
//! new one follows (some drop earlier reasoning) is refused, naming the
//! turn, instead of silently training on other ids.

use grpo_model::chat::ChatMessage;
use grpo_model::tools::Tool;

use crate::collect::PromptEncoder;
use crate::error::{Error, Result};

/// A conversation being rendered turn by turn.
pub struct Conversation<'a> {
    encoder: &'a PromptEncoder,
    /// The tools on offer, rendered by the template's `tools`.
    tools: &'a [Tool],
    messages: Vec<ChatMessage>,
    /// The template's text of `messages` (and the generation prompt, if asked).
    rendered: String,
    /// The token ids of `rendered`.
    ids: Vec<u32>,
}

impl<'a> Conversation<'a> {
    /// `messages` rendered with `tools` on offer and tokenized as a prompt
    /// (special tokens such as BOS added), the assistant's turn opened when
    /// `generation_prompt`.
    pub fn start(
        encoder: &'a PromptEncoder,
        tools: &'a [Tool],
        messages: Vec<ChatMessage>,
        generation_prompt: bool,
    ) -> Result<Self> {
        let rendered = encoder.render_tools(&messages, generation_prompt, tools)?;
        let ids = encoder.tokenizer().encode(&rendered, true)?;
        Ok(Conversation {
            encoder,
            tools,
            messages,
            rendered,
            ids,
        })
    }

    /// Appends `message` (and after it the opening of the assistant's
    /// turn when `generation_prompt`); returns the ids it added.
    pub fn append(&mut self, message: ChatMessage, generation_prompt: bool) -> Result<Vec<u32>> {
        self.messages.push(message);
        let rendered = self
            .encoder
            .render_tools(&self.messages, generation_prompt, self.tools)?;
        let turn = format!(
            "{} ({})",
            self.messages.len(),
            self.messages[self.messages.len() - 1].role
        );
        let added = appended(&self.rendered, &rendered, &turn)?;
        let ids = self.encoder.tokenizer().encode(added, false)?;
        self.ids.extend(&ids);
        self.rendered = rendered;
        Ok(ids)
    }

    /// Every token id so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// What `after` (a longer conversation's rendering) adds to `before`; an
/// error naming `turn` and where the two part when the template rendered
/// the earlier turns differently.
pub(crate) fn appended<'a>(before: &str, after: &'a str, turn: &str) -> Result<&'a str> {
    after.strip_prefix(before).ok_or_else(|| Error::Config {
        field: "model.chat_template",
        message: format!(
            "the chat template renders the turns before turn {turn} differently once it follows ({}); \
             grpo appends turns and trains on the ids as they were: use a template that keeps earlier turns as they are",
            divergence(before, after)
        ),
    })
}

/// Where `after` stops extending `before`: the text of each from the first
/// character that differs (a few dozen characters, escaped).
fn divergence(before: &str, after: &str) -> String {
    let at = before
        .char_indices()
        .zip(after.chars())
        .find(|((_, a), b)| a != b)
        .map_or(before.len().min(after.len()), |((i, _), _)| i);
    let shown = |text: &str| format!("{:?}", text[at..].chars().take(40).collect::<String>());
    format!("was {} from character {at}, became {}", shown(before), shown(after))
}
