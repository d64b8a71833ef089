//! Multi-turn episodes on the fleet: the model writes a turn, the
//! environment answers (tool results, a user or observation message) or
//! ends the episode, and the next turn continues from everything so far.
//!
//! Turns run in lockstep rounds: every live episode generates its turn
//! (the first turn of a row's `G` episodes is one request of `n = G`,
//! sharing its prefill), the environment answers every turn at once, and
//! the next round goes on. Each next turn's prompt is the episode's whole
//! token history and goes to the fleet member that served the episode so
//! far, so an engine that still keeps the episode's slot continues it and
//! computes only the new tokens. At most `concurrency` episodes (the
//! fleet's slots) are live at once: later rows start in the rounds after
//! earlier episodes end, their first turns queued behind the live
//! episodes' next turns, so those find their slots kept instead of
//! evicted by rows that cannot run yet.
//!
//! Tokens are appended, never re-rendered: the model's turn is the ids it
//! sampled, and an environment's answer is the text the chat template adds
//! after that turn (the rest of the turn's closing, e.g. ChatML's newline
//! after `<|im_end|>`, the answer's messages, the next assistant header),
//! tokenized on its own. So the ids trained on are exactly those sampled
//! and read; a template that would render earlier turns differently once
//! more follow is refused, naming the turn.
//!
//! An episode ends when the environment says so, after `max_turns` model
//! turns, when the next turn would not fit `max_episode_tokens` (tokens
//! after the prompt, the model's and the environment's), or on an
//! environment fault (as the environment's `on_error` says: a score stands
//! in for its reward, or the episode is left out of training).

use grpo_env::environment::EpisodeView;
use grpo_env::guard::{Answer, GuardedEnvironment};
use grpo_model::chat::ChatMessage;
use grpo_model::tools::{ParsedTurn, Tool, parse_tool_calls};
use grpo_rollout::guided::Guide;
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{Request, SamplingParams};
use serde_json::{Map, Value};

use crate::collect::{EncodedPrompt, PromptEncoder};
use crate::conversation::appended;
use crate::data::Example;
use crate::error::Result;
use crate::fleet::{Fleet, MemberId, Served};

/// An episode's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most model turns.
    pub max_turns: usize,
    /// Most tokens in one model turn.
    pub max_turn_tokens: usize,
    /// Most tokens after the prompt, the model's and the environment's.
    pub max_episode_tokens: usize,
}

/// Why an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EpisodeEnd {
    /// The environment ended it.
    Done,
    /// The model used its `max_turns` turns.
    MaxTurns,
    /// The next turn would not fit `max_episode_tokens`.
    TokenBudget,
    /// The environment faulted (crashed, timed out, answered out of protocol).
    Fault,
}

impl EpisodeEnd {
    /// The name metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            EpisodeEnd::Done => "done",
            EpisodeEnd::MaxTurns => "max_turns",
            EpisodeEnd::TokenBudget => "token_budget",
            EpisodeEnd::Fault => "fault",
        }
    }
}

/// One finished episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Every token after the prompt: the model's turns and what came between them.
    pub tokens: Vec<u32>,
    /// Which of them the model sampled (they carry loss).
    pub loss_mask: Vec<bool>,
    /// The behaviour log-prob of each sampled token (0 for the others).
    pub logprobs: Vec<f32>,
    /// The policy version each sampled token came from (0 for the others).
    pub versions: Vec<u64>,
    /// The messages after the prompt: the model's turns (with their parsed
    /// tool calls) and the environment's answers.
    pub messages: Vec<ChatMessage>,
    /// Model turns taken.
    pub turns: usize,
    /// Tool calls the model made, well-formed or not.
    pub tool_calls: usize,
    /// Of those, the ones the environment said could not run.
    pub failed_tool_calls: usize,
    /// Model turns cut by their token limit.
    pub truncated_turns: usize,
    /// Why it ended.
    pub end: EpisodeEnd,
    /// The environment's reward, if it gave one (under `on_error = <score>`
    /// a fault's score).
    pub reward: Option<f32>,
    /// A fault ended it under `on_error = "skip"`: it is left out of training.
    pub skipped: bool,
}

