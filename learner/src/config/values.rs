//! The typed values of config keys that are not plain numbers: names
//! from a fixed set (an unknown one is refused naming the key and the
//! allowed names) and durations (refused unless finite, above 0 and at
//! most [`MAX_SECONDS`]); and [`require`], the one way a range is checked.

use std::fmt::Display;
use std::time::Duration;

use grpo_reward::config::{MAX_SECONDS, duration};
use grpo_worker::WireDtype;
use grpo_xla::ElementType;
use grpo_xla::trace::Parallelism;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A dtype: `"f32"` or `"bf16"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    /// Its name in configs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }

    /// The device element type.
    pub fn element_type(self) -> ElementType {
        match self {
            Dtype::F32 => ElementType::F32,
            Dtype::Bf16 => ElementType::Bf16,
        }
    }

    /// How weight values travel to workers in this dtype.
    pub fn wire(self) -> WireDtype {
        match self {
            Dtype::F32 => WireDtype::F32,
            Dtype::Bf16 => WireDtype::Bf16,
        }
    }
}

/// A dtype setting that may be left to measurement: `"auto"` (the
/// default: whichever of f32 and bf16 a probe at the model's shapes finds
/// faster on this machine, see [`crate::choices`]), `"f32"` or `"bf16"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeSetting {
    /// Measured.
    #[default]
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
}

impl DtypeSetting {
    /// The dtype it names; `None` for `auto`.
    pub fn fixed(self) -> Option<Dtype> {
        match self {
            DtypeSetting::Auto => None,
            DtypeSetting::F32 => Some(Dtype::F32),
            DtypeSetting::Bf16 => Some(Dtype::Bf16),
        }
    }
}

impl std::str::FromStr for DtypeSetting {
    type Err = String;

    /// Parses the names a config file takes (`auto`, `f32`, `bf16`).
    fn from_str(name: &str) -> std::result::Result<Self, String> {
        use serde::de::IntoDeserializer;
        let name: serde::de::value::StrDeserializer<serde::de::value::Error> = name.into_deserializer();
        DtypeSetting::deserialize(name).map_err(|e| e.to_string())
    }
}

/// `[algorithm] importance`: which correction for the rollout/learner
/// mismatch (its cap is `importance_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportanceMode {
    /// No correction.
    None,
    /// Truncated importance sampling per token.
    #[default]
    Token,
    /// Whole sequences masked when their ratio passes the cap.
    Sequence,
}

/// `[trainer] activation_checkpointing`: what a train step keeps of its
/// forward pass for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationCheckpointing {
    /// Every intermediate the backward pass reads.
    #[default]
    None,
    /// Each decoder layer's input alone; the layer is computed again in the
    /// backward pass (TRL's `gradient_checkpointing = true`).
    Layer,
}

impl<'de> Deserialize<'de> for ActivationCheckpointing {
    /// `"none"` or `"layer"`, or TRL's `gradient_checkpointing` boolean.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Flag(bool),
            Name(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Flag(false) => Ok(ActivationCheckpointing::None),
            Written::Flag(true) => Ok(ActivationCheckpointing::Layer),
            Written::Name(name) => match name.as_str() {
                "none" => Ok(ActivationCheckpointing::None),
                "layer" => Ok(ActivationCheckpointing::Layer),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is not \"none\" or \"layer\" (or TRL's true / false)"
                ))),
            },
        }
    }
}

impl ActivationCheckpointing {
    /// Whether decoder layers are rematerialized.
    pub fn per_layer(self) -> bool {
        self == ActivationCheckpointing::Layer
    }
}

/// `[trainer] parallelism`: how the learner spans devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParallelismKind {
    /// One device.
    #[default]
    None,
    /// Batch rows split over the devices; parameters and AdamW state replicated.
    Data,
    /// Parameters, gradients and AdamW state split over the devices too.
    Fsdp,
}

impl ParallelismKind {
    /// The layout over `devices` of a client's `available` devices (0: all
    /// of them); `None` for one device. Refuses fewer than 2 or more than
    /// there are, naming `trainer.devices`.
    pub fn layout(self, devices: usize, available: usize) -> Result<Option<Parallelism>> {
        if self == ParallelismKind::None {
            return Ok(None);
        }
        let devices = if devices == 0 { available } else { devices };
        require(
            "trainer.devices",
            (2..=available).contains(&devices),
            devices,
            &format!(
                "`trainer.parallelism` spans 2 or more of the client's devices and the client has {available} \
                 (on CPU, `--cpu-devices N` makes N)"
            ),
        )?;
        Ok(Some(match self {
            ParallelismKind::Data => Parallelism::DataParallel { devices },
            _ => Parallelism::Fsdp { devices },
        }))
    }
}

/// A duration key's value: seconds, finite, above 0 and at most
/// [`MAX_SECONDS`] (anything else is refused as the config is read).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "f64")]
pub struct Seconds(Duration);

impl Seconds {
    /// The duration.
    pub fn duration(self) -> Duration {
        self.0
    }
}

impl TryFrom<f64> for Seconds {
    type Error = String;

    fn try_from(value: f64) -> std::result::Result<Seconds, String> {
        duration(value)
            .filter(|_| value > 0.0)
            .map(Seconds)
            .ok_or_else(|| format!("{value}: a number of seconds above 0, at most {MAX_SECONDS}"))
    }
}

/// Refuses `value` of `field` unless `ok`, saying the `rule` it breaks.
/// Steps of a run that sets neither `max_steps` nor `num_train_epochs`.
pub const DEFAULT_MAX_STEPS: usize = 100;

/// Most passes over the data `num_train_epochs` may ask for.
const MAX_EPOCHS: f64 = 1e6;

/// A run's steps as the Hugging Face trainer counts them: `max_steps` when
/// given, else `num_train_epochs` passes over `rows` rows taken `per_step`
/// a step (rounded up), else [`DEFAULT_MAX_STEPS`].
pub(crate) fn run_steps(max_steps: Option<usize>, epochs: Option<f64>, rows: usize, per_step: usize) -> usize {
    match (max_steps, epochs) {
        (Some(steps), _) => steps,
        (None, Some(epochs)) => (epochs * rows as f64 / per_step.max(1) as f64).ceil() as usize,
        (None, None) => DEFAULT_MAX_STEPS,
    }
}

/// Checks `trainer.num_train_epochs`: above 0 and finite, at most a million.
pub(crate) fn check_epochs(epochs: Option<f64>) -> Result<()> {
    match epochs {
        None => Ok(()),
        Some(epochs) => require(
            "trainer.num_train_epochs",
            epochs > 0.0 && epochs <= MAX_EPOCHS,
            epochs,
            &format!("above 0, at most {MAX_EPOCHS} (or leave it out and set max_steps)"),
        ),
    }
}

pub(crate) fn require(field: &'static str, ok: bool, value: impl Display, rule: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Config {
            field,
            message: format!("{value}: {rule}"),
        })
    }
}
