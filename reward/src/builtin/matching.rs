//! Text-matching rewards: `exact`, `contains`, `regex` and `format`. Each
//! scores 1 on a match and 0 otherwise.

use regex::{Regex, RegexBuilder};
use serde::Deserialize;

use crate::{Error, Result, Sample, SampleReward, Score};

/// `[[reward]] type = "exact"` or `"contains"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchConfig {
    /// The column holding the expected text. Default `"answer"`.
    #[serde(default = "super::default_answer_column")]
    pub column: String,
    /// Compare case-sensitively. Default `true`.
    #[serde(default = "yes")]
    pub case_sensitive: bool,
}

fn yes() -> bool {
    true
}

impl Default for MatchConfig {
    fn default() -> Self {
        Self {
            column: super::default_answer_column(),
            case_sensitive: true,
        }
    }
}

/// How [`MatchReward`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchMode {
    /// The trimmed completion equals the trimmed column.
    Exact,
    /// The completion contains the trimmed column.
    Contains,
}

impl MatchConfig {
    /// Builds the reward for `mode`.
    pub fn build(&self, mode: MatchMode) -> MatchReward {
        MatchReward {
            config: self.clone(),
            mode,
        }
    }
}

/// The `exact` and `contains` rewards.
#[derive(Clone, Debug)]
pub struct MatchReward {
    config: MatchConfig,
    mode: MatchMode,
}

impl SampleReward for MatchReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        let fold = |t: &str| {
            if self.config.case_sensitive {
                t.trim().to_string()
            } else {
                t.trim().to_lowercase()
            }
        };
        let (completion, expected) = (fold(&sample.completion), fold(&sample.column(&self.config.column)?));
        Ok(Score::hit(match self.mode {
            MatchMode::Exact => completion == expected,
            MatchMode::Contains => completion.contains(&expected),
        }))
    }
}

/// `[[reward]] type = "regex"` keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexConfig {
    /// The pattern searched for in the completion (Rust `regex` syntax). Required.
    pub pattern: String,
    /// `.` matches newlines too. Default `true`.
    #[serde(default = "yes")]
    pub dot_all: bool,
}

/// `[[reward]] type = "format"` keys: the whole completion must match `pattern`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatConfig {
    /// The format, anchored at both ends. Default
    /// `"<think>.*?</think>\s*<answer>.*?</answer>"` (`.` matches newlines).
    #[serde(default = "default_format")]
    pub pattern: String,
}

fn default_format() -> String {
    r"<think>.*?</think>\s*<answer>.*?</answer>".into()
}

impl Default for FormatConfig {
    fn default() -> Self {
        Self {
            pattern: default_format(),
        }
    }
}

impl RegexConfig {
    /// Builds the reward; `name` labels a bad pattern's error.
    pub fn build(&self, name: &str) -> Result<RegexReward> {
        let regex = RegexBuilder::new(&self.pattern)
            .dot_matches_new_line(self.dot_all)
            .build();
        Ok(RegexReward {
            regex: regex.map_err(|source| Error::Regex {
                name: name.into(),
                source,
            })?,
        })
    }
}

impl FormatConfig {
    /// Builds the reward; `name` labels a bad pattern's error.
    pub fn build(&self, name: &str) -> Result<RegexReward> {
        RegexConfig {
            pattern: format!(r"\A\s*(?:{})\s*\z", self.pattern),
            dot_all: true,
        }
        .build(name)
    }
}

/// The `regex` and `format` rewards: 1 when the pattern matches the completion.
#[derive(Clone, Debug)]
pub struct RegexReward {
    regex: Regex,
}

impl SampleReward for RegexReward {
    fn score_sample(&self, sample: &Sample) -> Result<Score> {
        Ok(Score::hit(self.regex.is_match(&sample.completion)))
    }
}
