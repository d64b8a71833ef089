//! `grpo sft CONFIG`: supervised fine-tuning on prompt/completion pairs
//! (TRL SFTTrainer's completion-only loss), e.g. a warm start before
//! `grpo run`. The config reuses `grpo run`'s `[model]`, `[optimizer]` and
//! `[checkpoint]` sections; see `examples/sft/config.toml`. The run is
//! grpo-learner's `Run` (outputs under `OUT`: `metrics.jsonl` with the
//! eval loss, `checkpoint-<step>/`, `final/`); `--resume` continues from
//! the newest checkpoint.

use anyhow::Context;
use grpo_learner::config::sft::SftRunConfig;
use grpo_learner::hooks::{FinalModel, MetricsLog};
use grpo_learner::run::Run;

use crate::cli::config_args::ConfigArgs;
use crate::cli::platform::PlatformArgs;
use crate::cli::progress::Progress;

/// Arguments of `grpo sft`.
#[derive(Debug, clap::Args)]
pub struct SftArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    config: ConfigArgs,
    /// Continues the run in OUT from its newest checkpoint.
    #[arg(long)]
    resume: bool,
}

/// Runs the configured fine-tuning.
pub fn run(args: &SftArgs) -> anyhow::Result<()> {
    let (text, base) = args.config.text()?;
    let mut config =
        SftRunConfig::from_toml_at(&text, base).with_context(|| format!("in {}", args.config.config.display()))?;
    if let Some(out) = &args.config.out {
        config.logging.out = out.clone();
    }
    let client = args.platform.client()?;
    let mut run = Run::sft(&config, &client, args.resume)?;
    let mut hooks = run.standard_hooks();
    hooks.push(Box::new(Progress::new(config.trainer.max_steps)));
    run.train(&mut hooks)?;
    let out = &config.logging.out;
    eprintln!(
        "the fine-tuned model is in {}; metrics in {}",
        FinalModel::dir(out).display(),
        MetricsLog::path(out).display()
    );
    Ok(())
}
