//! A whole run composed from its config: [`Run::grpo`] and [`Run::sft`]
//! open the model (or the checkpoint a resumed run continues from), load
//! the data, build the rollout fleet and the learner's mesh, and make the
//! [`Trainer`]; [`Run::train`] then runs its steps up to `max_steps`,
//! calling the hooks ([`crate::hooks`]) around each. Front ends (the CLI,
//! tests) parse a config, build a run, add their hooks and train.
//!
//! A new run refuses an output folder that already holds one; `resume`
//! continues from the folder's newest checkpoint exactly (weights,
//! optimizer state, data position; later metrics lines and rollout parts
//! are dropped, since the run makes them again).
//!
//! With a `[lora]` section the policy is the model with adapters: new ones
//! from the section's seed, or a checkpoint's (an adapter folder, over the
//! model's own weights); engines are built on the model's weights and take
//! the merged policy from the learner before the first step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use grpo_model::chat::ChatTemplate;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::{upload_parameters, upload_tensors};
use grpo_model::lora::{ADAPTER_CONFIG_FILE, AdapterFolder, LoraConfig, WithAdapters, new_adapters};
use grpo_model::pretrained::Pretrained;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::{HostTensor, SaveOptions, WeightSource};
use grpo_reward::RewardPool;
use grpo_rollout::engine::EngineConfig;
use grpo_worker::AuthToken;
use grpo_xla::trace::Mesh;
use grpo_xla::{Buffer, Client, ElementType};
use serde_json::{Map, Value};

use crate::checkpoint::{self, LoadedCheckpoint, SavedModel, save_model};
use crate::choices::{self, ChoiceRecord, ChoiceRequest};
use crate::collect::{EncodedPrompt, EpisodeSetup, PromptEncoder};
use crate::config::sft::SftRunConfig;
use crate::config::{ActivationCheckpointing, CheckpointSection, LoraSection, ModelSection, RunConfig};
use crate::data::{Example, Prompt, load_examples, split};
use crate::error::{Error, Result};
use crate::fleet::{EngineParts, FleetPlan};
use crate::grpo::{GrpoConfig, GrpoParts, GrpoTask};
use crate::hooks::{Checkpoints, Evaluation, FinalModel, Hook, MetricsLog, Plot, RolloutFile, RunContext};
use crate::probe::{Phase, ProbeShape};
use crate::schedule::Schedule;
use crate::sft::{SftConfig, SftParts, SftTask, encode_examples};
use crate::tracking::Reporting;
use crate::trainer::{StepRecord, Task, Trainer};

/// A run: its trainer, output folder and length, and the hooks its config asks for.
pub struct Run<T: Task> {
    trainer: Trainer<T>,
    out: PathBuf,
    max_steps: usize,
    model: (ModelConfig, Arc<Tokenizer>),
    /// The model's name or path, as the config gives it.
    model_name: String,
    resumed_from: Option<PathBuf>,
    eval_every: usize,
    checkpoints: Checkpoints,
    /// Whether the task samples completions (a rollout log and a reward plot).
    samples: bool,
    /// What is reported besides `metrics.jsonl`.
    reporting: Option<Reporting>,
    /// How the policy's folders are written.
    save: SaveOptions,
}

/// The model a run trains and where it starts: the model's own weights,
/// or a checkpoint's; with adapters, new ones or a checkpoint's.
struct Start {
    model: Pretrained,
    name: String,
    tokenizer: Arc<Tokenizer>,
    /// The adapters' settings, when adapters train.
    lora: Option<LoraConfig>,
    /// The adapters the policy starts from (empty without adapters).
    adapters: BTreeMap<String, HostTensor>,
    /// The dtype the learner holds the frozen base in (f32 without adapters).
    base_dtype: ElementType,
    /// The adapters' dropout while training and the seed of its masks.
    dropout: (f64, u64),
    checkpoint: Option<Resumed>,
}

