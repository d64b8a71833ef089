//! `grpo run CONFIG`: GRPO fine-tuning in one process — the rollout engine
//! and the learner on one device, the config's `[[reward]]` tables scoring.
//! Each step appends one JSON line (TRL's metric names) to
//! `OUT/metrics.jsonl` and prints a progress line; the final policy is
//! written to `OUT/final/` as a Hugging Face folder.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use grpo_learner::checkpoint::save_model;
use grpo_learner::config::RunConfig;
use grpo_learner::data::{load_jsonl, split};
use grpo_learner::grpo::{GrpoLoop, GrpoParts};
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_reward::{Registry, RewardsConfig};
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_xla::ElementType;

use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// The run config (TOML).
    config: PathBuf,
    /// Overrides `[trainer] max_steps`.
    #[arg(long)]
    max_steps: Option<usize>,
    /// Overrides `[logging] out`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Overrides any setting: `section.key=value` (a TOML value), repeatable.
    #[arg(long = "set")]
    overrides: Vec<String>,
}

/// Runs the configured GRPO fine-tuning.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading the run config {}", args.config.display()))?;
    let mut overrides = args.overrides.clone();
    if let Some(steps) = args.max_steps {
        overrides.push(format!("trainer.max_steps={steps}"));
    }
    let text = RunConfig::with_overrides(&text, &overrides)?;
    let base = args.config.parent().unwrap_or(std::path::Path::new("."));
    let mut config = RunConfig::from_toml_at(&text, base).with_context(|| format!("in {}", args.config.display()))?;
    if let Some(out) = &args.out {
        config.logging.out = out.clone();
    }
    let grpo = config.grpo()?;
    let rewards = RewardsConfig::from_toml_str(&text)
        .context("the [[reward]] tables")?
        .build(&Registry::default())?;

    let model = Pretrained::open(&config.model.name)?;
    let tokenizer = Arc::new(model.tokenizer.clone().context("the model has no tokenizer")?);
    let examples = load_jsonl(&config.data.path, &config.data.prompt_column)?;
    let (train, _eval) = split(examples, config.data.eval_size, config.data.seed)?;
    let client = args.platform.client()?;
    let device = client.device(0)?;
    let decoder = Decoder::new(model.config.clone());
    let upload = || upload_parameters(&client, device, &decoder, model.weights.as_ref(), ElementType::F32);
    let engine_config = EngineConfig {
        max_num_seqs: grpo.group_size * grpo.prompts_per_step,
        max_model_len: config.rollout.max_model_len.min(model.config.max_positions),
        dtype: ElementType::F32,
    };
    let engine = Engine::new(&client, decoder.clone(), upload()?, engine_config)?.with_tokenizer(tokenizer.clone());
    let params = upload()?;
    let parts = GrpoParts {
        client: client.clone(),
        decoder,
        tokenizer: tokenizer.clone(),
        engine,
        rewards,
        data: train,
        data_seed: config.data.seed,
        params,
    };
    let mut grpo_loop = GrpoLoop::new(parts, grpo)?;

    let out = &config.logging.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let metrics_path = out.join("metrics.jsonl");
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("opening {}", metrics_path.display()))?;
    let steps = config.trainer.max_steps;
    for _ in 0..steps {
        let started = std::time::Instant::now();
        let report = grpo_loop.step()?;
        let mut line = serde_json::to_value(&report)?;
        line["step_time"] = serde_json::json!(started.elapsed().as_secs_f64());
        writeln!(metrics, "{line}").with_context(|| format!("writing {}", metrics_path.display()))?;
        eprintln!(
            "step {}/{steps}  reward {:.3} ± {:.3}  loss {:.4}  grad_norm {:.3}  len {:.1}  {:.1} s",
            report.step + 1,
            report.reward,
            report.reward_std,
            report.loss,
            report.grad_norm,
            report.mean_length,
            started.elapsed().as_secs_f64()
        );
    }
    let final_dir = out.join("final");
    save_model(&final_dir, &model.config, &tokenizer, &grpo_loop.named_params())?;
    eprintln!("the final policy is in {}", final_dir.display());
    Ok(())
}
