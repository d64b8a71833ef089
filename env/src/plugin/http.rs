//! The `http` environment: each request of [`crate::plugin`]'s protocol
//! POSTed as JSON to one URL; the response body is its answer (an `id` in
//! it, if any, must be the request's).
//!
//! A request that cannot be sent, an answer other than 2xx (named with its
//! status and the start of its body), or a body over
//! [`grpo_reward::plugin::MAX_ANSWER_BYTES`] is a fault of its step. Steps
//! are not retried (an environment may keep state per episode): the fault
//! policy decides. Requests go out concurrently; the guard bounds each
//! step, and the timeout given bounds asking for the tools (once, when the
//! environment is built) and ending an episode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpo_model::tools::Tool;
use grpo_reward::BoxFuture;
use grpo_reward::plugin::read_body;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{Request, check_end, on_own_runtime, parse_step, parse_tools, short};
use crate::environment::{Environment, EnvironmentError, EpisodeView, Reply};

/// The `http` environment.
pub struct HttpEnvironment {
    url: String,
    client: reqwest::Client,
    token: Option<String>,
    next_id: AtomicU64,
    timeout: Duration,
    tools: Vec<Tool>,
}

/// An error and its causes, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text = format!("{text}: {error}");
        cause = error.source();
    }
    text
}

/// A request body: the request with its id.
#[derive(Serialize)]
struct Body<'a> {
    id: u64,
    #[serde(flatten)]
    request: &'a Request<'a>,
}

impl HttpEnvironment {
    /// Asks `url` for its tools within `timeout` and returns the
    /// environment (named by its URL), which ends episodes within
    /// `timeout` too (the guard bounds steps); `token`, if given, is sent
    /// as a bearer token. Works inside or outside a runtime.
    pub fn start(url: &str, token: Option<String>, timeout: Duration) -> Result<HttpEnvironment, EnvironmentError> {
        let new = || {
            Ok(HttpEnvironment {
                url: url.to_string(),
                client: reqwest::Client::builder()
                    .build()
                    .map_err(|e| EnvironmentError(format!("cannot make an HTTP client: {}", chain(&e))))?,
                token: token.clone(),
                next_id: AtomicU64::new(0),
                timeout,
                tools: Vec::new(),
            })
        };
        // The tools are asked on a runtime of their own, with a client of
        // their own: a client's connections stay with the runtime that made them.
        let asking = new()?;
        let tools = on_own_runtime(async move { parse_tools(&asking.post_within(&Request::Tools).await?) })??;
        Ok(HttpEnvironment {
            tools,
            next_id: AtomicU64::new(1),
            ..new()?
        })
    }

    /// [`HttpEnvironment::post`] within the timeout.
    async fn post_within(&self, request: &Request<'_>) -> Result<Map<String, Value>, EnvironmentError> {
        tokio::time::timeout(self.timeout, self.post(request))
            .await
            .unwrap_or_else(|_| {
                Err(EnvironmentError(format!(
                    "timed out after {} s",
                    self.timeout.as_secs_f64()
                )))
            })
    }

    /// POSTs `request` and returns its answer object, its `id` checked and removed.
    async fn post(&self, request: &Request<'_>) -> Result<Map<String, Value>, EnvironmentError> {
        let fault = EnvironmentError;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut post = self.client.post(&self.url).json(&Body { id, request });
        if let Some(token) = &self.token {
            post = post.bearer_auth(token);
        }
        let response = post.send().await.map_err(|e| fault(chain(&e)))?;
        let status = response.status();
        let body = read_body(response).await.map_err(|e| fault(e.to_string()))?;
        let text = || String::from_utf8_lossy(&body[..body.len().min(100)]).into_owned();
        if !status.is_success() {
            return Err(fault(format!("answered {status}: {}", text())));
        }
        let mut answer = match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(answer)) => answer,
            Ok(_) => return Err(fault(format!("the body is not a JSON object: {}", text()))),
            Err(e) => return Err(fault(format!("the body is not JSON ({e}): {}", text()))),
        };
        match answer.remove("id") {
            None => Ok(answer),
            Some(Value::Number(n)) if n.as_u64() == Some(id) => Ok(answer),
            Some(other) => Err(fault(format!(
                "answer to request {} while waiting for {id}",
                short(&other)
            ))),
        }
    }
}

impl Environment for HttpEnvironment {
    fn name(&self) -> &str {
        &self.url
    }

    fn tools(&self) -> Vec<Tool> {
        self.tools.clone()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        Box::pin(async move { parse_step(&self.post(&Request::step(episode)).await?) })
    }

    fn end(&self, id: u64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ended = self.post_within(&Request::End { episode: id }).await;
            if let Err(error) = ended.and_then(|answer| check_end(&answer)) {
                tracing::warn!(environment = %self.url, episode = id, "ending the episode: {error}");
            }
        })
    }
}
