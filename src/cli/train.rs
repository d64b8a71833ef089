//! What `grpo run` and `grpo sft` share: their arguments (the platform, the
//! config file and its overrides, `--resume`) and training a built run with
//! the config's hooks and the progress display.

use std::path::{Path, PathBuf};

use anyhow::Context;
use grpo_learner::config::{ConfigFile, with_overrides};
use grpo_learner::hooks::{FinalModel, MetricsLog};
use grpo_learner::run::Run;
use grpo_learner::trainer::Task;

use crate::cli::platform::PlatformArgs;
use crate::cli::progress::Progress;

/// Arguments of a training command.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub platform: PlatformArgs,
    /// The config (TOML).
    pub config: PathBuf,
    /// Overrides `[trainer] max_steps`.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Overrides `[logging] out`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Overrides any setting: `section.key=value` (a TOML value), repeatable.
    #[arg(long = "set")]
    pub overrides: Vec<String>,
    /// Continues the run in OUT from its newest checkpoint.
    #[arg(long)]
    pub resume: bool,
}

impl TrainArgs {
    /// The config's text with the overrides applied, and the config parsed
    /// from it (relative paths from the file's folder; `--out` from here).
    pub fn config<C: ConfigFile>(&self) -> anyhow::Result<(String, C)> {
        let text = std::fs::read_to_string(&self.config)
            .with_context(|| format!("reading the config {}", self.config.display()))?;
        let mut overrides = self.overrides.clone();
        if let Some(steps) = self.max_steps {
            overrides.push(format!("trainer.max_steps={steps}"));
        }
        if let Some(out) = &self.out {
            let out = std::path::absolute(out).with_context(|| format!("--out {}", out.display()))?;
            // Under the name the file uses (TRL's `output_dir` is an alias).
            let trl_name = text
                .parse::<toml::Table>()
                .ok()
                .and_then(|t| t.get("logging")?.get("output_dir").cloned())
                .is_some();
            let key = if trl_name { "output_dir" } else { "out" };
            overrides.push(format!("logging.{key}={}", toml_string(&out)));
        }
        let text = with_overrides(&text, &overrides)?;
        let base = self.config.parent().unwrap_or(Path::new("."));
        let config = C::from_toml_at(&text, base).with_context(|| format!("in {}", self.config.display()))?;
        Ok((text, config))
    }
}

/// `path` as a TOML string.
fn toml_string(path: &Path) -> String {
    toml::Value::String(path.to_string_lossy().into_owned()).to_string()
}

/// Trains `run` to its last step with the config's hooks and the progress
/// display, then says where the results are.
pub fn train<T: Task>(mut run: Run<T>) -> anyhow::Result<()> {
    let mut hooks = run.standard_hooks();
    hooks.push(Box::new(Progress::new(run.max_steps())));
    run.train(&mut hooks)?;
    let out = run.out();
    eprintln!(
        "the final model is in {}; metrics in {}",
        FinalModel::dir(out).display(),
        MetricsLog::path(out).display()
    );
    Ok(())
}
