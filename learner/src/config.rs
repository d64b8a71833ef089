//! The run config of `grpo run`: one TOML file whose sections compose the
//! components' settings. Every field has a documented default; unknown keys
//! are refused naming them, and invalid values are refused before any work
//! starts. The `[[reward]]` and `[reward_pool]` tables belong to
//! grpo-reward and are read there. `grpo sft`'s config ([`sft`]) shares
//! the `[model]`, `[optimizer]` and `[checkpoint]` sections.

pub mod sft;

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use grpo_reward::config::{MAX_SECONDS, duration};
use grpo_rollout::worker::{PushOptions, WireDtype};
use grpo_xla::ElementType;
use grpo_xla::trace::{AdamW, Parallelism};

use crate::advantage::ScaleRewards;
use crate::data::{Example, load_jsonl, split, to_chat};
use crate::error::{Error, Result};
use crate::fleet::{FleetConfig, FleetPlan};
use crate::grpo::GrpoConfig;
use crate::loss::{GrpoLoss, Importance, LossType};
use crate::schedule::{Decay, Schedule};

/// The whole run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The policy.
    pub model: ModelSection,
    /// The prompts.
    pub data: DataSection,
    /// Generation.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// The GRPO objective.
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// AdamW and the learning rate.
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Steps and batches.
    #[serde(default)]
    pub trainer: TrainerSection,
    /// Checkpoints.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Outputs.
    #[serde(default)]
    pub logging: LoggingSection,
}

/// `[model]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`. Required.
    pub name: String,
}

/// `[data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A JSONL file of prompts, relative to the config file. Required.
    pub path: PathBuf,
    /// The column holding the prompt (text or chat turns). Default "prompt".
    #[serde(default = "default_prompt_column")]
    pub prompt_column: String,
    /// Text prompts become one user turn (rendered with the chat template). Default false.
    #[serde(default)]
    pub as_chat: bool,
    /// A system turn put before chat prompts that have none. Default none.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// A JSONL file of eval prompts (same columns), relative to the config
    /// file; without it `eval_size` rows of `path` are held out. Default none.
    #[serde(default)]
    pub eval_path: Option<PathBuf>,
    /// Rows held out for evaluation (with `eval_path`: its first rows; 0 = all). Default 0.
    #[serde(default)]
    pub eval_size: usize,
    /// The seed of the split and of the prompt order. Default 0.
    #[serde(default)]
    pub seed: u64,
}

impl DataSection {
    /// The train and eval rows.
    pub fn load(&self) -> Result<(Vec<Example>, Vec<Example>)> {
        let read = |path: &Path| -> Result<Vec<Example>> {
            let rows = load_jsonl(path, &self.prompt_column)?;
            Ok(to_chat(rows, self.as_chat, self.system_prompt.as_deref()))
        };
        let rows = read(&self.path)?;
        match &self.eval_path {
            Some(path) => {
                let mut eval = read(path)?;
                if self.eval_size > 0 {
                    eval.truncate(self.eval_size);
                }
                Ok((rows, eval))
            }
            None => split(rows, self.eval_size, self.seed),
        }
    }
}

fn default_prompt_column() -> String {
    "prompt".to_string()
}

