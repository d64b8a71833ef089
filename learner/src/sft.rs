//! Supervised fine-tuning (warm starts before GRPO), with TRL
//! `SFTTrainer`'s completion-only loss: over a batch of prompt/completion
//! pairs, the mean negative log-likelihood of the completion tokens,
//!
//! `loss = −Σ_b Σ_j m_bj · log π(y_bj | x_b, y_b<j) / Σ_b Σ_j m_bj`,
//!
//! where `m_bj` is 1 on completion tokens (the completion text's tokens and
//! the EOS token appended after them, as TRL appends it) and 0 on prompt and
//! padding positions. The step is the GRPO step's machinery
//! ([`TrainProgram`]) with this loss: rows laid out as
//! [`crate::batch`] packs them (prompt right-aligned in `P` columns,
//! completion in the last `C`), one program when the batch is one
//! micro-batch, else gradients accumulated with each micro-batch's
//! normalizer the batch's token count divided by their number
//! ([`micro_normalizer`]), so the update equals the whole batch's.
//!
//! The step's inputs, in order: `ids [B,P+C] s32`, `attention [B,P+C]
//! pred`, `completion [B,C] f32`, `normalizer [] f32`
//! ([`sft_batch_types`]). Its one metric is the NLL sum (gradient stopped).
//!
//! The run config of `grpo sft` ([`SftRunConfig`]) reuses `grpo run`'s
//! `[model]`, `[optimizer]` and `[checkpoint]` sections; `[data]`,
//! `[trainer]` and `[logging]` are its own. Unknown keys are refused
//! naming them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::HostTensor;
use grpo_xla::trace::{AdamW, Optimizer, Parallelism, StepMetrics, Tensor, TrainStepSpec};
use grpo_xla::{Buffer, Client, ElementType, TensorType};
use serde::Deserialize;
use serde_json::Value;

use crate::batch::{Rollout, StepBatch, pack};
use crate::checkpoint::{TrainingCheckpoint, optimizer_names};
use crate::collect::PromptEncoder;
use crate::config::{CheckpointSection, ModelSection, OptimizerSection, RunConfig};
use crate::data::{Example, PromptSampler};
use crate::error::{Error, Result};
use crate::grpo::LoopState;
use crate::loss::LossType;
use crate::placement::{BatchInputs, LearnerState, OptimizerState, Placement};
use crate::schedule::{Decay, Schedule};
use crate::trainer::{MicroBatchShape, TrainProgram, micro_normalizer, param_types};

/// The whole `grpo sft` run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftRunConfig {
    /// The model to fine-tune (as in `grpo run`).
    pub model: ModelSection,
    /// The prompt/completion pairs.
    pub data: SftDataSection,
    /// AdamW and the learning rate (as in `grpo run`; its default rate
    /// 1e-6 suits RL — SFT usually wants 1e-5 to 1e-4).
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Steps and batches.
    #[serde(default)]
    pub trainer: SftTrainerSection,
    /// Checkpoints (as in `grpo run`).
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Outputs.
    #[serde(default)]
    pub logging: SftLoggingSection,
}

/// `[data]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftDataSection {
    /// A JSONL file of rows, relative to the config file. Required.
    pub path: PathBuf,
    /// The column holding the prompt (text, or chat turns rendered with the
    /// chat template and its generation prompt). Default "prompt".
    #[serde(default = "default_prompt_column")]
    pub prompt_column: String,
    /// The column holding the completion (text, or assistant turns whose
    /// contents are joined). Default "completion".
    #[serde(default = "default_completion_column")]
    pub completion_column: String,
    /// Rows held out for the eval loss. Default 0.
    #[serde(default)]
    pub eval_size: usize,
    /// The seed of the split and of the example order. Default 0.
    #[serde(default)]
    pub seed: u64,
}

fn default_prompt_column() -> String {
    "prompt".to_string()
}

fn default_completion_column() -> String {
    "completion".to_string()
}

