//! Plug-ins: rewards computed outside the process.
//!
//! - [`command`]: a long-running subprocess speaking JSON lines.
//! - [`http`]: a JSON batch POSTed to a URL.
//! - [`process`]: the JSON-lines subprocess under `command` (and under
//!   grpo-env's environment plug-in): lazy start, id-matched answers,
//!   timeouts, process-group kills, restarts with backoff.
//!
//! Both send the batch's [`Sample`]s as JSON objects (`id`, `group_id`,
//! `prompt`, `messages`, `completion`, `completion_ids`, `row`) and read
//! back one score per sample: a number, `null` (skip), or the strings
//! `"nan"` / `"inf"` / `"-inf"` (Python's non-finite floats, which JSON
//! cannot hold; the pool treats them per `on_error`).

pub mod command;
pub mod http;
pub mod process;

/// The longest answer a plug-in may give to one batch (a command plug-in's
/// line, an HTTP plug-in's body), in bytes: a longer one fails the batch.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

use crate::{Error, Result, Sample, Score};

/// The body of `response`, read up to [`MAX_ANSWER_BYTES`]: a transfer
/// that breaks off is [`Error::Http`], a longer body [`Error::BadOutput`].
pub async fn read_body(mut response: reqwest::Response) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| Error::Http(e.to_string()))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(Error::BadOutput(format!("an answer over {MAX_ANSWER_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads a JSON list of scores for `batch`; anything else is [`Error::BadOutput`].
fn parse_scores(value: &serde_json::Value, batch: &[Sample]) -> Result<Vec<Score>> {
    let serde_json::Value::Array(items) = value else {
        return Err(Error::BadOutput(format!(
            "expected a list of scores, got {}",
            short(value)
        )));
    };
    if items.len() != batch.len() {
        return Err(Error::BadOutput(format!(
            "{} scores for {} samples",
            items.len(),
            batch.len()
        )));
    }
    items
        .iter()
        .map(|item| match item {
            serde_json::Value::Null => Ok(Score::default()),
            serde_json::Value::Number(n) => Ok(Score::new(n.as_f64().unwrap_or(f64::NAN) as f32)),
            serde_json::Value::String(s) => match s.to_lowercase().parse::<f64>() {
                Ok(v) if !v.is_finite() => Ok(Score::new(v as f32)),
                _ => Err(Error::BadOutput(format!("score {s:?} is not a number"))),
            },
            other => Err(Error::BadOutput(format!("score {} is not a number", short(other)))),
        })
        .collect()
}

/// A value's JSON, cut to 100 characters for messages.
fn short(value: &serde_json::Value) -> String {
    value.to_string().chars().take(100).collect()
}