/// `[rollout]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Samples per prompt (G ≥ 2). Default 8.
    #[serde(alias = "num_generations")]
    pub group_size: usize,
    /// Prompts per step. Default 8.
    pub prompts_per_step: usize,
    /// Most completion tokens. Default 32.
    #[serde(alias = "max_completion_length")]
    pub max_completion_tokens: usize,
    /// Sampling temperature (> 0); the learner scores the samples at it
    /// too (TRL's semantics). Default 1.0.
    pub temperature: f32,
    /// Longest prompt + completion. Default 256.
    pub max_model_len: usize,
    /// The in-process engine's weight and KV-cache dtype: "f32" (default)
    /// or "bf16" (about twice the decode speed; the loss's importance
    /// correction covers the rollout/learner mismatch).
    pub dtype: String,
    /// The seed of the rollouts' sampling. Default 0.
    pub seed: u32,
    /// Rollout workers (`grpo worker`) to generate on, as `host:port` or
    /// URLs; they need not be up when the run starts. Default none.
    pub workers: Vec<String>,
    /// `host:port` where the learner takes registrations of workers
    /// started with `grpo worker --learner`; port 0 picks a free one.
    /// Default none.
    pub listen: Option<String>,
    /// Whether the in-process engines generate too. Default: only when no
    /// `workers` and no `listen` are given.
    pub in_process: Option<bool>,
    /// In-process engines, one per device of the learner's client (the
    /// first N; on CPU `grpo run --cpu-devices N` makes N). Default 1.
    pub engines: usize,
    /// A file holding the workers' shared token; without it the token comes
    /// from `GRPO_WORKER_TOKEN`. Relative to the config file.
    pub worker_token_file: Option<PathBuf>,
    /// How weights travel to workers: "f32" (exact; default) or "bf16" (half the bytes).
    pub weight_dtype: String,
    /// Seconds between two Health calls to each worker. Default 2.
    pub heartbeat_s: f64,
    /// Seconds a worker may leave a Health call unanswered before it is
    /// declared down and its groups go to other workers. Default 10.
    pub worker_timeout_s: f64,
    /// Seconds generation waits with no worker ready before the run stops.
    /// Default 600.
    pub worker_wait_s: f64,
    /// How many versions behind the learner a batch's policy may be: 0
    /// (default) is synchronous on-policy; k ≥ 1 generates the next batches
    /// while the learner trains, dropping samples older than k versions.
    pub max_staleness: usize,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            group_size: 8,
            prompts_per_step: 8,
            max_completion_tokens: 32,
            temperature: 1.0,
            max_model_len: 256,
            dtype: "f32".to_string(),
            seed: 0,
            workers: Vec::new(),
            listen: None,
            in_process: None,
            engines: 1,
            worker_token_file: None,
            weight_dtype: "f32".to_string(),
            heartbeat_s: 2.0,
            worker_timeout_s: 10.0,
            worker_wait_s: 600.0,
            max_staleness: 0,
        }
    }
}

/// `[algorithm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    /// "dapo" (token mean; default), "grpo" (sequence mean), "dr_grpo".
    pub loss_type: String,
    /// Lower clip range. Default 0.2.
    pub epsilon: f32,
    /// Upper clip range; default = epsilon.
    pub epsilon_high: Option<f32>,
    /// Weight of the k3 KL to the frozen starting policy (0: none, and no
    /// reference is held). Default 0.
    pub beta: f32,
    /// "group" (default), "batch" or "none".
    pub scale_rewards: String,
    /// "token" (truncated IS; default), "sequence" (masking) or "none".
    pub importance: String,
    /// The IS cap. Default 2.0.
    pub importance_cap: f32,
    /// Drop groups whose rewards are all equal before the update (DAPO's
    /// dynamic sampling, without re-sampling). Default false.
    pub dynamic_sampling: bool,
    /// Optimizer steps per generated batch, μ (TRL's name). Default 1.
    pub num_iterations: usize,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        AlgorithmSection {
            loss_type: "dapo".to_string(),
            epsilon: 0.2,
            epsilon_high: None,
            beta: 0.0,
            scale_rewards: "group".to_string(),
            importance: "token".to_string(),
            importance_cap: 2.0,
            dynamic_sampling: false,
            num_iterations: 1,
        }
    }
}

/// `[optimizer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSection {
    /// Peak learning rate. Default 1e-6.
    #[serde(alias = "learning_rate")]
    pub lr: f64,
    /// AdamW weight decay. Default 0.0.
    pub weight_decay: f64,
    /// Warm-up steps. Default 0.
    pub warmup_steps: usize,
    /// "constant" (default), "linear" or "cosine".
    #[serde(alias = "lr_scheduler_type")]
    pub schedule: String,
    /// Global gradient-norm clipping (0 disables). Default 1.0.
    pub max_grad_norm: f64,
}

impl OptimizerSection {
    /// The learning-rate schedule over a run of `max_steps` steps, checked.
    pub fn lr_schedule(&self, max_steps: usize) -> Result<Schedule> {
        let decay = choice(
            "optimizer.schedule",
            &self.schedule,
            &[
                ("constant", Decay::Constant),
                ("linear", Decay::Linear),
                ("cosine", Decay::Cosine),
            ],
        )?;
        let schedule = Schedule {
            lr: self.lr,
            warmup: self.warmup_steps,
            total: max_steps.max(1),
            decay,
        };
        schedule.validate()?;
        Ok(schedule)
    }

    /// AdamW with this weight decay (PyTorch's other defaults).
    pub fn adamw(&self) -> AdamW {
        AdamW {
            weight_decay: self.weight_decay,
            ..AdamW::default()
        }
    }