/// `[trainer]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftTrainerSection {
    /// Optimizer steps. Default 100.
    pub max_steps: usize,
    /// Sequences per step. Default 8.
    pub batch_size: usize,
    /// Sequences per micro-batch (gradients accumulate over
    /// `ceil(batch_size / micro_batch_size)` of them). Default 8.
    pub micro_batch_size: usize,
    /// The eval loss on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    pub eval_every: usize,
    /// Longest prompt + completion in tokens; longer completions are cut
    /// (TRL's `max_length`), capped by the model's positions. Default 1024.
    pub max_length: usize,
    /// How the learner spans devices: "none" (default), "data" or "fsdp"
    /// (as in `grpo run`; [`crate::config::learner_parallelism`]).
    pub parallelism: String,
    /// Devices of an SPMD learner (0: all the client's). Default 0.
    pub devices: usize,
}

impl SftTrainerSection {
    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        crate::config::learner_parallelism(&self.parallelism, self.devices, available)
    }
}

impl Default for SftTrainerSection {
    fn default() -> Self {
        SftTrainerSection {
            max_steps: 100,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 10,
            max_length: 1024,
            parallelism: "none".to_string(),
            devices: 0,
        }
    }
}

/// `[logging]` of `grpo sft`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftLoggingSection {
    /// The output folder (metrics.jsonl, final/), relative to the config
    /// file. Default "runs/sft".
    pub out: PathBuf,
}

impl Default for SftLoggingSection {
    fn default() -> Self {
        SftLoggingSection {
            out: PathBuf::from("runs/sft"),
        }
    }
}

fn invalid(field: &'static str, message: String) -> Error {
    Error::Config { field, message }
}

impl SftRunConfig {
    /// Reads `path`; data and output paths become relative to its folder.
    pub fn from_file(path: &Path) -> Result<SftRunConfig> {
        Self::from_toml_at(
            &crate::config::read_text(path)?,
            path.parent().unwrap_or(Path::new(".")),
        )
    }

    /// Parses TOML text of a config file in folder `base` (relative data
    /// and output paths are taken from there) and validates it.
    pub fn from_toml_at(text: &str, base: &Path) -> Result<SftRunConfig> {
        let mut config = Self::from_toml_str(text)?;
        config.data.path = base.join(&config.data.path);
        config.logging.out = base.join(&config.logging.out);
        Ok(config)
    }

    /// Parses TOML text and validates it.
    pub fn from_toml_str(text: &str) -> Result<SftRunConfig> {
        let table: toml::Table = text.parse().map_err(|e| invalid("config", format!("not TOML: {e}")))?;
        let config: SftRunConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            let message = e.into_inner().message().to_string();
            invalid("config", format!("`{key}`: {message}"))
        })?;
        config.sft()?;
        Ok(config)
    }

    /// Applies `section.key=value` overrides (TOML values), as `grpo run` does.
    pub fn with_overrides(text: &str, overrides: &[String]) -> Result<String> {
        RunConfig::with_overrides(text, overrides)
    }

    /// The loop's settings, checked.
    pub fn sft(&self) -> Result<SftConfig> {
        let t = &self.trainer;
        let o = &self.optimizer;
        if t.batch_size == 0 || t.micro_batch_size == 0 {
            return Err(invalid(
                "trainer.batch_size",
                "batch_size and micro_batch_size must be ≥ 1".to_string(),
            ));
        }
        if t.max_length < 2 {
            return Err(invalid("trainer.max_length", format!("{}: at least 2", t.max_length)));
        }
        crate::config::parallelism_kind(&t.parallelism)?;
        let decay = match o.schedule.as_str() {
            "constant" => Decay::Constant,
            "linear" => Decay::Linear,
            "cosine" => Decay::Cosine,
            other => {
                return Err(invalid(
                    "optimizer.schedule",
                    format!("`{other}`; choose one of constant, linear, cosine"),
                ));
            }
        };
        let config = SftConfig {
            batch_size: t.batch_size,
            micro_batch_rows: t.micro_batch_size.min(t.batch_size),
            max_length: t.max_length,
            schedule: Schedule {
                lr: o.lr,
                warmup: o.warmup_steps,
                total: t.max_steps.max(1),
                decay,
            },
            optimizer: AdamW {
                weight_decay: o.weight_decay,
                ..AdamW::default()
            },
            max_grad_norm: (o.max_grad_norm > 0.0).then_some(o.max_grad_norm),
        };
        config.schedule.validate()?;
        Ok(config)
    }
}

/// The settings of the SFT loop.
#[derive(Debug, Clone)]
pub struct SftConfig {
    /// Sequences per optimizer step.
    pub batch_size: usize,
    /// Rows per micro-batch.
    pub micro_batch_rows: usize,
    /// Longest prompt + completion (longer completions are cut).
    pub max_length: usize,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// AdamW's settings (the rate comes from the schedule).
    pub optimizer: AdamW,
    /// Global gradient-norm clipping.
    pub max_grad_norm: Option<f64>,
}

