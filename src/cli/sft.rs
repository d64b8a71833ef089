//! `grpo sft CONFIG`: supervised fine-tuning on prompt/completion pairs
//! (TRL SFTTrainer's completion-only loss), e.g. a warm start before
//! `grpo run`. The config reuses `grpo run`'s `[model]`, `[optimizer]` and
//! `[checkpoint]` sections; see `examples/sft/config.toml`. The run is
//! grpo-learner's `Run` (outputs under `OUT`: `metrics.jsonl` with the
//! eval loss, `checkpoint-<step>/`, `final/`); `--resume` continues from
//! the newest checkpoint.

use grpo_learner::config::sft::SftRunConfig;
use grpo_learner::run::Run;

use crate::cli::train::{TrainArgs, train};

/// Runs the configured fine-tuning.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let (_, config) = args.config::<SftRunConfig>()?;
    let client = args.platform.client()?;
    train(Run::sft(&config, &client, args.resume)?)
}