    /// The clipping threshold (`None` for 0).
    pub fn max_grad_norm(&self) -> Option<f64> {
        (self.max_grad_norm > 0.0).then_some(self.max_grad_norm)
    }
}

impl Default for OptimizerSection {
    fn default() -> Self {
        OptimizerSection {
            lr: 1e-6,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: "constant".to_string(),
            max_grad_norm: 1.0,
        }
    }
}

/// `[trainer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// Steps of the run. Default 100.
    pub max_steps: usize,
    /// Samples per micro-batch. Default 16.
    #[serde(alias = "per_device_train_batch_size")]
    pub micro_batch_size: usize,
    /// Let a group's samples share one copy of their prompt in a row of the
    /// train step when that costs fewer FLOPs (see [`crate::batch`]).
    /// Default true.
    pub share_prompts: bool,
    /// The train step's forward/backward dtype: "f32" (default) or "bf16"
    /// (mixed precision: f32 master weights and AdamW state).
    pub compute_dtype: String,
    /// Greedy eval on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    #[serde(alias = "eval_steps")]
    pub eval_every: usize,
    /// How the learner spans devices: "none" (one device; default), "data"
    /// or "fsdp" (see [`learner_parallelism`]).
    pub parallelism: String,
    /// Devices of an SPMD learner (0: all the client's). Default 0.
    pub devices: usize,
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection {
            max_steps: 100,
            micro_batch_size: 16,
            share_prompts: true,
            compute_dtype: "f32".to_string(),
            eval_every: 10,
            parallelism: "none".to_string(),
            devices: 0,
        }
    }
}

impl TrainerSection {
    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        learner_parallelism(&self.parallelism, self.devices, available)
    }
}

/// A layout over a number of devices.
type Layout = fn(usize) -> Parallelism;

/// Checks `[trainer] parallelism`'s name: `None` for "none", else the
/// layout it names.
pub fn parallelism_kind(kind: &str) -> Result<Option<Layout>> {
    let data: Layout = |devices| Parallelism::DataParallel { devices };
    let fsdp: Layout = |devices| Parallelism::Fsdp { devices };
    choice(
        "trainer.parallelism",
        kind,
        &[("none", None), ("data", Some(data)), ("fsdp", Some(fsdp))],
    )
}

/// The learner's SPMD layout from `[trainer] parallelism` and `devices`
/// on a client of `available` devices: `None` for "none"; "data" (batch
/// rows split over the devices, parameters and AdamW state replicated) or
/// "fsdp" (parameters, gradients and AdamW state split too) over `devices`
/// devices, 0 meaning all of them.
pub fn learner_parallelism(kind: &str, devices: usize, available: usize) -> Result<Option<Parallelism>> {
    let Some(layout) = parallelism_kind(kind)? else {
        return Ok(None);
    };
    let devices = if devices == 0 { available } else { devices };
    if devices < 2 || devices > available {
        return Err(invalid(
            "trainer.devices",
            format!(
                "{devices}: `trainer.parallelism` spans 2 or more of the client's devices and the client has \
                 {available} (on CPU, `--cpu-devices N` makes N)"
            ),
        ));
    }
    Ok(Some(layout(devices)))
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Write `OUT/checkpoint-<step>/` every this many steps and after the
    /// last (0: only the final policy). Default 20.
    #[serde(alias = "save_steps")]
    pub every: usize,
    /// Keep the newest this many checkpoints, deleting older ones (0: all). Default 3.
    #[serde(alias = "save_total_limit")]
    pub keep_last: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 20,
            keep_last: 3,
        }
    }
}

/// `[logging]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingSection {
    /// The output folder (metrics.jsonl, final/), relative to the config file. Default "runs/grpo".
    #[serde(alias = "output_dir")]
    pub out: PathBuf,
}

impl Default for LoggingSection {
    fn default() -> Self {
        LoggingSection {
            out: PathBuf::from("runs/grpo"),
        }
    }
}

/// The error of a bad value of `field`.
pub(crate) fn invalid(field: &'static str, message: String) -> Error {
    Error::Config { field, message }
}

/// The error of a config that is not TOML.
fn not_toml(e: toml::de::Error) -> Error {
    invalid("config", format!("not TOML: {e}"))
}

/// A config's sections from its TOML `table`, an unknown or mistyped key
/// refused naming its path.
fn parse_sections<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let key = e.path().to_string();
        let message = e.into_inner().message().to_string();
        invalid("config", format!("`{key}`: {message}"))
    })
}