/// One tokenized training pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The completion's token ids, EOS included (the tokens that are scored).
    pub completion: Vec<u32>,
}

/// The completion text of `row`'s `column`: text, or chat turns whose
/// contents are joined.
fn completion_text(row: &Example, column: &str) -> Result<String> {
    let bad = |message: String| Error::Config {
        field: "data.completion_column",
        message: format!("row {}: {message}", row.index + 1),
    };
    match row.columns.get(column) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(turns)) => turns
            .iter()
            .map(|turn| {
                turn.get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("`{column}` turns need a text `content`")))
            })
            .collect(),
        Some(_) => Err(bad(format!("`{column}` must be text or a list of chat turns"))),
        None => Err(bad(format!("no `{column}` column"))),
    }
}

/// Tokenizes `rows`: the prompt as `grpo run` renders it ([`PromptEncoder`]),
/// the completion text without special tokens, then EOS; pairs longer than
/// `max_length` lose the end of their completion (a prompt must leave room
/// for one completion token).
pub fn encode_examples(
    tokenizer: &std::sync::Arc<Tokenizer>,
    rows: &[Example],
    completion_column: &str,
    max_length: usize,
) -> Result<Vec<SftExample>> {
    let encoder = PromptEncoder::new(tokenizer.clone())?;
    let eos = tokenizer.eos_id();
    rows.iter()
        .map(|row| {
            let prompt = encoder.encode(&row.prompt)?.ids;
            let mut completion = tokenizer.encode(&completion_text(row, completion_column)?, false)?;
            completion.extend(eos);
            if prompt.is_empty() || prompt.len() >= max_length || completion.is_empty() {
                return Err(Error::Config {
                    field: "trainer.max_length",
                    message: format!(
                        "row {}: a prompt of {} tokens and a completion of {} leave nothing to train on within {max_length} tokens",
                        row.index + 1,
                        prompt.len(),
                        completion.len()
                    ),
                });
            }
            completion.truncate(max_length - prompt.len());
            Ok(SftExample { prompt, completion })
        })
        .collect()
}

/// Packs `examples` into micro-batches of `rows` rows (the layout of
/// [`crate::batch::pack`]); the normalizer is the completion token count.
pub fn pack_examples(examples: &[SftExample], rows: usize, max_tokens: usize) -> Result<StepBatch> {
    let rollouts: Vec<Rollout> = examples
        .iter()
        .map(|e| Rollout {
            prompt: e.prompt.clone(),
            completion: e.completion.clone(),
            behaviour_logprobs: vec![0.0; e.completion.len()],
            advantage: 0.0,
            valid: true,
        })
        .collect();
    pack(&rollouts, rows, max_tokens, LossType::Dapo, max_tokens)
}

/// The input types of an SFT micro-batch, in order (see the module's list).
pub fn sft_batch_types(shape: MicroBatchShape) -> Vec<TensorType> {
    let (b, t, c) = (shape.rows as i64, shape.tokens() as i64, shape.completion_tokens as i64);
    vec![
        TensorType::new(ElementType::S32, [b, t]),
        TensorType::new(ElementType::Pred, [b, t]),
        TensorType::new(ElementType::F32, [b, c]),
        TensorType::new(ElementType::F32, []),
    ]
}

/// Traces the SFT loss of one micro-batch, `−Σ mask·logprob / normalizer`,
/// and its metric, the NLL sum (gradient stopped).
pub fn traced_sft_loss(
    decoder: &Decoder,
    params: &[Tensor],
    batch: &[Tensor],
) -> grpo_xla::Result<(Tensor, Vec<Tensor>)> {
    let (ids, attention, completion, normalizer) = (&batch[0], &batch[1], &batch[2], &batch[3]);
    let (logprobs, _) = decoder.token_logprobs(params, ids, attention, completion.dims()[1], 1.0)?;
    let nll = logprobs.mul(completion)?.sum_all()?.neg()?;
    let loss = nll.div(normalizer)?;
    Ok((loss, vec![nll.stop_gradient()?]))
}

