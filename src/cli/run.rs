//! `grpo run CONFIG`: GRPO fine-tuning — the learner and, by default, the
//! rollout engine in this process on one device, or a fleet of rollout
//! workers over gRPC (listed in `[rollout] workers`, or registering at
//! `[rollout] listen`), with the in-process engine beside them when
//! `[rollout] in_process` says so; the config's `[[reward]]` tables score,
//! and with an `[environment]` table each sample is a multi-turn episode.
//! The run itself is grpo-learner's `Run` (outputs under `OUT`:
//! `metrics.jsonl`, `rollouts.parquet/`, `checkpoint-<step>/`, `final/`,
//! `progress.png`); `--resume` continues from the newest checkpoint.

use std::path::Path;

use anyhow::Context;
use grpo_env::config::EnvironmentConfig;
use grpo_learner::collect::EpisodeSetup;
use grpo_learner::config::RunConfig;
use grpo_learner::run::Run;
use grpo_reward::{Registry, RewardsConfig};

use crate::cli::train::{TrainArgs, train};

/// Runs the configured GRPO fine-tuning.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let (text, config) = args.config::<RunConfig>()?;
    let rewards = RewardsConfig::from_toml_str(&text)
        .context("the [[reward]] tables")?
        .build(&Registry::default())?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let episodes = EnvironmentConfig::from_toml_str(&text)?
        .map(|environment| EpisodeSetup::from_config(&environment, base, config.rollout.max_completion_tokens))
        .transpose()?;
    let client = args.platform.client()?;
    train(Run::grpo(&config, rewards, episodes, &client, args.resume)?)
}
