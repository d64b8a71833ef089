//! Requests into engine requests: range checks that name the field and the
//! allowed range (400s), and vLLM's defaults. What depends on the engine's
//! size (prompt length against `max_model_len`, `n` against `max_num_seqs`,
//! the vocabulary) the engine itself checks when the request is queued.

use grpo_rollout::request::{LogprobsMode, MAX_TOP_LOGPROBS, SamplingParams};

use crate::admission::RequestLimits;
use crate::error::{Error, Result};
use crate::protocol::common::SamplingFields;

/// Most samples a request may ask for, before the engine's own `max_num_seqs` check.
const MAX_N: i64 = 1024;

/// `value` as an integer in `[low, high]`.
fn int_in(param: &str, value: i64, low: i64, high: i64) -> Result<i64> {
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(Error::invalid(
            param,
            format!("{param} is {value}; it must be between {low} and {high}"),
        ))
    }
}

/// `value` as a finite f32 in `[low, high]`.
fn float_in(param: &str, value: f64, low: f64, high: f64) -> Result<f32> {
    if value.is_finite() && (low..=high).contains(&value) {
        Ok(value as f32)
    } else {
        Err(Error::invalid(
            param,
            format!("{param} is {value}; it must be between {low} and {high}"),
        ))
    }
}

/// A token id (0 to 2³²−1); the engine checks it against the vocabulary.
fn token_id(param: &str, id: i64) -> Result<u32> {
    Ok(int_in(param, id, 0, u32::MAX as i64)? as u32)
}

/// Token ids sent as JSON integers.
pub fn token_ids(param: &str, ids: &[i64]) -> Result<Vec<u32>> {
    ids.iter().map(|&id| token_id(param, id)).collect()
}

/// `max_tokens` (or `max_completion_tokens`) in `[1, max_model_len]`.
pub fn max_tokens(param: &str, value: i64, max_model_len: usize) -> Result<usize> {
    Ok(int_in(param, value, 1, max_model_len as i64)? as usize)
}

/// How many top log-probs (`logprobs` of completions, `top_logprobs` of chat), in `[0, 20]`.
pub fn top_logprobs(param: &str, value: i64) -> Result<usize> {
    Ok(int_in(param, value, 0, MAX_TOP_LOGPROBS as i64)? as usize)
}

/// The engine's sampling settings from the shared fields, with the field
/// that asked for their guide, if one did (to name it when the engine
/// refuses the grammar).
pub fn sampling(
    fields: &SamplingFields,
    max_tokens: usize,
    logprobs: Option<usize>,
    limits: &RequestLimits,
) -> Result<(SamplingParams, Option<&'static str>)> {
    let defaults = SamplingParams::default();
    let float = |param: &str, value: Option<f64>, default: f32, low: f64, high: f64| match value {
        Some(v) => float_in(param, v, low, high),
        None => Ok(default),
    };
    let top_k = match fields.top_k {
        Some(-1) | None => 0,
        Some(k) => int_in("top_k", k, -1, i32::MAX as i64)? as i32,
    };
    let seed = match fields.seed {
        Some(seed) => int_in("seed", seed, 0, u32::MAX as i64)? as u32,
        None => rand::random(),
    };
    let min_tokens = int_in("min_tokens", fields.min_tokens.unwrap_or(0), 0, max_tokens as i64)? as usize;
    let stop = fields.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(Error::invalid("stop", "stop strings must not be empty"));
    }
    limits.check_stop(&stop)?;
    let params = SamplingParams {
        n: int_in("n", fields.n.unwrap_or(1), 1, MAX_N)? as usize,
        max_tokens,
        min_tokens,
        temperature: float("temperature", fields.temperature, defaults.temperature, 0.0, 1e6)?,
        top_k,
        top_p: match fields.top_p {
            Some(p) if p <= 0.0 => return Err(Error::invalid("top_p", format!("top_p is {p}; it must be in (0, 1]"))),
            p => float("top_p", p, defaults.top_p, 0.0, 1.0)?,
        },
        min_p: float("min_p", fields.min_p, defaults.min_p, 0.0, 0.999_999)?,
        presence_penalty: float("presence_penalty", fields.presence_penalty, 0.0, -2.0, 2.0)?,
        frequency_penalty: float("frequency_penalty", fields.frequency_penalty, 0.0, -2.0, 2.0)?,
        repetition_penalty: match fields.repetition_penalty {
            Some(r) if r <= 0.0 => {
                return Err(Error::invalid(
                    "repetition_penalty",
                    format!("repetition_penalty is {r}; it must be > 0"),
                ));
            }
            r => float("repetition_penalty", r, defaults.repetition_penalty, 0.0, 1e6)?,
        },
        seed,
        stop_token_ids: token_ids("stop_token_ids", &fields.stop_token_ids)?,
        stop,
        include_stop_str_in_output: fields.include_stop_str_in_output,
        ignore_eos: fields.ignore_eos,
        logprobs,
        skip_special_tokens: fields.skip_special_tokens.unwrap_or(defaults.skip_special_tokens),
        // vLLM's default: the logprobs a client gets are the model's own.
        logprobs_mode: LogprobsMode::Raw,
        guide: None,
        adapter: None,
    };
    // Read last, as the field comes last: other fields' errors come first.
    let (guided_by, guide) = crate::structured::requested(fields)?.unzip();
    Ok((SamplingParams { guide, ..params }, guided_by))
}
