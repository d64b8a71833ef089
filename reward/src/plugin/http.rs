//! The `http` plug-in: POSTs a JSON batch to a URL and reads the scores.
//!
//! Request body `{"samples": [<sample>, …]}` (samples as in
//! [`crate::plugin`]); the answer is a list of scores or `{"scores": […]}`.
//! Connection errors, attempt timeouts and 5xx answers are retried up to
//! `retries` times, waiting `backoff_s`, doubling; 4xx answers and
//! malformed bodies, or bodies over [`MAX_ANSWER_BYTES`](super::MAX_ANSWER_BYTES), fail at once. At
//! most `max_concurrency` requests are in flight; the entry's `timeout_s`
//! bounds the whole call from the moment a request may go out.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::config::{MAX_SECONDS, duration};
use crate::sample::within;
use crate::{BoxFuture, Error, Result, Reward, Sample, Score};

/// `[[reward]] type = "http"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// The endpoint. Required.
    pub url: String,
    /// Limit on one attempt, in seconds. Default 10.
    #[serde(default = "default_attempt_timeout")]
    pub attempt_timeout_s: f64,
    /// Retries after a failed attempt. Default 2.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Wait before the first retry, in seconds, doubling after each. Default 0.2.
    #[serde(default = "default_backoff")]
    pub backoff_s: f64,
    /// Requests in flight at once. Default 4.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
    /// An environment variable holding a bearer token. Default: none (no `Authorization` header).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
}

fn default_attempt_timeout() -> f64 {
    10.0
}

fn default_retries() -> u32 {
    2
}

fn default_backoff() -> f64 {
    0.2
}

fn default_concurrency() -> usize {
    4
}

impl HttpConfig {
    /// Builds the plug-in; `name` labels errors.
    pub fn build(&self, name: &str) -> Result<HttpReward> {
        let bad = |what: String| Error::Config(format!("reward {name}: {what}"));
        let (Some(attempt_timeout), Some(backoff)) = (
            duration(self.attempt_timeout_s).filter(|_| self.attempt_timeout_s > 0.0),
            duration(self.backoff_s),
        ) else {
            return Err(bad(format!(
                "attempt_timeout_s must be above 0 and backoff_s at least 0, both at most {MAX_SECONDS} seconds, not {} and {}",
                self.attempt_timeout_s, self.backoff_s
            )));
        };
        let token = match &self.bearer_token_env {
            Some(var) => Some(std::env::var(var).map_err(|_| bad(format!("environment variable {var} is not set")))?),
            None => None,
        };
        let client = reqwest::Client::builder()
            .timeout(attempt_timeout)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(HttpReward {
            client,
            url: self.url.clone(),
            token,
            retries: self.retries,
            backoff,
            permits: Semaphore::new(self.max_concurrency.max(1)),
        })
    }
}

/// The `http` plug-in.
pub struct HttpReward {
    client: reqwest::Client,
    url: String,
    token: Option<String>,
    retries: u32,
    backoff: Duration,
    permits: Semaphore,
}

#[derive(Serialize)]
struct Request<'a> {
    samples: &'a [Sample],
}

/// An attempt's failure: retry it or give up.
enum Attempt {
    Retry(Error),
    Fatal(Error),
}

impl HttpReward {
    async fn attempt(&self, batch: &[Sample]) -> Result<Vec<Score>, Attempt> {
        let mut request = self.client.post(&self.url).json(&Request { samples: batch });
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Attempt::Retry(Error::Http(e.to_string())))?;
        let status = response.status();
        if status.is_server_error() {
            return Err(Attempt::Retry(Error::Http(format!("{} answered {status}", self.url))));
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(Error::Http(format!("{} answered {status}", self.url))));
        }
        // A transfer that breaks off is retried; an oversized answer is not.
        let body = super::read_body(response).await.map_err(|e| match e {
            Error::Http(_) => Attempt::Retry(e),
            other => Attempt::Fatal(other),
        })?;
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            Attempt::Fatal(Error::BadOutput(format!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&body[..body.len().min(100)])
            )))
        })?;
        let scores = match value {
            serde_json::Value::Object(mut object) => object.remove("scores").unwrap_or_default(),
            list => list,
        };
        super::parse_scores(&scores, batch).map_err(Attempt::Fatal)
    }
}

impl HttpReward {
    /// The attempts at `batch`, retried with backoff.
    async fn call(&self, batch: &[Sample]) -> Result<Vec<Score>> {
        let mut delay = self.backoff;
        for _ in 0..self.retries {
            match self.attempt(batch).await {
                Ok(scores) => return Ok(scores),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => tracing::debug!(url = %self.url, "retrying: {e}"),
            }
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2);
        }
        self.attempt(batch)
            .await
            .map_err(|(Attempt::Retry(e) | Attempt::Fatal(e))| e)
    }
}

impl Reward for HttpReward {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move {
            let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
            self.call(batch).await
        })
    }

    fn score_within<'a>(&'a self, batch: &'a [Sample], limit: Duration) -> BoxFuture<'a, Result<Vec<Score>>> {
        Box::pin(async move {
            // The clock starts once one of the plug-in's connections is free.
            let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
            within(limit, self.call(batch)).await
        })
    }
}
