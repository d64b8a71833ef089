//! `POST /v1/chat/completions`: messages rendered with the model's chat
//! template (`add_generation_prompt`, `continue_final_message`), `n`
//! samples, log-probs in the chat shape (`content[].{token, logprob, bytes,
//! top_logprobs}`), `max_completion_tokens` (default: the rest of the
//! context), `return_token_ids`, streaming with a role chunk per choice;
//! tool calling (`tools`, `tool_choice`, history calls, answers'
//! `tool_calls`, whole or as stream deltas: [`crate::tools`]); structured
//! outputs ([`crate::structured`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use grpo_model::chat::ChatMessage;
use grpo_rollout::request::Request;
use serde_json::Value;

use crate::blocking::off_thread;
use crate::error::{Error, Result};
use crate::json::WithSampling;
use crate::model::ServedModel;
use crate::protocol::chat::{
    ChatChoice, ChatLogprobs, ChatMessageIn, ChatMessageOut, ChatRequest, ChatResponse, Content, TokenLogprob,
    TopLogprob,
};
use crate::protocol::common::Usage;
use crate::routes::generate::{ChoiceUpdate, Chunker, TokenView, chunks, collect, request_id, start, unix_now};
use crate::state::AppState;
use crate::tools::{self, StreamedCalls, ToolCalling};
use crate::{sse, validate};

/// The messages as the chat template takes them (text parts joined).
pub fn messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(Error::invalid("messages", "messages must not be empty"));
    }
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(text)) => text.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(Error::invalid(
                                    "messages",
                                    format!("content parts of type `{kind}` are not supported (only `text` with a `text` field)"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            let message = ChatMessage::new(m.role.clone(), content);
            match &m.tool_calls {
                Some(calls) if !calls.is_empty() => Ok(message.with_tool_calls(tools::history_calls(calls)?)),
                _ => Ok(message),
            }
        })
        .collect()
}

/// Chat log-probs of `tokens`.
fn logprobs(model: &ServedModel, tokens: &[TokenView<'_>]) -> ChatLogprobs {
    let entry = |id: u32, logprob: f32| {
        let token = model.token_text(id);
        let bytes = token.as_bytes().to_vec();
        (token, logprob, bytes)
    };
    let content = tokens
        .iter()
        .map(|t| {
            let (token, logprob, bytes) = entry(t.id, t.logprob);
            let top_logprobs = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (token, logprob, bytes) = entry(id, lp);
                    TopLogprob { token, logprob, bytes }
                })
                .collect();
            TokenLogprob {
                token,
                logprob,
                bytes,
                top_logprobs,
            }
        })
        .collect();
    ChatLogprobs { content }
}

/// What the response's choices are built from.
struct Shape {
    id: String,
    created: u64,
    model: Arc<ServedModel>,
    /// The name the response carries: the adapter's when one generates.
    name: String,
    prompt: Vec<u32>,
    n: usize,
    logprobs: bool,
    return_token_ids: bool,
}

impl Shape {
    fn response(&self, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Usage>, first: bool) -> Value {
        serde_json::to_value(ChatResponse {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.name.clone(),
            choices,
            usage,
            prompt_token_ids: (self.return_token_ids && first).then(|| self.prompt.clone()),
        })
        .unwrap_or_default()
    }

    fn chunk(&self, choices: Vec<ChatChoice>, usage: Option<Usage>, first: bool) -> Value {
        self.response("chat.completion.chunk", choices, usage, first)
    }
}

/// Stream chunks of a chat: a role chunk per choice, then one per token (and per finish).
struct ChatChunker {
    shape: Shape,
    /// How answers' tool calls are read, when the model may call tools.
    calling: Option<ToolCalling>,
    /// Each choice's calls so far.
    streams: HashMap<usize, StreamedCalls>,
}

impl Chunker for ChatChunker {
    fn opening(&mut self) -> Vec<Value> {
        (0..self.shape.n)
            .map(|index| {
                let delta = ChatMessageOut {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    tool_calls: None,
                };
                let choice = ChatChoice {
                    index,
                    message: None,
                    delta: Some(delta),
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: None,
                };
                self.shape.chunk(vec![choice], None, index == 0)
            })
            .collect()
    }

