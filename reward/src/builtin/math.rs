//! The `math` reward: extracts the completion's final answer and compares
//! it with the ground-truth column.
//!
//! Extraction, first that applies: the last `<answer>…</answer>`, the last
//! `\boxed{…}`, the last `#### n`, the last "the answer is …", else the
//! last number. Normalisation drops `$`, `\$`, `\text{}`, thousands
//! separators, spaces and trailing units, turns `\frac{a}{b}` into `a/b`,
//! and compares numbers (integers, decimals, fractions) exactly as
//! rationals; non-numeric answers compare as normalised text. A
//! ground truth may be a bare answer or a GSM8K solution ending in `#### n`.

use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use crate::rational::Rational;
use crate::{Result, Sample, SampleReward, Score};

/// `[[reward]] type = "math"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathConfig {
    /// The ground-truth column. Default `"answer"`.
    #[serde(default = "super::default_answer_column")]
    pub column: String,
}

impl Default for MathConfig {
    fn default() -> Self {
        Self {
            column: super::default_answer_column(),
        }
    }
}

impl MathConfig {
    /// Builds the reward.
    pub fn build(&self) -> MathReward {
        MathReward {
            column: self.column.clone(),
        }
    }
}

/// Scores 1 when the completion's final answer equals the ground truth, else 0.
#[derive(Clone, Debug)]
pub struct MathReward {
    column: String,
}

impl SampleReward for MathReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        let truth = sample.column(&self.column)?;
        let truth = truth.rsplit_once("####").map_or(truth.as_str(), |(_, after)| after);
        let found = extract_answer(&sample.completion);
        Ok(Score::hit(found.is_some_and(|answer| answers_equal(&answer, truth))))
    }
}

static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:/(?:\d+(?:\.\d+)?|\.\d+))?").expect("valid regex"));
pub(crate) static ANSWER_TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<answer>(.*?)</answer>").expect("valid regex"));
static HASHES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"####\s*([^\n]*)").expect("valid regex"));
static ANSWER_IS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)answer\s+is\s*:?\s*([^\n]*)").expect("valid regex"));
static FRAC: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}").expect("valid regex"));
static TEXT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}").expect("valid regex"));

/// The final answer of a completion, before normalisation; `None` when it holds no candidate.
pub fn extract_answer(completion: &str) -> Option<String> {
    let last = |re: &Regex| re.captures_iter(completion).last().map(|c| c[1].trim().to_string());
    last(&ANSWER_TAG)
        .or_else(|| last_boxed(completion))
        .or_else(|| last(&HASHES))
        .or_else(|| last(&ANSWER_IS))
        .or_else(|| {
            NUMBER
                .find_iter(&clean(completion))
                .last()
                .map(|m| m.as_str().to_string())
        })
}

/// The contents of the last `\boxed{…}` or `\fbox{…}`, braces balanced.
pub(crate) fn last_boxed(text: &str) -> Option<String> {
    let start = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    let open = start + text[start..].find('{')?;
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => return Some(text[open + 1..open + i].trim().to_string()),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Drops LaTeX decoration, currency signs and thousands separators.
pub(crate) fn clean(text: &str) -> String {
    let text = FRAC.replace_all(text, "($1)/($2)");
    let text = TEXT.replace_all(&text, "$1");
    let text = text
        .replace("\\$", "")
        .replace(['$'], "")
        .replace("\\!", "")
        .replace("\\,", "");
    let chars: Vec<char> = text.chars().collect();
    let digit = |i: usize| chars.get(i).is_some_and(char::is_ascii_digit);
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| !(c == ',' && i > 0 && digit(i - 1) && (1..=3).all(|k| digit(i + k)) && !digit(i + 4)))
        .map(|(_, &c)| c)
        .collect()
}

/// An answer as a number when it holds one, else as normalised text.
#[derive(Debug, PartialEq)]
enum Normalized {
    Number(Rational),
    Text(String),
}

fn normalize(answer: &str) -> Normalized {
    let cleaned = clean(answer).replace(['(', ')'], "");
    let number = NUMBER.find(&cleaned).and_then(|m| {
        let (num, den) = m.as_str().split_once('/').unwrap_or((m.as_str(), "1"));
        Rational::parse_decimal(num)
            .and_then(|n| n.checked_div(Rational::parse_decimal(den)?))
            .ok()
    });
    match number {
        Some(n) => Normalized::Number(n),
        None => Normalized::Text(
            cleaned
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect::<String>()
                .trim_end_matches('.')
                .to_lowercase(),
        ),
    }
}

/// Whether an extracted answer equals a ground truth after normalisation.
pub fn answers_equal(answer: &str, truth: &str) -> bool {
    normalize(answer) == normalize(truth)
}