/// Applies `section.key=value` overrides (TOML values; anything else a
/// string) to the config text `text`, before it is validated.
pub fn with_overrides(text: &str, overrides: &[String]) -> Result<String> {
    let mut table: toml::Table = text.parse().map_err(not_toml)?;
    for item in overrides {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| invalid("--set", format!("`{item}` is not section.key=value")))?;
        let (section, field) = key
            .split_once('.')
            .ok_or_else(|| invalid("--set", format!("`{key}` is not section.key")))?;
        let parsed: toml::Value = format!("v = {value}")
            .parse::<toml::Table>()
            .map(|mut t| t.remove("v").expect("parsed one key"))
            .unwrap_or_else(|_| toml::Value::String(value.to_string()));
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(invalid("--set", format!("`{section}` is not a section")));
        };
        section_table.insert(field.to_string(), parsed);
    }
    toml::to_string(&table).map_err(|e| invalid("--set", e.to_string()))
}

fn choice<T: Copy>(field: &'static str, value: &str, options: &[(&str, T)]) -> Result<T> {
    options
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            invalid(field, format!("`{value}`; choose one of {}", names.join(", ")))
        })
}

/// A run config in a TOML file: its sections parsed (unknown keys
/// refused naming them), checked, and its relative paths taken from the
/// file's folder.
pub trait ConfigFile: Sized + serde::de::DeserializeOwned {
    /// Top-level tables another parser reads (`grpo run`'s reward tables).
    const FOREIGN_TABLES: &[&str] = &[];

    /// Checks every value and their combinations.
    fn validate(&self) -> Result<()>;

    /// Makes the data and output paths relative to `base`.
    fn rebase(&mut self, base: &Path);

    /// Parses TOML text and validates it.
    fn from_toml_str(text: &str) -> Result<Self> {
        let mut table: toml::Table = text.parse().map_err(not_toml)?;
        for name in Self::FOREIGN_TABLES {
            table.remove(*name);
        }
        let config: Self = parse_sections(table)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text of a config file in folder `base` (relative data
    /// and output paths are taken from there) and validates it.
    fn from_toml_at(text: &str, base: &Path) -> Result<Self> {
        let mut config = Self::from_toml_str(text)?;
        config.rebase(base);
        Ok(config)
    }

    /// Reads `path`; data and output paths become relative to its folder.
    fn from_file(path: &Path) -> Result<Self> {
        Self::from_toml_at(&read_text(path)?, path.parent().unwrap_or(Path::new(".")))
    }
}

/// The text of the config file `path`.
fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::Data {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot read: {e}"),
    })
}

impl ConfigFile for RunConfig {
    const FOREIGN_TABLES: &[&str] = &["reward", "reward_pool"];

    fn validate(&self) -> Result<()> {
        self.grpo()?;
        self.fleet()?;
        self.engine_dtype()?;
        Ok(())
    }

    fn rebase(&mut self, base: &Path) {
        self.data.path = base.join(&self.data.path);
        if let Some(path) = &self.data.eval_path {
            self.data.eval_path = Some(base.join(path));
        }
        if let Some(file) = &self.rollout.worker_token_file {
            self.rollout.worker_token_file = Some(base.join(file));
        }
        self.logging.out = base.join(&self.logging.out);
    }
}

impl RunConfig {
    /// The in-process engine's dtype.
    pub fn engine_dtype(&self) -> Result<ElementType> {
        choice(
            "rollout.dtype",
            &self.rollout.dtype,
            &[("f32", ElementType::F32), ("bf16", ElementType::Bf16)],
        )
    }