    fn update(&mut self, u: ChoiceUpdate<'_>) -> Option<Value> {
        let finished = u.update.finished.as_ref();
        if u.update.token.is_none() && finished.is_none() {
            return None;
        }
        let tokens = TokenView::of_update(u.update);
        let (content, tool_calls, called) = match self.calling {
            None => (u.delta, None, false),
            Some(calling) => {
                let stream = self
                    .streams
                    .entry(u.choice)
                    .or_insert_with(|| StreamedCalls::new(calling));
                let (content, calls) = stream.push(&u.delta, finished.is_some());
                (content, (!calls.is_empty()).then_some(calls), stream.called())
            }
        };
        let choice = ChatChoice {
            index: u.choice,
            message: None,
            delta: Some(ChatMessageOut {
                role: None,
                content: Some(content),
                tool_calls,
            }),
            logprobs: self.shape.logprobs.then(|| logprobs(&self.shape.model, &tokens)),
            finish_reason: finished.map(|c| tools::finish_reason(c.finish_reason, called)),
            stop_reason: finished.and_then(|c| self.shape.model.stop_reason(&c.stop_reason)),
            token_ids: self
                .shape
                .return_token_ids
                .then(|| tokens.iter().map(|t| t.id).collect()),
        };
        Some(self.shape.chunk(vec![choice], None, false))
    }

    fn usage(&self, usage: Usage) -> Value {
        self.shape.chunk(Vec::new(), Some(usage), false)
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    WithSampling(request, sampling): WithSampling<ChatRequest>,
) -> Result<Response> {
    let target = state.resolve_model(request.model.as_deref())?;
    let model = state.model.clone();
    let messages = messages(&request.messages)?;
    let offer = tools::offered(&request, model.tool_format)?;
    let (offered, calling) = (offer.tools, offer.calling);
    model.check_text_bytes("messages", messages.iter().map(|m| m.content.len()).sum())?;
    let kwargs = request.chat_template_kwargs.clone().unwrap_or_default();
    let (generation_prompt, continued) = (request.add_generation_prompt, request.continue_final_message);
    let rendering = model.clone();
    let prompt = off_thread(move || {
        let text = rendering.render_chat(&messages, &offered, generation_prompt, continued, &kwargs)?;
        rendering.encode(&text, false)
    })
    .await?;
    let room = model.max_model_len.saturating_sub(prompt.len()).max(1) as i64;
    let max_tokens = match request.max_completion_tokens.or(request.max_tokens) {
        Some(value) => validate::max_tokens("max_completion_tokens", value, model.max_model_len)?,
        None => room as usize,
    };
    let top = match (request.logprobs, request.top_logprobs) {
        (true, top) => Some(validate::top_logprobs("top_logprobs", top.unwrap_or(0))?),
        (false, Some(_)) => return Err(Error::invalid("top_logprobs", "top_logprobs needs logprobs: true")),
        (false, None) => None,
    };
    let limits = &state.config.limits;
    let (mut params, requested) = validate::sampling(&sampling, max_tokens, top, limits)?;
    params.adapter = target.adapter;
    let guided_by = match offer.guide.is_some() {
        true => Some("tool_choice"),
        false => requested,
    };
    if let Some(guide) = offer.guide {
        if params.guide.is_some() {
            return Err(Error::invalid(
                "tool_choice",
                "tool_choice \"required\" or a named function already guides the answer: leave out the structured output",
            ));
        }
        params.guide = Some(guide);
    }
    let n = params.n;
    limits.check_size(1, n)?;
    let prompt_tokens = prompt.len();
    let merged = start(
        &state,
        vec![Request {
            prompt: prompt.clone(),
            params,
        }],
    )
    .await
    .map_err(|e| e.guided_by(guided_by))?;
    let shape = Shape {
        id: request_id("chatcmpl"),
        created: unix_now(),
        model,
        name: target.name,
        prompt,
        n,
        logprobs: request.logprobs,
        return_token_ids: sampling.return_token_ids,
    };
    if sampling.stream {
        let include_usage = sampling.include_usage();
        return Ok(sse::respond(chunks(
            merged,
            ChatChunker {
                shape,
                calling,
                streams: HashMap::new(),
            },
            n,
            prompt_tokens,
            include_usage,
        )));
    }
    let done = collect(merged, n).await?;
    let completion_tokens = done.iter().map(|(_, c)| c.tokens.len()).sum();
    let choices = done
        .into_iter()
        .map(|(_, c)| {
            let text = c.text.clone().unwrap_or_default();
            let (content, tool_calls) = match calling {
                None => (Some(text), None),
                Some(calling) => {
                    let (content, calls) = tools::answer(&text, calling);
                    (content, (!calls.is_empty()).then_some(calls))
                }
            };
            ChatChoice {
                index: c.index,
                finish_reason: Some(tools::finish_reason(c.finish_reason, tool_calls.is_some())),
                message: Some(ChatMessageOut {
                    role: Some("assistant"),
                    content,
                    tool_calls,
                }),
                delta: None,
                logprobs: shape
                    .logprobs
                    .then(|| logprobs(&shape.model, &TokenView::of_completion(&c))),
                stop_reason: shape.model.stop_reason(&c.stop_reason),
                token_ids: shape.return_token_ids.then(|| c.tokens.clone()),
            }
        })
        .collect();
    let usage = Usage::new(prompt_tokens, completion_tokens);
    Ok(Json(shape.response("chat.completion", choices, Some(usage), true)).into_response())
}