/// What reading a checkpoint folder found.
enum Found {
    /// Its weights (`None` for adapters), adapters and training state.
    Readable(
        Option<Box<dyn WeightSource>>,
        BTreeMap<String, HostTensor>,
        LoadedCheckpoint,
    ),
    /// A checkpoint of another model or adapters: why.
    Foreign(String),
}

/// The chat template file at `path`, checked to compile.
fn read_chat_template(path: &Path) -> Result<String> {
    let bad = |message: String| Error::Config {
        field: "model.chat_template",
        message: format!("{}: {message}", path.display()),
    };
    let source = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    ChatTemplate::new(source.as_str()).map_err(|e| bad(format!("not a valid chat template: {e}")))?;
    Ok(source)
}

/// A checkpoint read back: its folder, weights (a model folder's; `None`
/// for an adapter folder, whose tensors become [`Start::adapters`]) and
/// training state.
type Resumed = (PathBuf, Option<Box<dyn WeightSource>>, LoadedCheckpoint);

impl Start {
    /// Opens model `name` for a run in `out` (with the adapters `lora`
    /// asks for), and with `resume` the newest readable checkpoint there
    /// (refusing a new run in a folder that holds one).
    fn open(section: &ModelSection, lora: Option<&LoraSection>, out: &Path, resume: bool) -> Result<Start> {
        let name = section.name.as_str();
        let candidates = resume_candidates(out, resume)?;
        let model = Pretrained::open(name)?;
        let mut tokenizer = model.tokenizer.clone().ok_or_else(|| Error::Config {
            field: "model.name",
            message: format!("`{name}` has no tokenizer: use a folder with tokenizer.json, or a GGUF file"),
        })?;
        if let Some(path) = &section.chat_template {
            tokenizer = tokenizer.with_chat_template(read_chat_template(path)?);
        }
        let tokenizer = Arc::new(tokenizer);
        let seed = lora.map_or(0, |l| l.seed);
        let dropout = (lora.map_or(0.0, |l| l.dropout), seed);
        let base_dtype = lora.map_or(ElementType::F32, |l| l.base_dtype.element_type());
        let lora = lora.map(LoraSection::lora);
        let layers = match &lora {
            Some(lora) => lora.layers(&model.config).map_err(|e| Error::Config {
                field: "lora.target_modules",
                message: e.to_string(),
            })?,
            None => Vec::new(),
        };
        let (checkpoint, adapters) = match Start::first_readable(&model, name, candidates, lora.as_ref())? {
            Some((resumed, adapters)) => (Some(resumed), adapters),
            None => match &lora {
                Some(lora) => (None, new_adapters(&layers, lora.rank, seed)?),
                None => (None, BTreeMap::new()),
            },
        };
        Ok(Start {
            model,
            name: name.to_string(),
            tokenizer,
            lora,
            adapters,
            base_dtype,
            dropout,
            checkpoint,
        })
    }

    /// The policy's weights for the learner of `decoder` (the start's
    /// decoder) on the client's first device: f32, but for a frozen base
    /// under adapters, which is uploaded in [`Start::base_dtype`].
    fn upload_policy(&self, client: &Client, decoder: &Decoder) -> Result<Vec<Buffer>> {
        let (device, weights) = (client.device(0)?, self.weights());
        let mut params = upload_tensors(client, device, decoder.base_parameters(), &weights, self.base_dtype)?;
        params.extend(upload_tensors(
            client,
            device,
            decoder.adapter_parameters(),
            &weights,
            ElementType::F32,
        )?);
        Ok(params)
    }

    /// The policy's decoder: the model's, with the adapters when they train.
    fn decoder(&self) -> Result<Decoder> {
        let config = self.model.config.clone();
        let (dropout, seed) = self.dropout;
        Ok(match &self.lora {
            Some(lora) => Decoder::with_adapters(config, lora.clone())?.with_adapter_dropout(dropout, seed)?,
            None => Decoder::new(config),
        })
    }

