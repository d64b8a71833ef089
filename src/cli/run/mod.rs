//! `grpo run CONFIG`: GRPO fine-tuning — the learner and, by default, the
//! rollout engine in this process on one device, or a fleet of rollout
//! workers over gRPC (listed in `[rollout] workers`, or registering at
//! `[rollout] listen`), with the in-process engine beside them when
//! `[rollout] in_process` says so; the config's `[[reward]]` tables score.
//!
//! Outputs under `OUT` (`[logging] out`): `metrics.jsonl` (one JSON line
//! per step with TRL's metric names, eval results on their steps),
//! `rollouts.parquet/` (every sampled completion), `checkpoint-<step>/`
//! every `[checkpoint] every` steps, `final/` (the policy as a Hugging
//! Face folder) and `progress.png` (reward and eval accuracy by step).
//! `--resume` continues from the newest checkpoint exactly: later metrics
//! lines and rollout parts are dropped, since the run makes them again.

mod metrics;
mod progress;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use grpo_learner::checkpoint::{self, save_model};
use grpo_learner::config::RunConfig;
use grpo_learner::fleet::{Fleet, LocalFleet, WorkerFleet};
use grpo_learner::grpo::{EvalReport, GrpoLoop, GrpoParts, Resume};
use grpo_learner::placement::Placement;
use grpo_learner::plot::plot_metrics;
use grpo_learner::record::RolloutLog;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_reward::{Registry, RewardsConfig};
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::worker::Token;
use grpo_xla::ElementType;

use crate::cli::config_args::ConfigArgs;
use crate::cli::platform::PlatformArgs;
use metrics::MetricsLog;
use progress::Progress;

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

/// The config file with the command line's overrides applied.
fn read_config(args: &RunArgs) -> anyhow::Result<(String, RunConfig)> {
    let (text, base) = args.config.text()?;
    let mut config =
        RunConfig::from_toml_at(&text, base).with_context(|| format!("in {}", args.config.config.display()))?;
    if let Some(out) = &args.config.out {
        config.logging.out = out.clone();
    }
    Ok((text, config))
}

/// The checkpoint to resume from, or `None` for a new run; a new run
/// refuses an output folder that already holds one.
fn resume_point(out: &Path, resume: bool) -> anyhow::Result<Option<PathBuf>> {
    let newest = checkpoint::latest(out);
    if resume {
        let dir = newest.with_context(|| {
            format!(
                "--resume: {} holds no complete checkpoint; start the run without --resume",
                out.display()
            )
        })?;
        return Ok(Some(dir));
    }
    if newest.is_some() || out.join("metrics.jsonl").exists() {
        bail!(
            "{} already holds a run: pass --resume to continue it, or --out DIR to start another",
            out.display()
        );
    }
    Ok(None)
}

