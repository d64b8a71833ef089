//! `[logging]` of `grpo run` and `grpo sft`: the output folder and what is
//! reported beyond `metrics.jsonl` (TRL's `report_to`, `logging_steps`,
//! `log_completions`, `num_completions_to_print`) or served
//! (`prometheus_listen`).

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};

/// The output folder a task writes to when its config gives none.
pub trait DefaultOut {
    /// The folder, relative to the config file.
    const OUT: &'static str;
}

/// `grpo run`'s default output folder: `runs/grpo`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpoOut;

impl DefaultOut for GrpoOut {
    const OUT: &'static str = "runs/grpo";
}

/// `grpo sft`'s default output folder: `runs/sft`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SftOut;

impl DefaultOut for SftOut {
    const OUT: &'static str = "runs/sft";
}

/// Where a run's metrics are reported besides `metrics.jsonl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracker {
    /// TensorBoard event files in `OUT/tensorboard/`.
    TensorBoard,
}

/// `[logging]` of a task whose output folder is by default `D`'s.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default, bound = "D: DefaultOut")]
pub struct LoggingSection<D = GrpoOut> {
    /// The output folder (metrics.jsonl, final/, …), relative to the config
    /// file. Default [`DefaultOut::OUT`].
    #[serde(alias = "output_dir")]
    pub out: PathBuf,
    /// TRL's `report_to`: `"tensorboard"`, `"all"` (the same) or `"none"`,
    /// alone or in a list; read without the `"none"`s. Default none.
    #[serde(deserialize_with = "names")]
    report_to: Vec<String>,
    /// Steps between reports to the trackers, each the mean of the steps
    /// since the last (and the last step). Default 1.
    pub logging_steps: usize,
    /// Sampled completions as a table at each report (TensorBoard's text
    /// tab and `OUT/completions.jsonl`). Default false.
    pub log_completions: bool,
    /// Most completions in each table (`None`: all of the step's). Default none.
    pub num_completions_to_print: Option<usize>,
    /// `IP:port` where the run serves its Prometheus metrics
    /// (`http://IP:port/metrics`); port 0 picks a free one. Default none.
    pub prometheus_listen: Option<SocketAddr>,
    #[serde(skip)]
    task: PhantomData<D>,
}

/// `report_to`'s names, given as one or as a list, without `"none"`.
fn names<'de, De: Deserializer<'de>>(deserializer: De) -> std::result::Result<Vec<String>, De::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        One(String),
        Many(Vec<String>),
    }
    let names = match Written::deserialize(deserializer)? {
        Written::One(name) => vec![name],
        Written::Many(names) => names,
    };
    Ok(names.into_iter().filter(|name| name != "none").collect())
}

impl<D: DefaultOut> Default for LoggingSection<D> {
    fn default() -> Self {
        LoggingSection {
            out: PathBuf::from(D::OUT),
            report_to: Vec::new(),
            logging_steps: 1,
            log_completions: false,
            num_completions_to_print: None,
            prometheus_listen: None,
            task: PhantomData,
        }
    }
}

impl<D> LoggingSection<D> {
    /// The output folder resolved against the config file's folder `base`.
    pub fn rebase(&mut self, base: &Path) {
        self.out = base.join(&self.out);
    }

    /// The trackers `report_to` names; others are refused, naming what to
    /// use instead.
    pub fn trackers(&self) -> Result<Vec<Tracker>> {
        let mut trackers = Vec::new();
        for name in &self.report_to {
            let tracker = match name.as_str() {
                "tensorboard" | "all" => Tracker::TensorBoard,
                "wandb" => {
                    return Err(report_to(
                        "\"wandb\" is not built in: report to \"tensorboard\" and import the run with \
                         `wandb sync --sync-tensorboard OUT/tensorboard`",
                    ));
                }
                other => {
                    return Err(report_to(&format!(
                        "{other:?} is not supported: use \"tensorboard\" or \"none\""
                    )));
                }
            };
            if !trackers.contains(&tracker) {
                trackers.push(tracker);
            }
        }
        Ok(trackers)
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        self.trackers()?;
        if self.logging_steps == 0 {
            return Err(Error::Config {
                field: "logging.logging_steps",
                message: "must be at least 1".to_string(),
            });
        }
        if self.num_completions_to_print == Some(0) {
            return Err(Error::Config {
                field: "logging.num_completions_to_print",
                message: "must be at least 1 (leave it out for all of a step's completions)".to_string(),
            });
        }
        Ok(())
    }
}

fn report_to(message: &str) -> Error {
    Error::Config {
        field: "logging.report_to",
        message: message.to_string(),
    }
}