impl Episode {
    /// The episode as sample `index` of its group: every token after the
    /// prompt, their log-probs and versions, the last turn's text; `stop`
    /// when the environment ended it, else `length`.
    pub fn completion(&self, index: usize) -> Completion {
        Completion {
            index,
            tokens: self.tokens.clone(),
            logprobs: self.logprobs.clone(),
            top_logprobs: vec![Vec::new(); self.tokens.len()],
            versions: self.versions.clone(),
            text: Some(self.last_turn().to_string()),
            finish_reason: if self.end == EpisodeEnd::Done {
                FinishReason::Stop
            } else {
                FinishReason::Length
            },
            stop_reason: None,
        }
    }

    /// The model's last turn's text outside its tool calls.
    pub fn last_turn(&self) -> &str {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "assistant")
            .map_or("", |m| m.content.as_str())
    }
}

/// The episodes of a batch of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Episodes {
    /// Each row's prompt (its chat rendered with the tools on offer).
    pub prompts: Vec<EncodedPrompt>,
    /// Each row's episodes, in sample order.
    pub groups: Vec<Vec<Episode>>,
}

/// An episode while it runs.
struct Live<'a> {
    /// Its place among the batch's episodes (rows in order, then samples).
    place: usize,
    /// Its id, as the environment knows it.
    id: u64,
    /// Its row.
    row: usize,
    /// The seed its later turns derive from.
    seed: u32,
    /// What its next turn must be, as the environment said last (`None`:
    /// its row's settings alone).
    guide: Option<Guide>,
    /// The prompt's ids then every token so far.
    ids: Vec<u32>,
    /// Every message so far, the prompt's first.
    messages: Vec<ChatMessage>,
    /// The template's text of `messages` as the model's last turn was
    /// opened (the prompt, or the text after the environment's last answer).
    rendered: String,
    /// Whether the model's last turn ended with its end-of-turn token
    /// (else it was cut, and the answer first closes the turn).
    closed: bool,
    /// The fleet member that served its last turn.
    member: MemberId,
    episode: Episode,
    columns: &'a Map<String, Value>,
}

