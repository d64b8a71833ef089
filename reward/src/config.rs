//! `[[reward]]` tables into a [`RewardPool`].
//!
//! ```toml
//! [reward_pool]
//! concurrency = 8        # batches scored at once, 1 to 1024 (default 8)
//! reward_weights = [1.0] # optional, TRL's name: the entries' weights in
//!                        # order (then no entry gives `weight`)
//!
//! [[reward]]
//! type = "math"          # math | exact | contains | regex | format | length |
//!                        # countdown | arithmetic | http | command | a registered name
//! name = "correct"       # default: the type
//! weight = 1.0           # default 1.0
//! timeout_s = 30.0       # per batch call, default 30
//! on_error = "skip"      # a score (e.g. 0.0) | "skip" (default) | "fail"
//! column = "answer"      # the type's own keys
//! ```
//!
//! The file may be a full run config: only `[[reward]]` and `[reward_pool]`
//! are read here, other tables are left to their own loaders. Within those
//! two, unknown keys are errors that name the key.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::builtin::countdown::{ArithmeticConfig, CountdownConfig};
use crate::builtin::length::LengthConfig;
use crate::builtin::matching::{FormatConfig, MatchConfig, MatchMode, RegexConfig};
use crate::builtin::math::MathConfig;
use crate::metrics::RewardMetrics;
use crate::plugin::command::CommandConfig;
use crate::plugin::http::HttpConfig;
use crate::pool::{Entry, RewardPool};
use crate::{Error, Result, Reward};

/// What a fault (timeout, crash, bad output, NaN) becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum OnError {
    /// Score the sample with this value.
    Score(f32),
    /// Skip the sample for this reward (the default).
    #[default]
    Skip,
    /// Stop with an error naming the reward and sample.
    Fail,
}

impl<'de> Deserialize<'de> for OnError {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Word(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(value) => Ok(Self::Score(value as f32)),
            Raw::Word(word) if word == "skip" => Ok(Self::Skip),
            Raw::Word(word) if word == "fail" => Ok(Self::Fail),
            Raw::Word(word) => Err(serde::de::Error::custom(format!(
                "on_error = {word:?}: use a number, \"skip\" or \"fail\""
            ))),
        }
    }
}

/// One `[[reward]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// The reward type. Required.
    #[serde(rename = "type")]
    pub kind: String,
    /// The name in components and logs. Default: the type.
    #[serde(default)]
    pub name: Option<String>,
    /// Weight in the total. Default 1.0.
    #[serde(default = "one")]
    pub weight: f32,
    /// Limit on one batch call, in seconds. Default 30.
    #[serde(default = "thirty")]
    pub timeout_s: f64,
    /// What a fault becomes. Default "skip".
    #[serde(default)]
    pub on_error: OnError,
    /// The type's own keys (checked by the type's config when built).
    #[serde(skip)]
    pub params: toml::Table,
}

fn one() -> f32 {
    1.0
}

fn thirty() -> f64 {
    30.0
}

const COMMON_KEYS: [&str; 5] = ["type", "name", "weight", "timeout_s", "on_error"];

/// `[reward_pool]`: how scoring runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Batches scored at once, 1 to [`MAX_CONCURRENCY`]. Default 8.
    #[serde(default = "eight")]
    pub concurrency: usize,
    /// The `[[reward]]` entries' weights in order (TRL's `reward_weights`),
    /// instead of their `weight` keys. Default none.
    #[serde(default)]
    pub reward_weights: Option<Vec<f32>>,
}

/// Most reward batches scored at once.
pub const MAX_CONCURRENCY: usize = 1024;

fn eight() -> usize {
    8
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            concurrency: eight(),
            reward_weights: None,
        }
    }
}

/// The rewards of a config file.
#[derive(Clone, Debug, Default)]
pub struct RewardsConfig {
    /// The `[[reward]]` entries, in order.
    pub rewards: Vec<RewardConfig>,
    /// The `[reward_pool]` table.
    pub pool: PoolConfig,
}

fn config_error(what: impl std::fmt::Display) -> Error {
    Error::Config(what.to_string())
}

