//! `grpo sft CONFIG`: supervised fine-tuning on prompt/completion pairs
//! (TRL SFTTrainer's completion-only loss), e.g. a warm start before
//! `grpo run`. The config reuses `grpo run`'s `[model]`, `[optimizer]` and
//! `[checkpoint]` sections; see `examples/sft/config.toml`.
//!
//! Outputs under `OUT` (`[logging] out`): `metrics.jsonl` (one JSON line
//! per step: step, loss, grad_norm, learning_rate, tokens, step_time, and
//! eval_loss on eval steps; a line of step 0 holds the eval loss before
//! training), `checkpoint-<step>/` every `[checkpoint] every` steps and
//! `final/` (the model as a Hugging Face folder).

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use grpo_learner::checkpoint::{self, save_model};
use grpo_learner::data::{load_jsonl, split};
use grpo_learner::placement::Placement;
use grpo_learner::sft::{SftEval, SftLoop, SftParts, SftRunConfig, encode_examples};
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_xla::ElementType;

use crate::cli::config_args::ConfigArgs;
use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo sft`.
#[derive(Debug, clap::Args)]
pub struct SftArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    config: ConfigArgs,
}

/// The config file with the command line's overrides applied.
fn read_config(args: &SftArgs) -> anyhow::Result<SftRunConfig> {
    let (text, base) = args.config.text()?;
    let mut config =
        SftRunConfig::from_toml_at(&text, base).with_context(|| format!("in {}", args.config.config.display()))?;
    if let Some(out) = &args.config.out {
        config.logging.out = out.clone();
    }
    Ok(config)
}

/// Runs the configured fine-tuning.
pub fn run(args: &SftArgs) -> anyhow::Result<()> {
    let config = read_config(args)?;
    let mut sft = config.sft()?;
    let out = config.logging.out.clone();
    let metrics_path = out.join("metrics.jsonl");
    if metrics_path.exists() || checkpoint::latest(&out).is_some() {
        bail!("{} already holds a run: pass --out DIR to start another", out.display());
    }

    let model = Pretrained::open(&config.model.name)?;
    let tokenizer = Arc::new(model.tokenizer.clone().context("the model has no tokenizer")?);
    sft.max_length = sft.max_length.min(model.config.max_positions);
    let rows = load_jsonl(&config.data.path, &config.data.prompt_column)?;
    let (train, eval) = split(rows, config.data.eval_size, config.data.seed)?;
    let column = &config.data.completion_column;
    let train = encode_examples(&tokenizer, &train, column, sft.max_length)?;
    let eval = encode_examples(&tokenizer, &eval, column, sft.max_length)?;
    let client = args.platform.client()?;
    let device = client.device(0)?;
    let decoder = Decoder::new(model.config.clone());
    let params = upload_parameters(&client, device, &decoder, model.weights.as_ref(), ElementType::F32)?;
    let parts = SftParts {
        client: client.clone(),
        decoder,
        data: train,
        data_seed: config.data.seed,
        params,
        placement: Placement::new(&client, config.trainer.parallelism(client.devices().len())?)?,
    };
    let mut sft_loop = SftLoop::new(parts, sft)?;

    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("opening {}", metrics_path.display()))?;
    let mut append = |line: &serde_json::Value| {
        writeln!(metrics, "{line}").with_context(|| format!("writing {}", metrics_path.display()))
    };
    let steps = config.trainer.max_steps;
    let eval_every = config.trainer.eval_every;
    let evaluate = |sft_loop: &SftLoop| -> anyhow::Result<Option<SftEval>> {
        if eval_every == 0 || eval.is_empty() {
            return Ok(None);
        }
        let report = sft_loop.evaluate(&eval)?;
        eprintln!("step {}: eval loss {:.4}", sft_loop.steps_done(), report.loss);
        Ok(Some(report))
    };
    if let Some(report) = evaluate(&sft_loop)? {
        append(&serde_json::json!({"step": 0, "eval_loss": report.loss}))?;
    }
    for _ in 0..steps {
        let started = Instant::now();
        let report = sft_loop.step()?;
        let n = report.step;
        let seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "step {n}/{steps}: loss {:.4}, grad norm {:.3}, lr {:.2e}, {} tokens, {seconds:.2}s",
            report.loss, report.grad_norm, report.learning_rate, report.tokens
        );
        let mut line = serde_json::to_value(&report)?;
        line["step_time"] = serde_json::json!(seconds);
        if (n % eval_every.max(1) == 0 || n == steps)
            && let Some(eval) = evaluate(&sft_loop)?
        {
            line["eval_loss"] = serde_json::json!(eval.loss);
        }
        append(&line)?;
        let every = config.checkpoint.every;
        if every > 0 && (n % every == 0 || n == steps) {
            let dir = sft_loop.checkpoint(&out, &model.config, &tokenizer)?;
            checkpoint::prune(&out, config.checkpoint.keep_last)?;
            eprintln!("checkpoint {}", dir.display());
        }
    }
    let final_dir = out.join("final");
    save_model(&final_dir, &model.config, &tokenizer, sft_loop.host_params()?)?;
    eprintln!(
        "the fine-tuned model is in {}; metrics in {}",
        final_dir.display(),
        metrics_path.display()
    );
    Ok(())
}
