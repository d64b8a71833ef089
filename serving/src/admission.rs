//! What one request may ask for, and how many generation requests run at
//! once: [`RequestLimits`] bound a request's prompts, samples and stop
//! strings (checked before anything is queued), and [`admit`] refuses a
//! generation request beyond `max_concurrent_requests` with a 429 and
//! `Retry-After`, holding its place until the response — streamed or not —
//! has been sent or dropped.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::state::AppState;

/// Bounds on one request; a request over one is a 400 naming the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Generation requests running or queued at once. Default 256.
    pub max_concurrent_requests: usize,
    /// Prompts in one completions request. Default 2048 (OpenAI's limit
    /// on a prompt list).
    pub max_prompts: usize,
    /// Samples one request asks for, prompts × `n`. Default 4096.
    pub max_samples: usize,
    /// Stop strings of one request. Default 64.
    pub max_stop_strings: usize,
    /// Their bytes in all. Default 8 KiB.
    pub max_stop_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits::DEFAULT
    }
}

impl RequestLimits {
    /// The defaults (usable in constants).
    pub const DEFAULT: RequestLimits = RequestLimits {
        max_concurrent_requests: 256,
        max_prompts: 2048,
        max_samples: 4096,
        max_stop_strings: 64,
        max_stop_bytes: 8 << 10,
    };

    /// Refuses `prompts` prompts of `n` samples each beyond the limits.
    pub fn check_size(&self, prompts: usize, n: usize) -> Result<()> {
        if prompts > self.max_prompts {
            return Err(Error::invalid(
                "prompt",
                format!("{prompts} prompts; at most {} a request", self.max_prompts),
            ));
        }
        if prompts.saturating_mul(n) > self.max_samples {
            return Err(Error::invalid(
                "n",
                format!(
                    "{prompts} prompts × n = {n} is {} samples; at most {} a request",
                    prompts * n,
                    self.max_samples
                ),
            ));
        }
        Ok(())
    }

    /// Refuses `stop` strings beyond the limits.
    pub fn check_stop(&self, stop: &[String]) -> Result<()> {
        let bytes: usize = stop.iter().map(String::len).sum();
        if stop.len() > self.max_stop_strings || bytes > self.max_stop_bytes {
            return Err(Error::invalid(
                "stop",
                format!(
                    "{} stop strings of {bytes} bytes; at most {} strings of {} bytes in all",
                    stop.len(),
                    self.max_stop_strings,
                    self.max_stop_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Middleware of the generation routes: a place among
/// `max_concurrent_requests`, or a 429 saying when to retry.
pub async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Result<Response> {
    let Ok(place) = state.admission.clone().try_acquire_owned() else {
        return Err(Error::Overloaded {
            limit: state.config.limits.max_concurrent_requests,
        });
    };
    let (parts, body) = next.run(request).await.into_parts();
    // The place goes with the body: freed when it has been sent or dropped.
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &place;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(body)))
}