/// Runs `n` episodes of each of `rows` (row `i`'s first turn
/// sampled with `params(i)`, its `n` the group size; later turns with the
/// same settings, one sample each, guided as the environment's last answer
/// says where it says), at most `concurrency` live at once (a
/// row's episodes start together, so a row of more starts alone). The
/// episodes' ids are `first_id` on, in order; the environment is told of
/// each one's end.
#[allow(clippy::too_many_arguments)]
pub fn run_episodes(
    fleet: &mut dyn Fleet,
    environment: &GuardedEnvironment,
    first_id: u64,
    runtime: &tokio::runtime::Runtime,
    encoder: &PromptEncoder,
    rows: &[&Example],
    params: impl Fn(usize) -> SamplingParams,
    budget: Budget,
    concurrency: usize,
) -> Result<Episodes> {
    let tools = environment.tools();
    let mut prompts = Vec::with_capacity(rows.len());
    let mut live: Vec<Live<'_>> = Vec::new();
    let mut requests = Vec::new();
    let mut prefer = Vec::new();
    let mut started = 0;
    let mut finished: Vec<(usize, usize, Episode)> = Vec::new();
    loop {
        // Rows start while their episodes fit beside the live ones.
        while let Some(row) = rows.get(prompts.len())
            && (live.is_empty() || live.len() + params(prompts.len()).n <= concurrency)
        {
            let i = prompts.len();
            let prompt = start_row(row, i, &params(i), encoder, &tools, first_id, &mut started, &mut live)?;
            requests.push(Request {
                prompt: prompt.ids.clone(),
                params: SamplingParams {
                    max_tokens: params(i)
                        .max_tokens
                        .min(budget.max_turn_tokens)
                        .min(budget.max_episode_tokens),
                    ..params(i)
                },
            });
            prefer.push(None);
            prompts.push(prompt);
        }
        if live.is_empty() {
            break;
        }
        let turns = served_turns(fleet.generate_preferring(&requests, &prefer)?);
        (requests, prefer) = (Vec::new(), Vec::new());
        let mut views = Vec::with_capacity(live.len());
        for (episode, (completion, member)) in live.iter_mut().zip(turns) {
            episode.member = member;
            views.push(take_turn(episode, completion, encoder)?);
        }
        let replies = runtime.block_on(async {
            let calls = live.iter().zip(&views).map(|(episode, turn)| {
                environment.step(EpisodeView {
                    id: episode.id,
                    row: episode.columns,
                    messages: &episode.messages,
                    turn,
                })
            });
            futures::future::join_all(calls).await
        });
        let mut still = Vec::with_capacity(live.len());
        let mut ended = Vec::new();
        for (mut episode, reply) in live.into_iter().zip(replies) {
            let reply = reply?;
            match answer(&mut episode, reply, encoder, &tools, budget)? {
                Some(end) => {
                    episode.episode.end = end;
                    ended.push(episode.id);
                    finished.push((episode.place, episode.row, episode.episode));
                }
                None => {
                    let used = episode.episode.tokens.len();
                    let turn = episode.episode.turns as u32;
                    let row = params(episode.row);
                    requests.push(Request {
                        prompt: episode.ids.clone(),
                        params: SamplingParams {
                            n: 1,
                            max_tokens: budget.max_turn_tokens.min(budget.max_episode_tokens - used),
                            seed: episode.seed.wrapping_add(turn.wrapping_mul(0x9E37_79B9)),
                            guide: episode.guide.take().or(row.guide),
                            ..row
                        },
                    });
                    prefer.push(Some(episode.member));
                    still.push(episode);
                }
            }
        }
        runtime.block_on(futures::future::join_all(
            ended.into_iter().map(|id| environment.end(id)),
        ));
        live = still;
    }
    // Episodes finish in any order; each row's keep their sample order.
    finished.sort_by_key(|(place, _, _)| *place);
    let mut groups: Vec<Vec<Episode>> = (0..rows.len()).map(|_| Vec::new()).collect();
    for (_, row, episode) in finished {
        groups[row].push(episode);
    }
    Ok(Episodes { prompts, groups })
}

/// Starts row `i`'s episodes (`first.n`, its first turn's settings) as
/// live episodes `started` on, counting them; returns its prompt.
#[allow(clippy::too_many_arguments)]
fn start_row<'a>(
    row: &'a Example,
    i: usize,
    first: &SamplingParams,
    encoder: &PromptEncoder,
    tools: &[Tool],
    first_id: u64,
    started: &mut usize,
    live: &mut Vec<Live<'a>>,
) -> Result<EncodedPrompt> {
    let messages = row.prompt.chat();
    let prompt = encoder.encode_episode(&row.prompt, tools)?;
    for j in 0..first.n {
        live.push(Live {
            place: *started,
            id: first_id + *started as u64,
            row: i,
            seed: first.sample_seed(j),
            guide: None,
            ids: prompt.ids.clone(),
            messages: messages.clone(),
            rendered: prompt.text.clone(),
            closed: false,
            member: 0,
            episode: Episode::default(),
            columns: &row.columns,
        });
        *started += 1;
    }
    Ok(prompt)
}

/// Each sample of `served`, request after request, with the member that made it.
fn served_turns(served: Vec<Served>) -> Vec<(Completion, MemberId)> {
    served
        .into_iter()
        .flat_map(|s| s.completions.into_iter().map(move |c| (c, s.member)))
        .collect()
}

