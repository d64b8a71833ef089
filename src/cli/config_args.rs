//! The config file and command-line overrides that `grpo run` and
//! `grpo sft` share.

use std::path::{Path, PathBuf};

use anyhow::Context;
use grpo_learner::config::with_overrides;

/// A TOML config and its overrides.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
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
}

impl ConfigArgs {
    /// The config's text with the overrides applied, and the folder its
    /// relative paths are taken from.
    pub fn text(&self) -> anyhow::Result<(String, &Path)> {
        let text = std::fs::read_to_string(&self.config)
            .with_context(|| format!("reading the config {}", self.config.display()))?;
        let mut overrides = self.overrides.clone();
        if let Some(steps) = self.max_steps {
            overrides.push(format!("trainer.max_steps={steps}"));
        }
        let text = with_overrides(&text, &overrides)?;
        Ok((text, self.config.parent().unwrap_or(Path::new("."))))
    }
}