/// How the SFT step is compiled.
pub struct SftStepConfig<'a> {
    /// Parameter dtype (f32 master weights by default).
    pub dtype: ElementType,
    /// The optimizer traced into the update.
    pub optimizer: &'a dyn Optimizer,
    /// Global gradient-norm clipping; `None` disables it.
    pub max_grad_norm: Option<f64>,
}

/// A compiled SFT step (a [`TrainProgram`] of [`traced_sft_loss`]).
pub struct SftStep(TrainProgram);

impl SftStep {
    /// Compiles the step for `micro_batches` micro-batches of `shape`.
    pub fn compile(
        client: &Client,
        decoder: &Decoder,
        config: &SftStepConfig<'_>,
        placement: &Placement,
        shape: MicroBatchShape,
        micro_batches: usize,
    ) -> Result<SftStep> {
        let spec = TrainStepSpec {
            params: param_types(decoder, config.dtype),
            batch: sft_batch_types(shape),
            optimizer: config.optimizer,
            max_grad_norm: config.max_grad_norm,
        };
        let loss = |params: &[Tensor], batch: &[Tensor]| traced_sft_loss(decoder, params, batch);
        Ok(SftStep(TrainProgram::compile(
            client,
            &spec,
            placement,
            micro_batches,
            loss,
        )?))
    }

    /// One optimizer step over `micro_batches` (inputs as [`sft_batch_types`]).
    pub fn step(&self, state: &mut LearnerState, micro_batches: &[BatchInputs], lr: f32) -> Result<StepMetrics> {
        self.0.step(state, micro_batches, lr)
    }
}

/// The inputs of a packed batch's micro-batches on `placement`, each with
/// its share of the batch normalizer ([`micro_normalizer`]).
pub fn upload_batch(client: &Client, placement: &Placement, batch: &StepBatch) -> Result<Vec<BatchInputs>> {
    let share = micro_normalizer(batch.normalizer, batch.micro_batches.len());
    batch
        .micro_batches
        .iter()
        .map(|m| {
            let mut inputs = m.upload_tokens(client, placement)?;
            placement.push(client, &mut inputs, &[share], &[])?;
            Ok(inputs)
        })
        .collect()
}

/// What one SFT step did (TRL's metric names).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SftReport {
    /// The step (1-based).
    pub step: usize,
    /// Mean NLL over the batch's completion tokens.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// The step's learning rate.
    pub learning_rate: f64,
    /// Completion tokens trained on.
    pub tokens: usize,
}

/// The mean NLL of held-out pairs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SftEval {
    /// Mean NLL over their completion tokens.
    pub loss: f64,
    /// Completion tokens scored.
    pub tokens: usize,
}

/// What the SFT loop is built from.
pub struct SftParts {
    /// The device client.
    pub client: Client,
    /// The model's decoder.
    pub decoder: Decoder,
    /// The training pairs.
    pub data: Vec<SftExample>,
    /// The seed of the example order.
    pub data_seed: u64,
    /// The initial weights: f32 on the client's first device, in the decoder's order.
    pub params: Vec<Buffer>,
    /// Where the learner keeps its state and batches.
    pub placement: Placement,
}

/// The SFT loop: seeded batches over epochs, the compiled step per token
/// bucket, the schedule's rate, and the eval loss.
pub struct SftLoop {
    client: Client,
    decoder: Decoder,
    config: SftConfig,
    data: Vec<SftExample>,
    sampler: PromptSampler,
    data_seed: u64,
    placement: Placement,
    state: LearnerState,
    steps: HashMap<(MicroBatchShape, bool), SftStep>,
    scorer: LogprobsRunner,
    step: usize,
}

impl SftLoop {
    /// The loop from its parts, at step 0.
    pub fn new(parts: SftParts, config: SftConfig) -> Result<SftLoop> {
        config.schedule.validate()?;
        if parts.data.is_empty() || config.batch_size == 0 || config.micro_batch_rows == 0 {
            return Err(invalid(
                "trainer.batch_size",
                format!(
                    "{} pairs, batches of {} in micro-batches of {}: all must be ≥ 1",
                    parts.data.len(),
                    config.batch_size,
                    config.micro_batch_rows
                ),
            ));
        }
        parts.placement.check_rows(config.micro_batch_rows)?;
        Ok(SftLoop {
            scorer: LogprobsRunner::new(&parts.client, parts.decoder.clone(), ElementType::F32),
            state: parts.placement.state(
                &parts.client,
                parts.params,
                OptimizerState::Zeros(&optimizer_names(&parts.decoder, &config.optimizer)),
            )?,
            placement: parts.placement,
            sampler: PromptSampler::new(parts.data.len(), parts.data_seed),
            client: parts.client,
            decoder: parts.decoder,
            config,
            data: parts.data,
            data_seed: parts.data_seed,
            steps: HashMap::new(),
            step: 0,
        })
    }

