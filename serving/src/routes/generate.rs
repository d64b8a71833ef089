//! Driving the engine for one HTTP request: queue its prompts (one engine
//! request each), merge their update streams, and either collect the
//! finished samples or turn the updates into stream chunks. A choice's
//! index is `prompt_index * n + sample_index`, as vLLM numbers them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::stream::{self, BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use grpo_rollout::output::{Completion, SampleUpdate};
use grpo_rollout::request::Request;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::metrics::tracked;
use crate::protocol::common::Usage;
use crate::state::AppState;

/// Updates of all of a request's prompts, tagged with the prompt's index.
pub type Merged = BoxStream<'static, grpo_rollout::Result<(usize, SampleUpdate)>>;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random id with `prefix` (`cmpl`, `chatcmpl`): 32 hex digits.
pub fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// One generation request among those running: counted in
/// [`AppState::generating`] while it lives.
struct Turn {
    generating: Arc<AtomicUsize>,
    max_num_seqs: usize,
    n: usize,
}

impl Turn {
    fn take(state: &AppState, n: usize) -> Turn {
        state.generating.fetch_add(1, Ordering::SeqCst);
        Turn {
            generating: state.generating.clone(),
            max_num_seqs: state.model.max_num_seqs,
            n,
        }
    }

    /// Prompts this request may have queued now: its even share of the
    /// engine's slots among the requests generating, at least one prompt.
    fn share(&self) -> usize {
        let requests = self.generating.load(Ordering::SeqCst).max(1);
        (self.max_num_seqs / (self.n * requests)).max(1)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.generating.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request's prompts: those queued with the engine and those waiting.
struct Prompts {
    running: SelectAll<Merged>,
    waiting: std::iter::Enumerate<std::vec::IntoIter<Request>>,
    turn: Turn,
    state: AppState,
    arrived: Instant,
}

/// Queues a request's prompts with the engine a fair share at a time — its
/// even share of the slots among the requests generating, the next prompt
/// when one finishes — so that a huge request never stands in front of
/// later small ones for long, and merges their updates. The first share
/// is queued before this returns, so that a refusal is the request's
/// error; a later refusal ends the stream with it. Dropping the stream
/// aborts what is queued.
pub async fn start(state: &AppState, requests: Vec<Request>) -> Result<Merged> {
    let n = requests.first().map_or(1, |r| r.params.n);
    let mut prompts = Prompts {
        running: SelectAll::new(),
        waiting: requests.into_iter().enumerate(),
        turn: Turn::take(state, n),
        state: state.clone(),
        arrived: Instant::now(),
    };
    prompts.admit().await?;
    Ok(stream::unfold(prompts, |mut prompts| async move {
        loop {
            if let Err(e) = prompts.admit().await {
                prompts.waiting.by_ref().for_each(drop);
                return Some((Err(e), prompts));
            }
            match prompts.running.next().await {
                Some(update) => return Some((update, prompts)),
                None if prompts.waiting.len() == 0 => return None,
                None => {} // all queued ones finished: admit more
            }
        }
    })
    .boxed())
}

impl Prompts {
    /// Queues waiting prompts while fewer than the request's share are queued.
    async fn admit(&mut self) -> grpo_rollout::Result<()> {
        while self.running.len() < self.turn.share() {
            let Some((prompt, request)) = self.waiting.next() else {
                break;
            };
            self.running
                .push(queue(&self.state, prompt, request, self.arrived).await?);
        }
        Ok(())
    }
}

/// Queues prompt `prompt`'s `request`, its updates tagged with the index.
async fn queue(state: &AppState, prompt: usize, request: Request, arrived: Instant) -> grpo_rollout::Result<Merged> {
    let (prompt_len, n) = (request.prompt.len(), request.params.n);
    let updates = state.backend.generate(request).await?;
    let updates = tracked(&state.metrics, updates, arrived, prompt_len, n);
    Ok(updates.map(move |u| u.map(|u| (prompt, u))).boxed())
}

/// Every finished sample, by choice index, with its prompt's index.
pub async fn collect(mut merged: Merged, n: usize) -> Result<Vec<(usize, Completion)>> {
    let mut done = Vec::new();
    while let Some(update) = merged.next().await {
        let (prompt, update) = update?;
        if let Some(completion) = update.finished {
            done.push((prompt, completion));
        }
    }
    done.sort_by_key(|(prompt, c)| prompt * n + c.index);
    Ok(done)
}

/// One update of one choice, as a stream sees it.
pub struct ChoiceUpdate<'a> {
    /// `prompt_index * n + sample_index`.
    pub choice: usize,
    /// The prompt's index.
    pub prompt: usize,
    /// The update.
    pub update: &'a SampleUpdate,
    /// The text to send: the update's, plus at the end whatever of the
    /// sample's final text was not sent yet.
    pub delta: String,
}

/// Turns a request's updates into its stream's chunks.
pub trait Chunker: Send + 'static {
    /// Chunks sent before any update (chat's role chunks).
    fn opening(&mut self) -> Vec<Value>;
    /// The chunk of one update, if it has anything to say.
    fn update(&mut self, update: ChoiceUpdate<'_>) -> Option<Value>;
    /// The last chunk, with the request's usage.
    fn usage(&self, usage: Usage) -> Value;
}

/// Where a stream is.
struct Streaming<C> {
    merged: Merged,
    chunker: C,
    n: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Bytes of text sent per choice.
    sent: HashMap<usize, usize>,
    include_usage: bool,
    ended: bool,
}

impl<C: Chunker> Streaming<C> {
    /// The next chunks, or `None` at the end.
    async fn next(&mut self) -> Option<Vec<Value>> {
        if self.ended {
            return None;
        }
        loop {
            match self.merged.next().await {
                Some(Ok((prompt, update))) => {
                    if update.token.is_some() {
                        self.completion_tokens += 1;
                    }
                    let choice = prompt * self.n + update.index;
                    let sent = self.sent.entry(choice).or_default();
                    let mut delta = update.text.clone();
                    *sent += delta.len();
                    if let Some(text) = update.finished.as_ref().and_then(|c| c.text.as_deref())
                        && text.len() > *sent
                        && text.is_char_boundary(*sent)
                    {
                        delta.push_str(&text[*sent..]);
                        *sent = text.len();
                    }
                    let choice_update = ChoiceUpdate {
                        choice,
                        prompt,
                        update: &update,
                        delta,
                    };
                    if let Some(chunk) = self.chunker.update(choice_update) {
                        return Some(vec![chunk]);
                    }
                }
                Some(Err(error)) => {
                    self.ended = true;
                    let body = Error::from(error).body();
                    return Some(vec![serde_json::to_value(body).unwrap_or_default()]);
                }
                None => {
                    self.ended = true;
                    let usage = Usage::new(self.prompt_tokens, self.completion_tokens);
                    return self.include_usage.then(|| vec![self.chunker.usage(usage)]);
                }
            }
        }
    }
}

/// The chunks of a streamed request: `chunker`'s opening, one per update
/// with something to say, then (with `include_usage`) the usage chunk.
pub fn chunks<C: Chunker>(
    merged: Merged,
    mut chunker: C,
    n: usize,
    prompt_tokens: usize,
    include_usage: bool,
) -> impl Stream<Item = Value> + Send + 'static {
    let opening = chunker.opening();
    let streaming = Streaming {
        merged,
        chunker,
        n,
        prompt_tokens,
        completion_tokens: 0,
        sent: HashMap::new(),
        include_usage,
        ended: false,
    };
    let rest = stream::unfold(
        streaming,
        |mut s| async move { s.next().await.map(|chunks| (chunks, s)) },
    );
    stream::iter(opening).chain(rest.flat_map(stream::iter))
}

/// A generated token with its log-probs, from a stream update or a finished sample.
#[derive(Debug, Clone, Copy)]
pub struct TokenView<'a> {
    /// The token id.
    pub id: u32,
    /// Its log-prob.
    pub logprob: f32,
    /// The most likely tokens at its step.
    pub top: &'a [(u32, f32)],
}

impl<'a> TokenView<'a> {
    /// The tokens of a finished sample.
    pub fn of_completion(completion: &'a Completion) -> Vec<TokenView<'a>> {
        let steps = completion
            .tokens
            .iter()
            .zip(&completion.logprobs)
            .zip(&completion.top_logprobs);
        steps
            .map(|((&id, &logprob), top)| TokenView { id, logprob, top })
            .collect()
    }

    /// The token of an update, if it has one.
    pub fn of_update(update: &'a SampleUpdate) -> Vec<TokenView<'a>> {
        let token = update.token.iter();
        token
            .map(|t| TokenView {
                id: t.id,
                logprob: t.logprob,
                top: &t.top_logprobs,
            })
            .collect()
    }
}