    /// The decoder a train step runs: its layer checkpoints as
    /// `checkpointing` says, and the load-balancing loss's coefficient
    /// `aux` when given (the model's own otherwise).
    fn trained_decoder(&self, checkpointing: ActivationCheckpointing, aux: Option<f64>) -> Result<Decoder> {
        let decoder = self.decoder()?.with_layer_checkpoints(checkpointing.per_layer());
        Ok(match aux {
            Some(coef) => decoder.with_router_aux_loss_coef(coef)?,
            None => decoder,
        })
    }

    /// The newest of `candidates` (newest first) that reads back as a
    /// checkpoint of `model` (of its adapters `lora`, when they train),
    /// with its adapters: an unreadable one is set aside, saying so, and
    /// the one before it taken (none left: the run starts again from step
    /// 0); a checkpoint of another model or other adapters is refused.
    fn first_readable(
        model: &Pretrained,
        name: &str,
        candidates: Vec<PathBuf>,
        lora: Option<&LoraConfig>,
    ) -> Result<Option<(Resumed, BTreeMap<String, HostTensor>)>> {
        let any = !candidates.is_empty();
        for dir in candidates {
            match Start::read_checkpoint(model, name, &dir, lora) {
                Ok(Found::Foreign(message)) => return Err(Error::Output { dir, message }),
                Ok(Found::Readable(weights, adapters, state)) => return Ok(Some(((dir, weights, state), adapters))),
                Err(e) => {
                    let aside = checkpoint::set_aside(&dir)?;
                    tracing::warn!(
                        "{} is unreadable ({e}): set aside as {}",
                        dir.display(),
                        aside.display()
                    );
                }
            }
        }
        if any {
            tracing::warn!("--resume: no checkpoint reads back: the run starts again from step 0");
        }
        Ok(None)
    }

    /// Reads checkpoint folder `dir` of a run of `model` (called `name`),
    /// whose adapters are `lora` when they train.
    fn read_checkpoint(model: &Pretrained, name: &str, dir: &Path, lora: Option<&LoraConfig>) -> Result<Found> {
        let holds_adapters = dir.join(ADAPTER_CONFIG_FILE).is_file();
        if holds_adapters != lora.is_some() {
            return Ok(Found::Foreign(if holds_adapters {
                "a checkpoint of LoRA adapters: resume it with the [lora] section it was trained with".to_string()
            } else {
                "a checkpoint of the whole model: resume it without a [lora] section".to_string()
            }));
        }
        let Some(lora) = lora else {
            let saved = Pretrained::open_dir(dir)?;
            if saved.config != model.config {
                return Ok(Found::Foreign(format!("a checkpoint of another model than `{name}`")));
            }
            return Ok(Found::Readable(
                Some(saved.weights),
                BTreeMap::new(),
                checkpoint::load(dir)?,
            ));
        };
        let folder = AdapterFolder::read(dir, &model.config)?;
        if !folder.lora.same_adapters(lora, &model.config) {
            let config = &model.config;
            return Ok(Found::Foreign(format!(
                "a checkpoint of other adapters ({}) than the [lora] section's ({})",
                folder.lora.describe(config),
                lora.describe(config)
            )));
        }
        Ok(Found::Readable(None, folder.tensors, checkpoint::load(dir)?))
    }

    /// The checkpoint's training state, when resuming.
    fn checkpoint(&self) -> Option<&LoadedCheckpoint> {
        self.checkpoint.as_ref().map(|(_, _, state)| state)
    }

    /// The weights the policy starts from (with its adapters, when they train).
    fn weights(&self) -> WithAdapters<'_> {
        let base = match &self.checkpoint {
            Some((_, Some(weights), _)) => weights.as_ref(),
            _ => self.model.weights.as_ref(),
        };
        WithAdapters {
            base,
            adapters: &self.adapters,
        }
    }

    /// `weights` as f32 parameters of `decoder` on the client's first device.
    fn upload(client: &Client, decoder: &Decoder, weights: &dyn WeightSource) -> Result<Vec<Buffer>> {
        Ok(upload_parameters(
            client,
            client.device(0)?,
            decoder,
            weights,
            ElementType::F32,
        )?)
    }
}