/// Runs the configured GRPO fine-tuning.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let (text, config) = read_config(args)?;
    let grpo = config.grpo()?;
    let rewards = RewardsConfig::from_toml_str(&text)
        .context("the [[reward]] tables")?
        .build(&Registry::default())?;
    let out = config.logging.out.clone();
    let resume_from = resume_point(&out, args.resume)?;

    let model = Pretrained::open(&config.model.name)?;
    let tokenizer = Arc::new(model.tokenizer.clone().context("the model has no tokenizer")?);
    let saved = match &resume_from {
        Some(dir) => {
            let saved = Pretrained::open_dir(dir)?;
            if saved.config != model.config {
                bail!(
                    "{} is a checkpoint of another model than `{}`",
                    dir.display(),
                    config.model.name
                );
            }
            Some(saved.weights)
        }
        None => None,
    };
    // The policy starts from the checkpoint when resuming; the KL's reference is always the model.
    let weights = saved.as_ref().unwrap_or(&model.weights);
    let (train, eval) = config.data.load()?;
    let client = args.platform.client()?;
    let device = client.device(0)?;
    let decoder = Decoder::new(model.config.clone());
    let upload = || upload_parameters(&client, device, &decoder, weights.as_ref(), ElementType::F32);
    let reference = (grpo.loss.beta > 0.0)
        .then(|| upload_parameters(&client, device, &decoder, model.weights.as_ref(), ElementType::F32))
        .transpose()?;
    let plan = config.fleet()?;
    let devices = client.devices();
    if plan.engines > devices.len() {
        bail!(
            "[rollout] engines = {} needs as many devices; the client has {} (on CPU: grpo run --cpu-devices {})",
            plan.engines,
            devices.len(),
            plan.engines
        );
    }
    let engine_on = |device: &grpo_xla::Device| -> anyhow::Result<Engine> {
        let engine_config = EngineConfig {
            max_num_seqs: (grpo.group_size * grpo.prompts_per_step).div_ceil(plan.engines),
            max_model_len: config.rollout.max_model_len.min(model.config.max_positions),
            dtype: config.engine_dtype()?,
        };
        let weights = upload_parameters(&client, device, &decoder, weights.as_ref(), engine_config.dtype)?;
        Ok(Engine::new(&client, decoder.clone(), weights, engine_config)?.with_tokenizer(tokenizer.clone()))
    };
    let fleet: Box<dyn Fleet> = if plan.local_only() {
        Box::new(LocalFleet::new(engine_on(device)?))
    } else {
        let token =
            || Token::from_file_or_env(config.rollout.worker_token_file.as_deref(), "rollout.worker_token_file");
        let mut fleet = WorkerFleet::new(plan.config)?;
        if !plan.workers.is_empty() {
            fleet.add_workers(&plan.workers, &token()?)?;
        }
        if let Some(addr) = plan.listen {
            let bound = fleet.listen(addr, token()?)?;
            eprintln!("taking rollout worker registrations on {bound} (grpo worker --learner {bound})");
        }
        if plan.in_process {
            for device in &devices[..plan.engines] {
                let name = match plan.engines {
                    1 => "in-process".to_string(),
                    _ => format!("in-process (device {})", device.id()),
                };
                fleet.add_engine(name, engine_on(device)?);
            }
        }
        Box::new(fleet)
    };
    let resume = resume_from
        .as_ref()
        .map(|dir| Resume::from_checkpoint(checkpoint::load(dir)?, &decoder, &grpo.optimizer))
        .transpose()?;
    let params = upload()?;
    let placement = Placement::new(&client, config.trainer.parallelism(devices.len())?)?;
    let parts = GrpoParts {
        client: client.clone(),
        decoder,
        tokenizer: tokenizer.clone(),
        fleet,
        rewards,
        data: train,
        data_seed: config.data.seed,
        params,
        placement,
        reference,
    };
    let mut grpo_loop = GrpoLoop::resume(parts, grpo, resume)?;

    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let done = grpo_loop.steps_done();
    let resumed = resume_from.is_some().then_some(done as u64);
    let mut metrics = MetricsLog::open(&out, resumed)?;
    let rollouts = RolloutLog::open(&out)?;
    if let Some(step) = resumed {
        rollouts.truncate_after(step)?;
    }
    let steps = config.trainer.max_steps;
    let mut progress = Progress::new(steps, done);
    if let Some(dir) = &resume_from {
        progress.line(&format!("resuming after step {done} from {}", dir.display()));
    }
    let eval_every = config.trainer.eval_every;
    let evaluate = |grpo_loop: &mut GrpoLoop, progress: &mut Progress| -> anyhow::Result<Option<EvalReport>> {
        if eval_every == 0 || eval.is_empty() {
            return Ok(None);
        }
        let report = grpo_loop.evaluate(&eval)?;
        progress.eval(grpo_loop.steps_done(), &report);
        Ok(Some(report))
    };
    if done == 0
        && let Some(report) = evaluate(&mut grpo_loop, &mut progress)?
    {
        metrics.append(&eval_line(0, &report))?;
    }
    for _ in done..steps {
        let started = Instant::now();
        let (report, rows) = grpo_loop.step()?;
        let n = report.step;
        rollouts.append(n as u64, &rows)?;
        let tokens = rows.iter().map(|r| r.completion_tokens as usize).sum();
        let seconds = started.elapsed().as_secs_f64();
        progress.step(&report, seconds, tokens);
        let mut line = serde_json::to_value(&report)?;
        line["step_time"] = serde_json::json!(seconds);
        line["compiled_train_programs"] = serde_json::json!(grpo_loop.compiled_steps());
        line["learner_state_bytes"] = serde_json::json!(grpo_loop.state_bytes_per_device());
        if (n % eval_every.max(1) == 0 || n == steps)
            && let Some(eval) = evaluate(&mut grpo_loop, &mut progress)?
        {
            merge(&mut line, eval_line(n, &eval));
        }
        metrics.append(&line)?;
        let every = config.checkpoint.every;
        if every > 0 && (n % every == 0 || n == steps) {
            let dir = grpo_loop.checkpoint(&out, &model.config, &tokenizer)?;
            checkpoint::prune(&out, config.checkpoint.keep_last)?;
            progress.line(&format!("checkpoint {}", dir.display()));
        }
    }
    progress.finish();
    let final_dir = out.join("final");
    save_model(&final_dir, &model.config, &tokenizer, grpo_loop.host_params()?)?;
    let png = out.join("progress.png");
    plot_metrics(metrics.path(), &png)?;
    eprintln!(
        "the final policy is in {}; metrics in {}, a plot in {}",
        final_dir.display(),
        metrics.path().display(),
        png.display()
    );
    Ok(())
}

/// The metrics of an eval after `step` steps, under TRL-like `eval_` names.
fn eval_line(step: usize, eval: &EvalReport) -> serde_json::Value {
    serde_json::json!({
        "step": step,
        "eval_accuracy": eval.accuracy,
        "eval_reward": eval.reward,
        "eval_mean_length": eval.mean_length,
        "eval_time": eval.seconds,
    })
}

/// Adds `extra`'s fields to `line`.
fn merge(line: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(line), serde_json::Value::Object(extra)) = (line.as_object_mut(), extra) {
        line.extend(extra);
    }
}
