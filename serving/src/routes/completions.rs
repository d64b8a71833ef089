//! `POST /v1/completions`: prompts as text, texts, token ids or lists of
//! them; `n` samples each; legacy log-probs (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`); `echo`; `return_token_ids`; streaming.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use grpo_rollout::request::Request;
use serde_json::Value;

use crate::blocking::off_thread;
use crate::error::{Error, Result};
use crate::json::WithSampling;
use crate::model::ServedModel;
use crate::protocol::common::Usage;
use crate::protocol::completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Prompt,
};
use crate::routes::generate::{ChoiceUpdate, Chunker, TokenView, chunks, collect, request_id, start, unix_now};
use crate::state::AppState;
use crate::{sse, validate};

/// vLLM's default `max_tokens` of a completion.
const DEFAULT_MAX_TOKENS: i64 = 16;

/// The token ids of each prompt.
fn prompts(model: &ServedModel, prompt: Prompt) -> Result<Vec<Vec<u32>>> {
    let bytes = match &prompt {
        Prompt::Text(text) => text.len(),
        Prompt::Texts(texts) => texts.iter().map(String::len).max().unwrap_or(0),
        _ => 0,
    };
    model.check_text_bytes("prompt", bytes)?;
    let prompts = match prompt {
        Prompt::Text(text) => vec![model.encode(&text, true)?],
        Prompt::Texts(texts) => texts.iter().map(|t| model.encode(t, true)).collect::<Result<_>>()?,
        Prompt::Tokens(ids) => vec![validate::token_ids("prompt", &ids)?],
        Prompt::TokenLists(lists) => lists
            .iter()
            .map(|ids| validate::token_ids("prompt", ids))
            .collect::<Result<_>>()?,
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(Error::invalid("prompt", "the prompt is empty"));
    }
    Ok(prompts)
}

/// Legacy log-probs of `tokens` whose text starts at `offset` (characters).
fn logprobs(model: &ServedModel, tokens: &[TokenView<'_>], mut offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for token in tokens {
        let text = model.token_text(token.id);
        out.text_offset.push(offset);
        offset += text.chars().count();
        out.token_logprobs.push(token.logprob);
        out.tokens.push(text);
        let top = token.top.iter().map(|&(id, lp)| (model.token_text(id), lp));
        out.top_logprobs.push(top.collect());
    }
    out
}

/// What the response's choices are built from.
struct Shape {
    id: String,
    created: u64,
    model: Arc<ServedModel>,
    /// The name the response carries: the adapter's when one generates.
    name: String,
    prompts: Vec<Vec<u32>>,
    /// Each prompt's text, with `echo`.
    echo: Option<Vec<String>>,
    logprobs: bool,
    return_token_ids: bool,
}

impl Shape {
    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Value {
        serde_json::to_value(CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.name.clone(),
            choices,
            usage,
        })
        .unwrap_or_default()
    }

    fn echoed(&self, prompt: usize) -> &str {
        self.echo
            .as_ref()
            .map(|texts| texts[prompt].as_str())
            .unwrap_or_default()
    }
}

/// Stream chunks of a completion: one per token (and per finish).
struct CompletionChunker {
    shape: Shape,
    started: HashSet<usize>,
    /// Characters of text sent per choice.
    offsets: HashMap<usize, usize>,
}