/// Refuses a run whose longest prompt (of `rows`, as `encoder` renders
/// it) and `completion_tokens` more do not fit `max_model_len`: the step
/// that drew it would fail. Returns the longest prompt's length in tokens.
fn check_prompts<'a>(
    encode: impl Fn(&Prompt) -> Result<EncodedPrompt>,
    rows: impl Iterator<Item = &'a Example>,
    max_model_len: usize,
    completion_tokens: usize,
) -> Result<usize> {
    let mut longest: Option<(usize, String)> = None;
    for row in rows {
        let prompt = encode(&row.prompt)?;
        if longest.as_ref().is_none_or(|(n, _)| prompt.ids.len() > *n) {
            longest = Some((prompt.ids.len(), prompt.text));
        }
    }
    match longest {
        Some((tokens, text)) if tokens + completion_tokens > max_model_len => {
            let start: String = text.chars().take(60).collect();
            Err(Error::Config {
                field: "rollout.max_model_len",
                message: format!(
                    "the longest prompt ({start:?}…) is {tokens} tokens: with max_completion_tokens = \
                     {completion_tokens} it does not fit {max_model_len} (max_model_len, capped by the model's \
                     positions); raise max_model_len, lower max_completion_tokens, or shorten the prompt"
                ),
            })
        }
        longest => Ok(longest.map_or(0, |(tokens, _)| tokens)),
    }
}

/// The in-process engines' context: what the run's longest prompt and
/// completion need, rounded up to a power of two (the engine's own bucket
/// size, so its programs are those of a longer context), at most
/// `max_model_len`. Their KV cache is sized by it.
fn engine_context(longest_prompt: usize, completion_tokens: usize, max_model_len: usize) -> usize {
    (longest_prompt + completion_tokens)
        .next_power_of_two()
        .clamp(2, max_model_len.max(2))
}

/// The process's peak resident memory so far (Linux's `VmHWM`), if known.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Warns when the run is shorter than its learning-rate warm-up.
fn warn_if_cut_short(schedule: &Schedule) {
    if let Some(warning) = schedule.cut_short() {
        tracing::warn!("{warning}");
    }
}

/// The checkpoints a run in `out` may start from, newest first: none for
/// a new run, which refuses a folder holding a run's output (a checkpoint,
/// a logged step, a final folder) — what a start that failed before its
/// first step leaves does not count. With `resume`, a folder whose run
/// logged steps but left no checkpoint starts over from step 0, saying so.
pub fn resume_candidates(out: &Path, resume: bool) -> Result<Vec<PathBuf>> {
    let checkpoints = checkpoint::newest_first(out);
    if resume {
        if checkpoints.is_empty() {
            if !MetricsLog::path(out).exists() {
                return Err(Error::Output {
                    dir: out.to_path_buf(),
                    message: "--resume: no run here to continue; start the run without --resume".to_string(),
                });
            }
            tracing::warn!(
                "--resume: no checkpoint in {}: the run starts again from step 0",
                out.display()
            );
        }
        return Ok(checkpoints);
    }
    if !checkpoints.is_empty() || logged_steps(&MetricsLog::path(out)) || FinalModel::dir(out).exists() {
        return Err(Error::Output {
            dir: out.to_path_buf(),
            message: "already holds a run: pass --resume to continue it, or --out DIR to start another".to_string(),
        });
    }
    Ok(checkpoints)
}

/// Whether the metrics log at `path` holds a line of a step after the start.
fn logged_steps(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .any(|line| line["step"].as_u64().is_some_and(|step| step > 0))
    })
}

