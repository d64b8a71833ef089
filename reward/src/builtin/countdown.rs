//! The `countdown` and `arithmetic` rewards: the answer is an arithmetic
//! expression, parsed safely and evaluated in exact rationals
//! ([`crate::expr`]) — never run as code.
//!
//! - `countdown`: the expression (the last `<answer>…</answer>`, else the
//!   last `\boxed{…}`, else the last line; the left side of any `=`) must
//!   equal the `target` column using the `nums` column's numbers, each at
//!   most once (exactly once with `use_all`).
//! - `arithmetic`: the final answer ([`super::math::extract_answer`]; the
//!   right side of any `=`), itself possibly an expression, must equal the
//!   ground-truth column, a number or an expression.

use serde::Deserialize;

use super::math::{clean, extract_answer, last_boxed};
use crate::expr::evaluate;
use crate::rational::Rational;
use crate::{Error, Result, Sample, SampleReward, Score};

/// `[[reward]] type = "countdown"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountdownConfig {
    /// The column with the target number. Default `"target"`.
    #[serde(default = "default_target")]
    pub target_column: String,
    /// The column with the list of available numbers. Default `"nums"`.
    #[serde(default = "default_nums")]
    pub numbers_column: String,
    /// Every number must be used exactly once (else at most once). Default `true`.
    #[serde(default = "yes")]
    pub use_all: bool,
}

fn default_target() -> String {
    "target".into()
}

fn default_nums() -> String {
    "nums".into()
}

fn yes() -> bool {
    true
}

impl Default for CountdownConfig {
    fn default() -> Self {
        Self {
            target_column: default_target(),
            numbers_column: default_nums(),
            use_all: true,
        }
    }
}

impl CountdownConfig {
    /// Builds the reward.
    pub fn build(&self) -> CountdownReward {
        CountdownReward { config: self.clone() }
    }
}

/// The `countdown` reward.
#[derive(Clone, Debug)]
pub struct CountdownReward {
    config: CountdownConfig,
}

fn bad(sample: &Sample, what: String) -> Error {
    Error::BadSample {
        sample: sample.id,
        what,
    }
}

/// The column as an exact number (a JSON number, or a string holding an expression).
fn column_value(sample: &Sample, column: &str) -> Result<Rational> {
    let text = sample.column(column)?;
    evaluate(&clean(&text))
        .map(|e| e.value)
        .map_err(|e| bad(sample, format!("column `{column}`: {e}")))
}

impl SampleReward for CountdownReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        let target = column_value(sample, &self.config.target_column)?;
        let column = &self.config.numbers_column;
        let mut available: Vec<Rational> = match sample.row.get(column) {
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_i64().map(|n| Rational::integer(i128::from(n))))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(sample, format!("column `{column}` must be a list of integers")))?,
            _ => return Err(bad(sample, format!("no list column `{column}`"))),
        };
        let text = &sample.completion;
        let answer = crate::builtin::math::ANSWER_TAG
            .captures_iter(text)
            .last()
            .map(|c| c[1].to_string())
            .or_else(|| last_boxed(text))
            .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string))
            .unwrap_or_default();
        let cleaned = clean(&answer);
        let Ok(evaluated) = evaluate(cleaned.split('=').next().unwrap_or_default()) else {
            return Ok(Score::hit(false));
        };
        for used in &evaluated.numbers {
            match available.iter().position(|n| n == used) {
                Some(i) => _ = available.swap_remove(i),
                None => return Ok(Score::hit(false)),
            }
        }
        Ok(Score::hit(
            evaluated.value == target && (!self.config.use_all || available.is_empty()),
        ))
    }
}

/// `[[reward]] type = "arithmetic"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArithmeticConfig {
    /// The ground-truth column (a number or an expression). Default `"answer"`.
    #[serde(default = "super::default_answer_column")]
    pub column: String,
}

impl Default for ArithmeticConfig {
    fn default() -> Self {
        Self {
            column: super::default_answer_column(),
        }
    }
}

impl ArithmeticConfig {
    /// Builds the reward.
    pub fn build(&self) -> ArithmeticReward {
        ArithmeticReward {
            column: self.column.clone(),
        }
    }
}

/// The `arithmetic` reward.
#[derive(Clone, Debug)]
pub struct ArithmeticReward {
    column: String,
}

impl SampleReward for ArithmeticReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        let truth = column_value(sample, &self.column)?;
        let answer = clean(&extract_answer(&sample.completion).unwrap_or_default());
        let value = evaluate(answer.rsplit('=').next().unwrap_or_default()).map(|e| e.value);
        Ok(Score::hit(value.is_ok_and(|v| v == truth)))
    }
}
