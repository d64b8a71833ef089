//! Rollout collection, shared by training steps and evaluation: dataset
//! rows → prompt token ids (chat prompts through the model's template) →
//! the rollout engine's completions → the reward pool's scores.

use std::sync::Arc;
use std::time::Instant;

use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::{Tool, ToolCallFormat};
use grpo_reward::{Message, RewardPool, Sample, Total};
use grpo_rollout::output::Completion;
use grpo_rollout::request::{Request, SamplingParams};

use crate::data::{ChatTurn, Example, Prompt};
use crate::error::{Error, Result};
use crate::fleet::Fleet;

/// A prompt as the engine and the rewards see it.
#[derive(Debug, Clone)]
pub struct EncodedPrompt {
    /// The text (the rendered chat for chat prompts).
    pub text: String,
    /// The chat turns (empty for text prompts).
    pub messages: Vec<Message>,
    /// The token ids.
    pub ids: Vec<u32>,
}

/// Turns dataset prompts into token ids.
pub struct PromptEncoder {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// How the template's model writes tool calls.
    tool_format: ToolCallFormat,
}

impl PromptEncoder {
    /// An encoder with `tokenizer` (and its chat template, if it has one).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<PromptEncoder> {
        let template = tokenizer.chat_template().map(ChatTemplate::new).transpose()?;
        let tool_format = ToolCallFormat::of_template(tokenizer.chat_template().unwrap_or_default());
        Ok(PromptEncoder {
            tokenizer,
            template,
            tool_format,
        })
    }

    /// The prompt rendered (chat prompts with the generation prompt) and tokenized.
    pub fn encode(&self, prompt: &Prompt) -> Result<EncodedPrompt> {
        let (text, messages) = match prompt {
            Prompt::Text(text) => (text.clone(), Vec::new()),
            Prompt::Chat(turns) => {
                let chat: Vec<ChatMessage> = turns.iter().map(ChatTurn::message).collect();
                let text = self.render(&chat, true)?;
                let messages = turns
                    .iter()
                    .map(|t| Message {
                        role: t.role.clone(),
                        content: t.text().to_string(),
                    })
                    .collect();
                (text, messages)
            }
        };
        let ids = self.tokenizer.encode(&text, true)?;
        Ok(EncodedPrompt { text, messages, ids })
    }

    /// `messages` rendered by the chat template (`add_generation_prompt`
    /// appends the opening of the assistant's turn).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_tools(messages, add_generation_prompt, &[])
    }

    /// As [`PromptEncoder::render`], with `tools` on offer.
    pub fn render_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: &[Tool],
    ) -> Result<String> {
        let template = self.template.as_ref().ok_or_else(|| Error::Config {
            field: "data.prompt_column",
            message: "chat prompts need a tokenizer with a chat template".to_string(),
        })?;
        let special = self.tokenizer.special_tokens();
        let token = |id: Option<u32>| id.and_then(|i| self.tokenizer.id_to_token(i)).unwrap_or_default();
        Ok(template.render_with(
            messages,
            add_generation_prompt,
            &token(special.bos),
            &token(special.eos),
            tools,
            &serde_json::Map::new(),
        )?)
    }

    /// How the chat template's model writes tool calls.
    pub fn tool_format(&self) -> ToolCallFormat {
        self.tool_format
    }

    /// The end-of-sequence token's text, if the tokenizer has one.
    pub fn eos_text(&self) -> Option<String> {
        self.tokenizer.eos_id().and_then(|id| self.tokenizer.id_to_token(id))
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// The groups of one collection: per prompt its completions and their rewards.
pub struct Collected {
    /// The prompts, in request order.
    pub prompts: Vec<EncodedPrompt>,
    /// Per prompt, its `n` completions.
    pub groups: Vec<Vec<Completion>>,
    /// Every completion's reward, group after group.
    pub totals: Vec<Total>,
    /// Seconds generating.
    pub time_generation: f64,
    /// Seconds scoring.
    pub time_reward: f64,
}

impl Collected {
    /// The rewards, group after group (`None`: no reward scored the sample).
    pub fn rewards(&self) -> Vec<Option<f32>> {
        self.totals.iter().map(|t| t.reward).collect()
    }

    /// Every completion, group after group.
    pub fn completions(&self) -> impl Iterator<Item = &Completion> {
        self.groups.iter().flatten()
    }
}

/// Generates for `rows` (request `i` with `params(i)`) and scores the completions.
pub fn collect(
    fleet: &mut dyn Fleet,
    rewards: &RewardPool,
    runtime: &tokio::runtime::Runtime,
    encoder: &PromptEncoder,
    rows: &[&Example],
    params: impl Fn(usize) -> SamplingParams,
) -> Result<Collected> {
    let started = Instant::now();
    let prompts = rows
        .iter()
        .map(|row| encoder.encode(&row.prompt))
        .collect::<Result<Vec<_>>>()?;
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.ids.clone(),
            params: params(i),
        })
        .collect();
    let groups = fleet.generate(&requests)?;
    let time_generation = started.elapsed().as_secs_f64();

    let scoring = Instant::now();
    let mut samples = Vec::new();
    for (g, (group, prompt)) in groups.iter().zip(&prompts).enumerate() {
        for completion in group {
            samples.push(Sample {
                id: samples.len() as u64,
                group_id: g as u64,
                prompt: prompt.text.clone(),
                messages: prompt.messages.clone(),
                completion: completion.text.clone().unwrap_or_default(),
                completion_ids: completion.tokens.clone(),
                row: rows[g].columns.clone(),
            });
        }
    }
    let totals = runtime.block_on(rewards.score(&samples))?;
    Ok(Collected {
        prompts,
        groups,
        totals,
        time_generation,
        time_reward: scoring.elapsed().as_secs_f64(),
    })
}