impl RewardsConfig {
    /// Reads `[[reward]]` and `[reward_pool]` from a TOML file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|e| config_error(format!("{}: {e}", path.display())))
    }

    /// Reads `[[reward]]` and `[reward_pool]` from TOML text; other top-level tables are ignored.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let mut table: toml::Table = text.parse().map_err(config_error)?;
        let pool = match table.remove("reward_pool") {
            Some(value) => value
                .try_into()
                .map_err(|e| config_error(format!("[reward_pool]: {e}")))?,
            None => PoolConfig::default(),
        };
        let entries = match table.remove("reward") {
            Some(toml::Value::Array(entries)) => entries,
            Some(_) => return Err(config_error("`reward` must be an array of tables: write [[reward]]")),
            None => return Err(config_error("no [[reward]] tables")),
        };
        if !(1..=MAX_CONCURRENCY).contains(&pool.concurrency) {
            return Err(config_error(format!(
                "[reward_pool] concurrency = {}: 1 to {MAX_CONCURRENCY} batches at once",
                pool.concurrency
            )));
        }
        let weights = pool.reward_weights.as_deref();
        if let Some(weights) = weights
            && weights.len() != entries.len()
        {
            return Err(config_error(format!(
                "[reward_pool] reward_weights has {} weights for {} [[reward]] tables: give one per table, in order",
                weights.len(),
                entries.len()
            )));
        }
        let rewards = entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                let toml::Value::Table(mut entry) = entry else {
                    return Err(config_error(format!("reward #{}: not a table", i + 1)));
                };
                let params: toml::Table = entry
                    .keys()
                    .filter(|k| !COMMON_KEYS.contains(&k.as_str()))
                    .cloned()
                    .collect::<Vec<_>>()
                    .into_iter()
                    .filter_map(|k| entry.remove_entry(&k))
                    .collect();
                let weighted = entry.contains_key("weight");
                let mut config: RewardConfig = toml::Value::Table(entry)
                    .try_into()
                    .map_err(|e| config_error(format!("reward #{}: {e}", i + 1)))?;
                config.params = params;
                if let Some(weights) = weights {
                    if weighted {
                        return Err(config_error(format!(
                            "reward #{}: both `weight` and [reward_pool] reward_weights give its weight: keep one",
                            i + 1
                        )));
                    }
                    config.weight = weights[i];
                }
                Ok(config)
            })
            .collect::<Result<_>>()?;
        Ok(Self { rewards, pool })
    }

    /// Builds every entry (plug-ins from `registry` for unknown types) into a pool.
    pub fn build(&self, registry: &Registry) -> Result<RewardPool> {
        let mut entries: Vec<Entry> = Vec::new();
        for config in &self.rewards {
            let entry = config.build(registry)?;
            if entries.iter().any(|e| e.name == entry.name) {
                return Err(config_error(format!(
                    "two rewards named `{}`: give one a `name`",
                    entry.name
                )));
            }
            entries.push(entry);
        }
        Ok(RewardPool::new(entries, self.pool.concurrency))
    }
}

impl RewardConfig {
    /// The entry's name: `name`, else the type.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.kind)
    }

    /// The type's own keys as its config struct; unknown keys are errors naming the key.
    fn params<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        toml::Value::Table(self.params.clone())
            .try_into()
            .map_err(|e| config_error(format!("reward {}: {e}", self.name())))
    }

    /// Builds the reward function of this entry.
    fn build_reward(&self, registry: &Registry) -> Result<Arc<dyn Reward>> {
        let name = self.name();
        Ok(match self.kind.as_str() {
            "math" => Arc::new(self.params::<MathConfig>()?.build()),
            "exact" => Arc::new(self.params::<MatchConfig>()?.build(MatchMode::Exact)),
            "contains" => Arc::new(self.params::<MatchConfig>()?.build(MatchMode::Contains)),
            "regex" => Arc::new(self.params::<RegexConfig>()?.build(name)?),
            "format" => Arc::new(self.params::<FormatConfig>()?.build(name)?),
            "length" => Arc::new(self.params::<LengthConfig>()?.build()?),
            "countdown" => Arc::new(self.params::<CountdownConfig>()?.build()),
            "arithmetic" => Arc::new(self.params::<ArithmeticConfig>()?.build()),
            "command" => Arc::new(self.params::<CommandConfig>()?.build(name)?),
            "http" => Arc::new(self.params::<HttpConfig>()?.build(name)?),
            kind => match registry.factories.get(kind) {
                Some(factory) => factory(&self.params)?,
                None => {
                    return Err(Error::UnknownType {
                        name: name.into(),
                        kind: kind.into(),
                    });
                }
            },
        })
    }

    /// Builds the entry: the reward and its weight, timeout and fault policy.
    pub fn build(&self, registry: &Registry) -> Result<Entry> {
        let timeout = duration(self.timeout_s)
            .filter(|_| self.timeout_s > 0.0)
            .ok_or_else(|| {
                config_error(format!(
                    "reward {}: timeout_s must be above 0 and at most {MAX_SECONDS} seconds, not {}",
                    self.name(),
                    self.timeout_s
                ))
            })?;
        if !self.weight.is_finite() {
            return Err(config_error(format!(
                "reward {}: weight must be a finite number, not {}",
                self.name(),
                self.weight
            )));
        }
        if let OnError::Score(value) = self.on_error
            && !value.is_finite()
        {
            return Err(config_error(format!(
                "reward {}: on_error must be a finite score, \"skip\" or \"fail\", not {value}",
                self.name()
            )));
        }
        Ok(Entry {
            name: self.name().into(),
            weight: self.weight,
            timeout,
            on_error: self.on_error,
            reward: self.build_reward(registry)?,
            metrics: RewardMetrics::default(),
        })
    }
}

/// The longest time a config may give, in seconds (about 11.6 days):
/// longer values are refused rather than overflowing a `Duration`.
pub const MAX_SECONDS: f64 = 1e6;

/// `value` seconds as a duration when it is a number from 0 to
/// [`MAX_SECONDS`]; `None` for anything else (negative, NaN, infinite, too long).
pub fn duration(value: f64) -> Option<Duration> {
    (0.0..=MAX_SECONDS)
        .contains(&value)
        .then(|| Duration::from_secs_f64(value))
}

/// Builds a registered reward from its table's own keys.
pub type Factory = Box<dyn Fn(&toml::Table) -> Result<Arc<dyn Reward>> + Send + Sync>;

/// Rust rewards by type name, for `[[reward]] type = "<name>"`.
#[derive(Default)]
pub struct Registry {
    factories: HashMap<String, Factory>,
}

impl Registry {
    /// Registers `factory` under `name` (a built-in name cannot be overridden).
    pub fn register(&mut self, name: &str, factory: Factory) {
        self.factories.insert(name.into(), factory);
    }
}