    /// Steps completed.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Runs one optimizer step on the next `batch_size` pairs.
    pub fn step(&mut self) -> Result<SftReport> {
        let c = &self.config;
        let rows = self.sampler.next_batch(c.batch_size);
        let examples: Vec<SftExample> = rows.iter().map(|&r| self.data[r].clone()).collect();
        let batch = pack_examples(&examples, c.micro_batch_rows, c.max_length)?;
        let count = batch.micro_batches.len();
        let shape = batch.micro_batches[0].shape;
        let lr = c.schedule.at(self.step);
        let key = (shape, count > 1);
        if !self.steps.contains_key(&key) {
            let config = SftStepConfig {
                dtype: ElementType::F32,
                optimizer: &self.config.optimizer,
                max_grad_norm: self.config.max_grad_norm,
            };
            let step = SftStep::compile(&self.client, &self.decoder, &config, &self.placement, shape, count)?;
            self.steps.insert(key, step);
        }
        let step = &self.steps[&key];
        let uploaded = upload_batch(&self.client, &self.placement, &batch)?;
        let metrics = step.step(&mut self.state, &uploaded, lr as f32)?;
        self.step += 1;
        Ok(SftReport {
            step: self.step,
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: lr,
            tokens: batch.tokens,
        })
    }

    /// The mean NLL of `examples`' completion tokens under the current
    /// weights (the log-prob program, `micro_batch_rows` pairs at a time).
    pub fn evaluate(&self, examples: &[SftExample]) -> Result<SftEval> {
        self.state
            .with_params_on_one_device(&self.client, |params| self.score(params, examples))
    }

    /// [`SftLoop::evaluate`] under `params` on the client's first device.
    fn score(&self, params: &[&Buffer], examples: &[SftExample]) -> Result<SftEval> {
        let (mut nll, mut tokens) = (0.0f64, 0usize);
        for chunk in examples.chunks(self.config.micro_batch_rows) {
            // Padded to full chunks with copies of the first, so one program serves.
            let mut sequences: Vec<Vec<u32>> = chunk
                .iter()
                .map(|e| [e.prompt.clone(), e.completion.clone()].concat())
                .collect();
            sequences.resize(self.config.micro_batch_rows, sequences[0].clone());
            let stats = self.scorer.run(params, &sequences)?;
            for (e, s) in chunk.iter().zip(&stats) {
                let first = e.prompt.len() - 1;
                nll -= s.logprobs[first..first + e.completion.len()]
                    .iter()
                    .map(|&x| f64::from(x))
                    .sum::<f64>();
                tokens += e.completion.len();
            }
        }
        Ok(SftEval {
            loss: nll / tokens.max(1) as f64,
            tokens,
        })
    }

    /// Writes `OUT/checkpoint-<step>/` (weights, optimizer state, loop state), atomically.
    pub fn checkpoint(&self, out: &Path, config: &ModelConfig, tokenizer: &Tokenizer) -> Result<PathBuf> {
        TrainingCheckpoint {
            step: self.step as u64,
            model: (config, tokenizer),
            decoder: &self.decoder,
            optimizer: &self.config.optimizer,
            state: &self.state,
            loop_state: serde_json::to_value(LoopState {
                step: self.step as u64,
                sampler: self.sampler.state(),
                data_seed: self.data_seed,
            })
            .expect("the loop state serializes"),
        }
        .save(out)
    }

    /// Train-step programs compiled so far.
    pub fn compiled_steps(&self) -> usize {
        self.steps.len()
    }

    /// The current parameters as named f32 host tensors (the decoder's
    /// order), gathered from their shards.
    pub fn host_params(&self) -> Result<Vec<(String, HostTensor)>> {
        self.state.host_params(&self.decoder)
    }

    /// Device bytes of parameters and optimizer state held by each of the
    /// learner's devices.
    pub fn state_bytes_per_device(&self) -> Vec<usize> {
        self.state.device_bytes()
    }
}