impl Run<GrpoTask> {
    /// GRPO fine-tuning as `config` says, scored by `rewards`, on `client`'s
    /// devices: the learner on the first (or a mesh of the first few), the
    /// in-process engines and workers of `[rollout]`; each sample a
    /// multi-turn episode when `episodes` is given (the `[environment]`
    /// table), else one completion; continuing the run in its output folder
    /// with `resume`.
    pub fn grpo(
        config: &RunConfig,
        rewards: RewardPool,
        episodes: Option<EpisodeSetup>,
        client: &Client,
        resume: bool,
    ) -> Result<Self> {
        let plan = FleetPlan::of(&config.rollout);
        let out = config.logging.out.clone();
        let start = Start::open(&config.model, config.lora.as_ref(), &out, resume)?;
        let (train, eval) = config.data.load()?;
        let (r, t) = (&config.rollout, &config.trainer);
        let max_steps = t.steps(train.len(), r.prompts_per_step);
        let max_model_len = r.max_model_len.min(start.model.config.max_positions);
        let encoder = PromptEncoder::new(start.tokenizer.clone())?;
        let tools = episodes.as_ref().map(EpisodeSetup::tools);
        let encode = |prompt: &Prompt| match &tools {
            Some(tools) => encoder.encode_episode(prompt, tools),
            None => encoder.encode(prompt),
        };
        let longest_prompt = check_prompts(
            encode,
            train.iter().chain(&eval),
            max_model_len,
            r.max_completion_tokens,
        )?;
        let slots = (r.group_size * r.prompts_per_step).div_ceil(plan.engines);
        let model = &start.model.config;
        let request = ChoiceRequest {
            compute_dtype: t.compute_dtype,
            engine_dtype: plan.in_process.then_some(r.dtype),
            train: ProbeShape::new(
                Phase::Train,
                t.micro_batch_size * (longest_prompt + r.max_completion_tokens),
                model.hidden_size,
                model.intermediate_size,
            ),
            engine: ProbeShape::new(Phase::Engine, slots, model.hidden_size, model.intermediate_size),
        };
        let recorded = choices::recorded(&out, start.checkpoint(), resume)?;
        let choices = ChoiceRecord::decide(client, &request, recorded, &grpo_xla::pjrt::cache_dir())?;
        let grpo = GrpoConfig::of(config, max_steps, choices.choices);
        warn_if_cut_short(&grpo.schedule);
        let decoder = start.trained_decoder(t.activation_checkpointing, t.router_aux_loss_coef)?;
        // The policy starts from the checkpoint when resuming; the KL's
        // reference is always the model (with adapters, the learner's own base).
        let reference = (grpo.loss.beta > 0.0 && start.lora.is_none())
            .then(|| Start::upload(client, &decoder, start.model.weights.as_ref()))
            .transpose()?;
        // Engines are built on the policy's weights without adapters (see the module doc).
        let engine_decoder = decoder.base();
        let engine = EngineParts {
            client,
            decoder: &engine_decoder,
            weights: start.weights().base,
            tokenizer: start.tokenizer.clone(),
            config: EngineConfig {
                max_num_seqs: slots,
                max_model_len: engine_context(longest_prompt, grpo.max_completion_tokens, max_model_len),
                dtype: choices.choices.engine_dtype.unwrap_or_default().element_type(),
                ..EngineConfig::default()
            },
        };
        let token_file = config.rollout.worker_token_file.as_deref();
        let fleet = plan.build(&engine, || {
            AuthToken::from_file_or_env(token_file, "rollout.worker_token_file").map_err(|e| Error::Config {
                field: "rollout.worker_token_file",
                message: e.to_string(),
            })
        })?;
        let parts = GrpoParts {
            client: client.clone(),
            params: start.upload_policy(client, &decoder)?,
            decoder,
            tokenizer: start.tokenizer.clone(),
            fleet,
            rewards,
            data: train,
            eval,
            data_seed: config.data.seed,
            mesh: Mesh::new(client, config.trainer.parallelism(client.devices().len())?)?,
            reference,
            // A step's episodes all run at once; an evaluation's, that many at a time.
            episodes: episodes.map(|e| e.with_concurrency(r.group_size * r.prompts_per_step)),
        };
        let trainer = Trainer::grpo(parts, grpo, start.checkpoint())?;
        let run = Run::assemble(
            trainer,
            start,
            (out, max_steps, t.eval_every),
            (&config.checkpoint, Reporting::of(&config.logging)?),
            true,
        )?;
        choices.write(&run.out)?;
        Ok(run)
    }
}