    /// The rollout fleet the run generates on, checked.
    pub fn fleet(&self) -> Result<FleetPlan> {
        let r = &self.rollout;
        let dtype = choice(
            "rollout.weight_dtype",
            &r.weight_dtype,
            &[("f32", WireDtype::F32), ("bf16", WireDtype::Bf16)],
        )?;
        let seconds = |field: &'static str, value: f64| {
            duration(value).filter(|_| value > 0.0).ok_or_else(|| {
                invalid(
                    field,
                    format!("{value}: a number of seconds above 0, at most {MAX_SECONDS}"),
                )
            })
        };
        let config = FleetConfig {
            push: PushOptions {
                dtype,
                ..PushOptions::default()
            },
            heartbeat: seconds("rollout.heartbeat_s", r.heartbeat_s)?,
            timeout: seconds("rollout.worker_timeout_s", r.worker_timeout_s)?,
            wait: seconds("rollout.worker_wait_s", r.worker_wait_s)?,
        };
        let listen = r
            .listen
            .as_deref()
            .map(|addr| {
                addr.parse::<SocketAddr>().map_err(|e| {
                    invalid(
                        "rollout.listen",
                        format!("`{addr}` is not IP:port ({e}); e.g. \"0.0.0.0:50050\""),
                    )
                })
            })
            .transpose()?;
        let remote = !r.workers.is_empty() || listen.is_some();
        let in_process = r.in_process.unwrap_or(!remote);
        if !in_process && !remote {
            return Err(invalid(
                "rollout.in_process",
                "false leaves no engine: give rollout.workers or rollout.listen".to_string(),
            ));
        }
        if r.engines == 0 || (r.engines > 1 && !in_process) {
            return Err(invalid(
                "rollout.engines",
                format!(
                    "{}: at least 1, and more only with rollout.in_process = true",
                    r.engines
                ),
            ));
        }
        Ok(FleetPlan {
            config,
            workers: r.workers.clone(),
            listen,
            in_process,
            engines: r.engines,
        })
    }

    /// The loop's settings, checked.
    pub fn grpo(&self) -> Result<GrpoConfig> {
        let r = &self.rollout;
        let a = &self.algorithm;
        let o = &self.optimizer;
        if r.group_size < 2 {
            return Err(invalid("rollout.group_size", format!("{}: at least 2", r.group_size)));
        }
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return Err(invalid(
                "rollout.temperature",
                format!(
                    "{}: must be > 0 (a group's samples must differ; the learner scores them at this temperature)",
                    r.temperature
                ),
            ));
        }
        if r.max_completion_tokens >= r.max_model_len {
            return Err(invalid(
                "rollout.max_completion_tokens",
                format!(
                    "{} leaves no room for a prompt within rollout.max_model_len = {}: lower it or raise max_model_len",
                    r.max_completion_tokens, r.max_model_len
                ),
            ));
        }
        if r.prompts_per_step == 0 || r.max_completion_tokens == 0 || self.trainer.micro_batch_size == 0 {
            return Err(invalid(
                "rollout.prompts_per_step",
                "prompts_per_step, max_completion_tokens and trainer.micro_batch_size must be ≥ 1".to_string(),
            ));
        }
        let loss_type = choice(
            "algorithm.loss_type",
            &a.loss_type,
            &[
                ("dapo", LossType::Dapo),
                ("grpo", LossType::Grpo),
                ("dr_grpo", LossType::DrGrpo),
            ],
        )?;
        let scale_rewards = choice(
            "algorithm.scale_rewards",
            &a.scale_rewards,
            &[
                ("group", ScaleRewards::Group),
                ("batch", ScaleRewards::Batch),
                ("none", ScaleRewards::None),
            ],
        )?;
        let importance = match a.importance.as_str() {
            "none" => Importance::Off,
            "token" => Importance::Token { cap: a.importance_cap },
            "sequence" => Importance::Sequence { cap: a.importance_cap },
            other => {
                return Err(invalid(
                    "algorithm.importance",
                    format!("`{other}`; choose one of token, sequence, none"),
                ));
            }
        };
        let config = GrpoConfig {
            group_size: r.group_size,
            prompts_per_step: r.prompts_per_step,
            max_completion_tokens: r.max_completion_tokens,
            loss: GrpoLoss {
                loss_type,
                epsilon: a.epsilon,
                epsilon_high: a.epsilon_high.unwrap_or(a.epsilon),
                beta: a.beta,
                importance,
                temperature: r.temperature,
            },
            scale_rewards,
            schedule: o.lr_schedule(self.trainer.max_steps)?,
            optimizer: o.adamw(),
            max_grad_norm: o.max_grad_norm(),
            micro_batch_rows: self.trainer.micro_batch_size,
            share_prompts: self.trainer.share_prompts,
            max_tokens: r.max_model_len,
            seed: r.seed,
            dynamic_sampling: a.dynamic_sampling,
            iterations: a.num_iterations,
            max_staleness: r.max_staleness,
            compute: choice(
                "trainer.compute_dtype",
                &self.trainer.compute_dtype,
                &[("f32", ElementType::F32), ("bf16", ElementType::Bf16)],
            )?,
        };
        config.loss.validate()?;
        // The layout's name now; its devices once the client exists.
        parallelism_kind(&self.trainer.parallelism)?;
        if a.num_iterations == 0 {
            return Err(invalid("algorithm.num_iterations", "0: at least 1".to_string()));
        }
        Ok(config)
    }
}