impl Default for Episode {
    fn default() -> Self {
        Episode {
            tokens: Vec::new(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            versions: Vec::new(),
            messages: Vec::new(),
            turns: 0,
            tool_calls: 0,
            failed_tool_calls: 0,
            truncated_turns: 0,
            end: EpisodeEnd::Done,
            reward: None,
            skipped: false,
        }
    }
}

/// Appends the model's turn `completion` to `episode`; returns its calls.
fn take_turn(episode: &mut Live<'_>, completion: Completion, encoder: &PromptEncoder) -> Result<ParsedTurn> {
    let text = match completion.text {
        Some(text) => text,
        None => encoder.tokenizer().decode(&completion.tokens, true)?,
    };
    let e = &mut episode.episode;
    e.turns += 1;
    if completion.finish_reason == FinishReason::Length {
        e.truncated_turns += 1;
    }
    e.tokens.extend(&completion.tokens);
    e.loss_mask.extend(std::iter::repeat_n(true, completion.tokens.len()));
    e.logprobs.extend(&completion.logprobs);
    e.versions.extend(&completion.versions);
    episode.ids.extend(&completion.tokens);
    episode.closed =
        completion.tokens.last().is_some() && completion.tokens.last().copied() == encoder.tokenizer().eos_id();
    let turn = parse_tool_calls(&text, encoder.tool_format());
    e.tool_calls += turn.calls.len();
    let message = ChatMessage::new("assistant", turn.content.clone())
        .with_tool_calls(turn.well_formed().into_iter().cloned().collect());
    e.messages.push(message.clone());
    episode.messages.push(message);
    Ok(turn)
}

/// Applies the environment's `reply` to `episode`: the end, if it ends
/// here, else `None` with the answer's tokens appended.
fn answer(
    episode: &mut Live<'_>,
    reply: Answer,
    encoder: &PromptEncoder,
    tools: &[Tool],
    budget: Budget,
) -> Result<Option<EpisodeEnd>> {
    let messages = match reply {
        Answer::Done { reward } => {
            episode.episode.reward = reward;
            return Ok(Some(EpisodeEnd::Done));
        }
        Answer::Faulted { reward, .. } => {
            episode.episode.reward = Some(reward);
            return Ok(Some(EpisodeEnd::Fault));
        }
        Answer::Skipped { .. } => {
            episode.episode.skipped = true;
            return Ok(Some(EpisodeEnd::Fault));
        }
        Answer::Continue {
            messages,
            failed_calls,
            guide,
        } => {
            episode.episode.failed_tool_calls += failed_calls;
            episode.guide = guide;
            messages
        }
    };
    if episode.episode.turns >= budget.max_turns {
        return Ok(Some(EpisodeEnd::MaxTurns));
    }
    let (text, rendered) = answer_text(episode, &messages, encoder, tools)?;
    let ids = encoder.tokenizer().encode(&text, false)?;
    let used = episode.episode.tokens.len() + ids.len();
    if used >= budget.max_episode_tokens {
        return Ok(Some(EpisodeEnd::TokenBudget));
    }
    let e = &mut episode.episode;
    e.tokens.extend(&ids);
    e.loss_mask.extend(std::iter::repeat_n(false, ids.len()));
    e.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
    e.versions.extend(std::iter::repeat_n(0, ids.len()));
    e.messages.extend(messages.iter().cloned());
    episode.ids.extend(&ids);
    episode.messages.extend(messages);
    episode.rendered = rendered;
    Ok(None)
}

/// The text the template adds after the model's last turn when `messages`
/// answer it (the rest of the turn's closing after its end-of-turn token,
/// the messages, and the next assistant header), and the whole rendering
/// with them.
fn answer_text(
    episode: &Live<'_>,
    messages: &[ChatMessage],
    encoder: &PromptEncoder,
    tools: &[Tool],
) -> Result<(String, String)> {
    let with_turn = encoder.render_tools(&episode.messages, false, tools)?;
    let mut all = episode.messages.clone();
    all.extend(messages.iter().cloned());
    let with_answer = encoder.render_tools(&all, true, tools)?;
    let turn = episode.messages.len().to_string();
    let added = appended(&with_turn, &with_answer, &turn)?;
    // What the template writes to close the turn: after its end-of-turn
    // token when the sampled ids end with it, from that token on when the
    // turn was cut.
    let turn_text = appended(&episode.rendered, &with_turn, &turn)?;
    let closing = encoder
        .eos_text()
        .and_then(|eos| {
            let at = turn_text.rfind(eos.as_str())?;
            Some(if episode.closed {
                &turn_text[at + eos.len()..]
            } else {
                &turn_text[at..]
            })
        })
        .unwrap_or("");
    let text = format!("{closing}{added}");
    Ok((text, with_answer))
}
