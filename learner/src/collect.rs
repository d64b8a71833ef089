//! Rollout collection, shared by training steps and evaluation: dataset
//! rows → prompt token ids (chat prompts through the model's template) →
//! the rollout engine's completions → the reward pool's scores.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use grpo_env::config::EnvironmentConfig;
use grpo_env::guard::GuardedEnvironment;
use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::{Tool, ToolCallFormat};
use grpo_reward::{Message, RewardPool, Sample, Total};
use grpo_rollout::output::Completion;
use grpo_rollout::request::{Request, SamplingParams};

use crate::data::{ChatTurn, Example, Prompt};
use crate::episode::{Budget, Episode, run_episodes};
use crate::error::{Error, Result};
use crate::fleet::Fleet;

/// A prompt as the engine and the rewards see it.
#[derive(Debug, Clone, PartialEq)]
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

    /// The prompt of an episode: chat turns (a text prompt is one user
    /// message) rendered with `tools` on offer and the generation prompt,
    /// and tokenized.
    pub fn encode_episode(&self, prompt: &Prompt, tools: &[Tool]) -> Result<EncodedPrompt> {
        let chat = prompt.chat();
        let text = self.render_tools(&chat, true, tools)?;
        let messages = chat
            .iter()
            .map(|m| Message {
                role: m.role.clone(),
                content: m.content.clone(),
            })
            .collect();
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
    /// Per prompt, its `n` completions (of a multi-turn run: each episode
    /// as one completion — every token after the prompt, the model's
    /// log-probs and 0 for the others, the last turn's text).
    pub groups: Vec<Vec<Completion>>,
    /// Per prompt, its `n` episodes in a multi-turn run (empty otherwise),
    /// in the order of `groups`.
    pub episodes: Vec<Vec<Episode>>,
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

    /// Which completion tokens of sample `j` of group `g` the model sampled
    /// (all of a single-turn completion's).
    pub fn loss_mask(&self, g: usize, j: usize) -> Vec<bool> {
        match self.episodes.get(g) {
            Some(episodes) => episodes[j].loss_mask.clone(),
            None => vec![true; self.groups[g][j].tokens.len()],
        }
    }
}

/// Where a multi-turn run's episodes take their turns: the environment
/// that answers them and their budgets.
pub struct EpisodeSetup {
    /// What answers the model's turns, under its fault policy.
    pub environment: GuardedEnvironment,
    /// The episodes' limits.
    pub budget: Budget,
    /// The most episodes live at once (all, unless set).
    concurrency: usize,
    /// The id the next episode gets (ids are unique within the process).
    next_id: AtomicU64,
}

impl EpisodeSetup {
    /// Episodes in `environment` within `budget`.
    pub fn new(environment: GuardedEnvironment, budget: Budget) -> EpisodeSetup {
        EpisodeSetup {
            environment,
            budget,
            concurrency: usize::MAX,
            next_id: AtomicU64::new(0),
        }
    }

    /// The `[environment]` table built (relative paths from `base_dir`, the
    /// config's folder), each episode at most `max_completion_tokens`
    /// after its prompt (`[rollout] max_completion_tokens`).
    pub fn from_config(
        config: &EnvironmentConfig,
        base_dir: &Path,
        max_completion_tokens: usize,
    ) -> Result<EpisodeSetup> {
        let environment = config.build(base_dir)?;
        let budget = Budget {
            max_turns: config.max_turns,
            max_turn_tokens: config.max_turn_tokens,
            max_episode_tokens: max_completion_tokens,
        };
        Ok(EpisodeSetup::new(environment, budget))
    }

    /// The same, at most `concurrency` episodes live at once (at least
    /// one row's): what the fleet's slots hold, so that later rows wait
    /// instead of evicting the slots live episodes continue in.
    pub fn with_concurrency(self, concurrency: usize) -> EpisodeSetup {
        EpisodeSetup { concurrency, ..self }
    }

