//! `grpo run CONFIG`: GRPO fine-tuning — the learner and, by default, the
//! rollout engine in this process on one device, or a fleet of rollout
//! workers over gRPC (listed in `[rollout] workers`, or registering at
//! `[rollout] listen`), with the in-process engine beside them when
//! `[rollout] in_process` says so; the config's `[[reward]]` tables score.
//! The run itself is grpo-learner's `Run` (outputs under `OUT`:
//! `metrics.jsonl`, `rollouts.parquet/`, `checkpoint-<step>/`, `final/`,
//! `progress.png`); `--resume` continues from the newest checkpoint.

use anyhow::Context;
use grpo_learner::config::RunConfig;
use grpo_learner::hooks::{FinalModel, MetricsLog, Plot};
use grpo_learner::run::Run;
use grpo_reward::{Registry, RewardsConfig};

use crate::cli::config_args::ConfigArgs;
use crate::cli::platform::PlatformArgs;
use crate::cli::progress::Progress;

/// Arguments of `grpo run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    config: ConfigArgs,
    /// Continues the run in OUT from its newest checkpoint.
    #[arg(long)]
    resume: bool,
}

/// Runs the configured GRPO fine-tuning.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let (text, base) = args.config.text()?;
    let mut config =
        RunConfig::from_toml_at(&text, base).with_context(|| format!("in {}", args.config.config.display()))?;
    if let Some(out) = &args.config.out {
        config.logging.out = out.clone();
    }
    let rewards = RewardsConfig::from_toml_str(&text)
        .context("the [[reward]] tables")?
        .build(&Registry::default())?;
    let client = args.platform.client()?;
    let mut run = Run::grpo(&config, rewards, &client, args.resume)?;
    let mut hooks = run.standard_hooks();
    hooks.push(Box::new(Progress::new(config.trainer.max_steps)));
    run.train(&mut hooks)?;
    let out = &config.logging.out;
    eprintln!(
        "the final policy is in {}; metrics in {}, a plot in {}",
        FinalModel::dir(out).display(),
        MetricsLog::path(out).display(),
        Plot::path(out).display()
    );
    Ok(())
}
