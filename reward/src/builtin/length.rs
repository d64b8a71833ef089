//! The `length` reward: a penalty for completions that run long, with
//! DAPO's soft overlong shaping.
//!
//! With `n` the completion's length, `max` = `max_tokens` and `L` =
//! `overlong_buffer`: the score is 0 for `n ≤ max − L`, falls linearly to
//! −1 over the last `L` tokens (`(max − L − n) / L`), and is −1 beyond
//! `max`. With `L = 0` it is 0 up to `max` and −1 beyond.

use serde::Deserialize;

use crate::{Error, Result, Sample, SampleReward, Score};

/// What `length` counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LengthUnit {
    /// Completion token ids (a sample without them is an error). The default.
    #[default]
    Tokens,
    /// Characters of the completion text.
    Chars,
}

/// `[[reward]] type = "length"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthConfig {
    /// The length limit. Required.
    pub max_tokens: usize,
    /// The soft zone before the limit, `L` above. Default 0.
    #[serde(default)]
    pub overlong_buffer: usize,
    /// `"tokens"` (default) or `"chars"`.
    #[serde(default)]
    pub unit: LengthUnit,
}

impl LengthConfig {
    /// Builds the reward; errors when the buffer exceeds the limit.
    pub fn build(&self) -> Result<LengthReward> {
        if self.overlong_buffer > self.max_tokens {
            return Err(Error::Config(format!(
                "length: overlong_buffer {} exceeds max_tokens {}",
                self.overlong_buffer, self.max_tokens
            )));
        }
        Ok(LengthReward { config: self.clone() })
    }
}

/// The `length` reward.
#[derive(Clone, Debug)]
pub struct LengthReward {
    config: LengthConfig,
}

impl SampleReward for LengthReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        let n = match self.config.unit {
            LengthUnit::Chars => sample.completion.chars().count(),
            LengthUnit::Tokens if sample.completion_ids.is_empty() && !sample.completion.is_empty() => {
                return Err(Error::BadSample {
                    sample: sample.id,
                    what: "no completion_ids; give them or set unit = \"chars\"".into(),
                });
            }
            LengthUnit::Tokens => sample.completion_ids.len(),
        };
        let (max, buffer) = (self.config.max_tokens, self.config.overlong_buffer);
        let soft_start = max - buffer;
        Ok(Score::new(if n > max {
            -1.0
        } else if n > soft_start {
            (soft_start as f32 - n as f32) / buffer as f32
        } else {
            0.0
        }))
    }
}