    /// The tools the episodes offer.
    pub fn tools(&self) -> Vec<Tool> {
        self.environment.tools()
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
    let generated = Generated {
        prompts,
        groups,
        episodes: Vec::new(),
        time_generation: started.elapsed().as_secs_f64(),
    };
    score(generated, rewards, runtime, rows)
}

/// Runs the episodes of `rows` in `setup`'s environment (row `i`'s first
/// turn with `params(i)`, its `n` episodes) and scores each by the
/// environment's reward plus the rewards' total on its transcript (its last
/// turn as the completion): either alone when the other is missing.
pub fn collect_episodes(
    fleet: &mut dyn Fleet,
    rewards: &RewardPool,
    runtime: &tokio::runtime::Runtime,
    encoder: &PromptEncoder,
    setup: &EpisodeSetup,
    rows: &[&Example],
    params: impl Fn(usize) -> SamplingParams,
) -> Result<Collected> {
    let started = Instant::now();
    let episodes: u64 = rows.iter().enumerate().map(|(i, _)| params(i).n as u64).sum();
    let first_id = setup.next_id.fetch_add(episodes, Ordering::Relaxed);
    let run = run_episodes(
        fleet,
        &setup.environment,
        first_id,
        runtime,
        encoder,
        rows,
        params,
        setup.budget,
        setup.concurrency,
    )?;
    let prompts = run.prompts;
    let groups = run
        .groups
        .iter()
        .map(|episodes| episodes.iter().enumerate().map(|(j, e)| e.completion(j)).collect())
        .collect();
    let generated = Generated {
        prompts,
        groups,
        episodes: run.groups,
        time_generation: started.elapsed().as_secs_f64(),
    };
    score(generated, rewards, runtime, rows)
}

/// What generation produced, before scoring.
struct Generated {
    prompts: Vec<EncodedPrompt>,
    groups: Vec<Vec<Completion>>,
    episodes: Vec<Vec<Episode>>,
    time_generation: f64,
}

/// Scores every completion of `generated` (each episode's environment
/// reward added to its total).
fn score(
    generated: Generated,
    rewards: &RewardPool,
    runtime: &tokio::runtime::Runtime,
    rows: &[&Example],
) -> Result<Collected> {
    let scoring = Instant::now();
    let Generated {
        prompts,
        groups,
        episodes,
        time_generation,
    } = generated;
    let mut samples = Vec::new();
    for (g, (group, prompt)) in groups.iter().zip(&prompts).enumerate() {
        for (j, completion) in group.iter().enumerate() {
            let mut messages = prompt.messages.clone();
            if let Some(episode) = episodes.get(g).map(|e| &e[j]) {
                messages.extend(episode.messages.iter().map(|m| Message {
                    role: m.role.clone(),
                    content: m.content.clone(),
                }));
            }
            samples.push(Sample {
                id: samples.len() as u64,
                group_id: g as u64,
                prompt: prompt.text.clone(),
                messages,
                completion: completion.text.clone().unwrap_or_default(),
                completion_ids: completion.tokens.clone(),
                row: rows[g].columns.clone(),
            });
        }
    }
    let mut totals = runtime.block_on(rewards.score(&samples))?;
    for (total, episode) in totals.iter_mut().zip(episodes.iter().flatten()) {
        if episode.skipped {
            *total = Total::default();
        } else if let Some(reward) = episode.reward {
            total.reward = Some(total.reward.unwrap_or(0.0) + reward);
            total.components.insert(ENVIRONMENT_REWARD.to_string(), reward);
        }
    }
    Ok(Collected {
        prompts,
        groups,
        episodes,
        totals,
        time_generation,
        time_reward: scoring.elapsed().as_secs_f64(),
    })
}

/// The name of an environment's reward among a total's components
/// (`rewards/environment/mean` in the metrics).
pub const ENVIRONMENT_REWARD: &str = "environment";