impl Run<SftTask> {
    /// Supervised fine-tuning as `config` says on `client`'s devices;
    /// continuing the run in its output folder with `resume`.
    pub fn sft(config: &SftRunConfig, client: &Client, resume: bool) -> Result<Self> {
        let out = config.logging.out.clone();
        let start = Start::open(&config.model, config.lora.as_ref(), &out, resume)?;
        let rows = load_examples(&config.data.path, &config.data.split, &config.data.prompt_column)?;
        let (train, eval) = split(rows, config.data.eval_size, config.data.seed)?;
        let max_steps = config.trainer.steps(train.len());
        let mut sft = SftConfig::of(config, max_steps);
        warn_if_cut_short(&sft.schedule);
        sft.max_length = sft.max_length.min(start.model.config.max_positions);
        let column = &config.data.completion_column;
        let t = &config.trainer;
        let decoder = start.trained_decoder(t.activation_checkpointing, t.router_aux_loss_coef)?;
        let parts = SftParts {
            client: client.clone(),
            data: encode_examples(&start.tokenizer, &train, column, sft.max_length)?,
            eval: encode_examples(&start.tokenizer, &eval, column, sft.max_length)?,
            data_seed: config.data.seed,
            params: start.upload_policy(client, &decoder)?,
            decoder,
            mesh: Mesh::new(client, config.trainer.parallelism(client.devices().len())?)?,
        };
        let trainer = Trainer::sft(parts, sft, start.checkpoint())?;
        Run::assemble(
            trainer,
            start,
            (out, max_steps, t.eval_every),
            (&config.checkpoint, Reporting::of(&config.logging)?),
            false,
        )
    }
}

impl<T: Task> Run<T> {
    /// The run of `trainer` from `start`, writing to `out` for `max_steps`
    /// steps with evaluations every `eval_every`, `checkpoints` and
    /// `reporting`; a task that `samples` completions gets a
    /// rollout log and a reward plot. Creates the output folder, now that
    /// everything else is ready.
    fn assemble(
        trainer: Trainer<T>,
        start: Start,
        (out, max_steps, eval_every): (PathBuf, usize, usize),
        (checkpoints, reporting): (&CheckpointSection, Option<Reporting>),
        samples: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(&out).map_err(|e| Error::Output {
            dir: out.clone(),
            message: format!("cannot create: {e}"),
        })?;
        Ok(Run {
            trainer,
            out,
            max_steps,
            model: (start.model.config, start.tokenizer),
            model_name: start.name,
            resumed_from: start.checkpoint.map(|(dir, _, _)| dir),
            eval_every,
            checkpoints: Checkpoints {
                every: checkpoints.every,
                keep_last: checkpoints.keep_last,
            },
            samples,
            reporting,
            save: checkpoints.save_options()?,
        })
    }

    /// The hooks the config asks for, in order: evaluation, the metrics
    /// log, the reports (trackers, completions tables), the rollout log
    /// (tasks that sample), checkpoints, the final folder and the plot
    /// (tasks that sample).
    pub fn standard_hooks(&self) -> Vec<Box<dyn Hook>> {
        let mut hooks: Vec<Box<dyn Hook>> = vec![
            Box::new(Evaluation { every: self.eval_every }),
            Box::new(MetricsLog::default()),
        ];
        if let Some(reporting) = &self.reporting {
            hooks.extend(reporting.hooks());
        }
        if self.samples {
            hooks.push(Box::new(RolloutFile::default()));
        }
        hooks.push(Box::new(Checkpoints { ..self.checkpoints }));
        hooks.push(Box::new(FinalModel));
        if self.samples {
            hooks.push(Box::new(Plot));
        }
        hooks
    }