impl Chunker for CompletionChunker {
    fn opening(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn update(&mut self, u: ChoiceUpdate<'_>) -> Option<Value> {
        let finished = u.update.finished.as_ref();
        if u.update.token.is_none() && finished.is_none() {
            return None;
        }
        let first = self.started.insert(u.choice);
        let delta_chars = u.delta.chars().count();
        let text = if first {
            format!("{}{}", self.shape.echoed(u.prompt), u.delta)
        } else {
            u.delta
        };
        let echoed = self.shape.echoed(u.prompt).chars().count();
        let offset = self.offsets.entry(u.choice).or_insert(echoed);
        let tokens = TokenView::of_update(u.update);
        let logprobs = self
            .shape
            .logprobs
            .then(|| logprobs(&self.shape.model, &tokens, *offset));
        *offset += delta_chars;
        let choice = CompletionChoice {
            index: u.choice,
            text,
            logprobs,
            finish_reason: finished.map(|c| c.finish_reason.as_str()),
            stop_reason: finished.and_then(|c| self.shape.model.stop_reason(&c.stop_reason)),
            prompt_token_ids: (self.shape.return_token_ids && first).then(|| self.shape.prompts[u.prompt].clone()),
            token_ids: self
                .shape
                .return_token_ids
                .then(|| tokens.iter().map(|t| t.id).collect()),
        };
        Some(self.shape.response(vec![choice], None))
    }

    fn usage(&self, usage: Usage) -> Value {
        self.shape.response(Vec::new(), Some(usage))
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    WithSampling(request, sampling): WithSampling<CompletionRequest>,
) -> Result<Response> {
    let target = state.resolve_model(request.model.as_deref())?;
    let model = state.model.clone();
    let prompts = {
        let (model, prompt) = (model.clone(), request.prompt);
        off_thread(move || prompts(&model, prompt)).await?
    };
    let max_tokens = validate::max_tokens(
        "max_tokens",
        request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        model.max_model_len,
    )?;
    let top = request
        .logprobs
        .map(|k| validate::top_logprobs("logprobs", k))
        .transpose()?;
    if request.echo && top.is_some() {
        return Err(Error::invalid(
            "echo",
            "echo with logprobs is not supported (it needs prompt log-probs)",
        ));
    }
    let limits = &state.config.limits;
    let (mut params, guided_by) = validate::sampling(&sampling, max_tokens, top, limits)?;
    params.adapter = target.adapter;
    let n = params.n;
    limits.check_size(prompts.len(), n)?;
    let echo = match request.echo {
        true => Some(prompts.iter().map(|p| model.decode(p)).collect::<Result<_>>()?),
        false => None,
    };
    let engine_requests = prompts.iter().map(|p| Request {
        prompt: p.clone(),
        params: params.clone(),
    });
    let merged = start(&state, engine_requests.collect())
        .await
        .map_err(|e| e.guided_by(guided_by))?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let shape = Shape {
        id: request_id("cmpl"),
        created: unix_now(),
        model,
        name: target.name,
        prompts,
        echo,
        logprobs: top.is_some(),
        return_token_ids: sampling.return_token_ids,
    };
    if sampling.stream {
        let chunker = CompletionChunker {
            shape,
            started: HashSet::new(),
            offsets: HashMap::new(),
        };
        let include_usage = sampling.include_usage();
        return Ok(sse::respond(chunks(merged, chunker, n, prompt_tokens, include_usage)));
    }
    let done = collect(merged, n).await?;
    let completion_tokens = done.iter().map(|(_, c)| c.tokens.len()).sum();
    let choices = done
        .into_iter()
        .map(|(prompt, c)| {
            let echoed = shape.echoed(prompt);
            let tokens = TokenView::of_completion(&c);
            CompletionChoice {
                index: prompt * n + c.index,
                text: format!("{echoed}{}", c.text.as_deref().unwrap_or_default()),
                logprobs: shape
                    .logprobs
                    .then(|| logprobs(&shape.model, &tokens, echoed.chars().count())),
                finish_reason: Some(c.finish_reason.as_str()),
                stop_reason: shape.model.stop_reason(&c.stop_reason),
                prompt_token_ids: shape.return_token_ids.then(|| shape.prompts[prompt].clone()),
                token_ids: shape.return_token_ids.then(|| c.tokens.clone()),
            }
        })
        .collect();
    Ok(Json(shape.response(choices, Some(Usage::new(prompt_tokens, completion_tokens)))).into_response())
}