    /// Runs the steps left up to `max_steps`, calling `hooks` around each
    /// (a new run first passes them a step-0 record).
    pub fn train(&mut self, hooks: &mut [Box<dyn Hook>]) -> Result<()> {
        for hook in hooks.iter_mut() {
            hook.on_start(self)?;
        }
        if self.trainer.steps_done() == 0 {
            self.pass(hooks, &mut StepRecord::default())?;
        }
        while self.trainer.steps_done() < self.max_steps {
            let started = Instant::now();
            let mut record = self.trainer.step()?;
            let learner = self.trainer.learner();
            let metrics = &mut record.metrics;
            metrics.insert("step_time".into(), started.elapsed().as_secs_f64().into());
            metrics.insert("compiled_train_programs".into(), learner.compiled_steps().into());
            metrics.insert("learner_state_bytes".into(), learner.state_bytes_per_device().into());
            metrics.insert("live_buffer_bytes".into(), learner.live_buffer_bytes().into());
            if let Some(peak) = peak_resident_bytes() {
                metrics.insert("peak_rss_bytes".into(), peak.into());
            }
            self.pass(hooks, &mut record)?;
        }
        for hook in hooks.iter_mut() {
            hook.on_end(self)?;
        }
        Ok(())
    }

    /// Hands `record` to each hook in turn.
    fn pass(&mut self, hooks: &mut [Box<dyn Hook>], record: &mut StepRecord) -> Result<()> {
        hooks.iter_mut().try_for_each(|hook| hook.on_step(self, record))
    }

    /// The output folder.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// The run's last step.
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// The model its policy is saved as.
    fn saved_model(&self) -> SavedModel<'_> {
        SavedModel {
            config: &self.model.0,
            tokenizer: &self.model.1,
            name: &self.model_name,
            options: self.save,
        }
    }
}

impl<T: Task> RunContext for Run<T> {
    fn out(&self) -> &Path {
        &self.out
    }

    fn max_steps(&self) -> usize {
        self.max_steps
    }

    fn steps_done(&self) -> usize {
        self.trainer.steps_done()
    }

    fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    fn evaluate(&mut self) -> Result<Option<Map<String, Value>>> {
        self.trainer.evaluate()
    }

    fn checkpoint(&self) -> Result<PathBuf> {
        self.trainer.checkpoint(&self.out, self.saved_model())
    }

    fn save_model(&self, dir: &Path) -> Result<()> {
        save_model(dir, self.saved_model(), &self.trainer.learner().saved_policy()?)
    }
}

#[cfg(test)]
mod tests {
    use super::{engine_context, read_chat_template};

    #[test]
    fn a_chat_template_file_must_read_and_compile() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.jinja");
        std::fs::write(&good, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        assert!(read_chat_template(&good).unwrap().starts_with("{% for"));
        let bad = dir.path().join("bad.jinja");
        std::fs::write(&bad, "{% for m in messages %}").unwrap();
        let missing = dir.path().join("missing.jinja");
        for (path, needle) in [(&bad, "not a valid chat template"), (&missing, "cannot read it")] {
            let message = read_chat_template(path).unwrap_err().to_string();
            assert!(
                message.contains("model.chat_template") && message.contains(&path.display().to_string()),
                "{message}"
            );
            assert!(message.contains(needle), "{message}");
        }
    }

    #[test]
    fn the_engine_context_is_the_need_rounded_up_to_a_power_of_two_within_the_limit() {
        assert_eq!(engine_context(45, 16, 128), 64);
        assert_eq!(engine_context(48, 16, 128), 64);
        assert_eq!(engine_context(49, 16, 128), 128);
        assert_eq!(engine_context(100, 50, 128), 128, "never above max_model_len");
        assert_eq!(engine_context(100, 50, 150), 150);
        assert_eq!(engine_context(0, 1, 128), 2, "an engine needs 2 positions");
    }
}
