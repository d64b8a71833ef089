//! The run config of `grpo run`: one TOML file whose sections compose the
//! components' settings. Every field has a documented default; unknown keys
//! are refused naming them, and invalid values are refused before any work
//! starts. The `[[reward]]` and `[reward_pool]` tables belong to
//! grpo-reward and are read there. `grpo sft`'s config ([`sft`]) shares
//! the `[model]`, `[optimizer]` and `[checkpoint]` sections.

mod file;
pub mod sft;
mod values;

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use grpo_xla::trace::{AdamW, Parallelism};

use crate::advantage::ScaleRewards;
use crate::data::{Example, load_jsonl, split, to_chat};
use crate::error::{Error, Result};
use crate::loss::{GrpoLoss, Importance, LossType};
use crate::schedule::{Decay, Schedule};

pub use file::{ConfigFile, with_overrides};
use values::require;
pub use values::{Dtype, ImportanceMode, ParallelismKind, Seconds};

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

/// Most samples per prompt.
pub const MAX_GROUP_SIZE: usize = 1024;
/// Most prompts per step, samples per micro-batch or sequences per SFT step.
pub const MAX_BATCH: usize = 65536;
/// Longest prompt + completion a config may ask for, in tokens (the
/// model's positions cap it further).
pub const MAX_MODEL_LEN: usize = 1 << 20;
/// Most in-process engines, versions of staleness or passes per batch.
pub const MAX_COUNT: usize = 1024;

/// `[rollout]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Samples per prompt, 2 to [`MAX_GROUP_SIZE`]. Default 8.
    #[serde(alias = "num_generations")]
    pub group_size: usize,
    /// Prompts per step, 1 to [`MAX_BATCH`]. Default 8.
    pub prompts_per_step: usize,
    /// Most completion tokens, 1 to `max_model_len - 1`. Default 32.
    #[serde(alias = "max_completion_length")]
    pub max_completion_tokens: usize,
    /// Sampling temperature, above 0 and at most 100; the learner scores
    /// the samples at it too (TRL's semantics). Default 1.0.
    pub temperature: f32,
    /// Longest prompt + completion, 2 to [`MAX_MODEL_LEN`] (and at most
    /// the model's positions). Default 256.
    pub max_model_len: usize,
    /// The in-process engine's weight and KV-cache dtype: "f32" (default)
    /// or "bf16" (about twice the decode speed; the loss's importance
    /// correction covers the rollout/learner mismatch).
    pub dtype: Dtype,
    /// The seed of the rollouts' sampling. Default 0.
    pub seed: u32,
    /// Rollout workers (`grpo worker`) to generate on, as `host:port` or
    /// URLs; they need not be up when the run starts. Default none.
    pub workers: Vec<String>,
    /// `IP:port` where the learner takes registrations of workers
    /// started with `grpo worker --learner` (e.g. "0.0.0.0:50050"); port 0
    /// picks a free one. Default none.
    pub listen: Option<SocketAddr>,
    /// Whether the in-process engines generate too. Default: only when no
    /// `workers` and no `listen` are given.
    pub in_process: Option<bool>,
    /// In-process engines, one per device of the learner's client (the
    /// first N; on CPU `grpo run --cpu-devices N` makes N), 1 to
    /// [`MAX_COUNT`]. Default 1.
    pub engines: usize,
    /// A file holding the workers' shared token; without it the token comes
    /// from `GRPO_WORKER_TOKEN`. Relative to the config file.
    pub worker_token_file: Option<PathBuf>,
    /// How weights travel to workers: "f32" (exact; default) or "bf16" (half the bytes).
    pub weight_dtype: Dtype,
    /// Seconds between two Health calls to each worker. Default 2.
    pub heartbeat_s: Seconds,
    /// Seconds a worker may leave a Health call unanswered before it is
    /// declared down and its groups go to other workers. Default 10.
    pub worker_timeout_s: Seconds,
    /// Seconds generation waits with no worker ready before the run stops.
    /// Default 600.
    pub worker_wait_s: Seconds,
    /// How many versions behind the learner a batch's policy may be: 0
    /// (default) is synchronous on-policy; k ≥ 1 (at most [`MAX_COUNT`])
    /// generates the next batches while the learner trains, dropping
    /// samples older than k versions.
    pub max_staleness: usize,
}

impl Default for RolloutSection {
    fn default() -> Self {
        let seconds = |s: f64| Seconds::try_from(s).expect("a valid default");
        RolloutSection {
            group_size: 8,
            prompts_per_step: 8,
            max_completion_tokens: 32,
            temperature: 1.0,
            max_model_len: 256,
            dtype: Dtype::F32,
            seed: 0,
            workers: Vec::new(),
            listen: None,
            in_process: None,
            engines: 1,
            worker_token_file: None,
            weight_dtype: Dtype::F32,
            heartbeat_s: seconds(2.0),
            worker_timeout_s: seconds(10.0),
            worker_wait_s: seconds(600.0),
            max_staleness: 0,
        }
    }
}

impl RolloutSection {
    /// Checks the section's values and their combinations.
    fn validate(&self) -> Result<()> {
        require(
            "rollout.group_size",
            (2..=MAX_GROUP_SIZE).contains(&self.group_size),
            self.group_size,
            &format!("GRPO compares 2 to {MAX_GROUP_SIZE} samples of a prompt"),
        )?;
        require(
            "rollout.prompts_per_step",
            (1..=MAX_BATCH).contains(&self.prompts_per_step),
            self.prompts_per_step,
            &format!("1 to {MAX_BATCH}"),
        )?;
        require(
            "rollout.max_model_len",
            (2..=MAX_MODEL_LEN).contains(&self.max_model_len),
            self.max_model_len,
            &format!("2 to {MAX_MODEL_LEN} tokens"),
        )?;
        require(
            "rollout.max_completion_tokens",
            (1..self.max_model_len).contains(&self.max_completion_tokens),
            self.max_completion_tokens,
            &format!(
                "at least 1 and below rollout.max_model_len = {} (which holds the prompt too): lower it or raise \
                 max_model_len",
                self.max_model_len
            ),
        )?;
        require(
            "rollout.temperature",
            self.temperature > 0.0 && self.temperature <= 100.0,
            self.temperature,
            "above 0 and at most 100 (a group's samples must differ; the learner scores them at this temperature)",
        )?;
        require(
            "rollout.max_staleness",
            self.max_staleness <= MAX_COUNT,
            self.max_staleness,
            &format!("at most {MAX_COUNT} versions"),
        )?;
        require(
            "rollout.in_process",
            self.in_process() || !self.workers.is_empty() || self.listen.is_some(),
            "false",
            "that leaves no engine: give rollout.workers or rollout.listen",
        )?;
        require(
            "rollout.engines",
            (1..=MAX_COUNT).contains(&self.engines) && (self.engines == 1 || self.in_process()),
            self.engines,
            &format!("1 to {MAX_COUNT}, and more than 1 only with rollout.in_process = true"),
        )
    }

    /// Whether the in-process engines generate: as set, else only when
    /// there are no workers to call and none registering.
    pub fn in_process(&self) -> bool {
        self.in_process
            .unwrap_or(self.workers.is_empty() && self.listen.is_none())
    }
}

/// `[algorithm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    /// "dapo" (token mean; default), "grpo" (sequence mean), "dr_grpo".
    pub loss_type: LossType,
    /// Lower clip range ε, in (0, 1). Default 0.2.
    pub epsilon: f32,
    /// Upper clip range, above 0 and at most 10; default = epsilon.
    pub epsilon_high: Option<f32>,
    /// Weight of the k3 KL to the frozen starting policy, 0 to 100 (0:
    /// none, and no reference is held). Default 0.
    pub beta: f32,
    /// "group" (default), "batch" or "none".
    pub scale_rewards: ScaleRewards,
    /// "token" (truncated IS; default), "sequence" (masking) or "none".
    pub importance: ImportanceMode,
    /// The IS cap, above 1 and at most 1e6. Default 2.0.
    pub importance_cap: f32,
    /// Drop groups whose rewards are all equal before the update (DAPO's
    /// dynamic sampling, without re-sampling). Default false.
    pub dynamic_sampling: bool,
    /// Optimizer steps per generated batch, μ (TRL's name), 1 to
    /// [`MAX_COUNT`]. Default 1.
    pub num_iterations: usize,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        AlgorithmSection {
            loss_type: LossType::Dapo,
            epsilon: 0.2,
            epsilon_high: None,
            beta: 0.0,
            scale_rewards: ScaleRewards::Group,
            importance: ImportanceMode::Token,
            importance_cap: 2.0,
            dynamic_sampling: false,
            num_iterations: 1,
        }
    }
}

impl AlgorithmSection {
    /// Checks the section's values.
    fn validate(&self) -> Result<()> {
        require(
            "algorithm.epsilon",
            self.epsilon > 0.0 && self.epsilon < 1.0,
            self.epsilon,
            "in (0, 1)",
        )?;
        if let Some(high) = self.epsilon_high {
            require(
                "algorithm.epsilon_high",
                high > 0.0 && high <= 10.0,
                high,
                "above 0 and at most 10",
            )?;
        }
        require(
            "algorithm.beta",
            (0.0..=100.0).contains(&self.beta),
            self.beta,
            "0 to 100",
        )?;
        require(
            "algorithm.importance_cap",
            self.importance_cap > 1.0 && self.importance_cap <= 1e6,
            self.importance_cap,
            "above 1 and at most 1e6",
        )?;
        require(
            "algorithm.num_iterations",
            (1..=MAX_COUNT).contains(&self.num_iterations),
            self.num_iterations,
            &format!("1 to {MAX_COUNT} optimizer steps per batch"),
        )
    }

    /// The loss, scoring at sampling temperature `temperature`.
    pub fn loss(&self, temperature: f32) -> GrpoLoss {
        let cap = self.importance_cap;
        GrpoLoss {
            loss_type: self.loss_type,
            epsilon: self.epsilon,
            epsilon_high: self.epsilon_high.unwrap_or(self.epsilon),
            beta: self.beta,
            importance: match self.importance {
                ImportanceMode::None => Importance::Off,
                ImportanceMode::Token => Importance::Token { cap },
                ImportanceMode::Sequence => Importance::Sequence { cap },
            },
            temperature,
        }
    }
}

/// `[optimizer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSection {
    /// Peak learning rate, above 0 and at most 1. Default 1e-6.
    #[serde(alias = "learning_rate")]
    pub lr: f64,
    /// AdamW weight decay, 0 to 10. Default 0.0.
    pub weight_decay: f64,
    /// Warm-up steps (a run shorter than them has its schedule cut short,
    /// with a warning). Default 0.
    pub warmup_steps: usize,
    /// "constant" (default), "linear" or "cosine".
    #[serde(alias = "lr_scheduler_type")]
    pub schedule: Decay,
    /// Global gradient-norm clipping, 0 (off) to 1e6. Default 1.0.
    pub max_grad_norm: f64,
}

impl OptimizerSection {
    /// Checks the section's values.
    fn validate(&self) -> Result<()> {
        require(
            "optimizer.lr",
            self.lr > 0.0 && self.lr <= 1.0,
            self.lr,
            "above 0 and at most 1",
        )?;
        require(
            "optimizer.weight_decay",
            (0.0..=10.0).contains(&self.weight_decay),
            self.weight_decay,
            "0 to 10",
        )?;
        require(
            "optimizer.max_grad_norm",
            (0.0..=1e6).contains(&self.max_grad_norm),
            self.max_grad_norm,
            "0 (no clipping) to 1e6",
        )
    }

    /// The learning-rate schedule over a run of `max_steps` steps.
    pub fn schedule(&self, max_steps: usize) -> Schedule {
        Schedule {
            lr: self.lr,
            warmup: self.warmup_steps,
            total: max_steps.max(1),
            decay: self.schedule,
        }
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
            schedule: Decay::Constant,
            max_grad_norm: 1.0,
        }
    }
}

/// `[trainer]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// Steps of the run (0: only the evaluation and the final folder). Default 100.
    pub max_steps: usize,
    /// Samples per micro-batch, 1 to [`MAX_BATCH`]. Default 16.
    #[serde(alias = "per_device_train_batch_size")]
    pub micro_batch_size: usize,
    /// Let a group's samples share one copy of their prompt in a row of the
    /// train step when that costs fewer FLOPs (see [`crate::batch`]).
    /// Default true.
    pub share_prompts: bool,
    /// The train step's forward/backward dtype: "f32" (default) or "bf16"
    /// (mixed precision: f32 master weights and AdamW state).
    pub compute_dtype: Dtype,
    /// Greedy eval on the held-out rows before the first step, every this
    /// many steps and after the last (0: never). Default 10.
    #[serde(alias = "eval_steps")]
    pub eval_every: usize,
    /// How the learner spans devices: "none" (one device; default), "data"
    /// or "fsdp" ([`ParallelismKind`]).
    pub parallelism: ParallelismKind,
    /// Devices of an SPMD learner (0: all the client's). Default 0.
    pub devices: usize,
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection {
            max_steps: 100,
            micro_batch_size: 16,
            share_prompts: true,
            compute_dtype: Dtype::F32,
            eval_every: 10,
            parallelism: ParallelismKind::None,
            devices: 0,
        }
    }
}

impl TrainerSection {
    /// Checks the section's values.
    fn validate(&self) -> Result<()> {
        require(
            "trainer.micro_batch_size",
            (1..=MAX_BATCH).contains(&self.micro_batch_size),
            self.micro_batch_size,
            &format!("1 to {MAX_BATCH} samples"),
        )
    }

    /// The learner's SPMD layout on a client of `available` devices.
    pub fn parallelism(&self, available: usize) -> Result<Option<Parallelism>> {
        self.parallelism.layout(self.devices, available)
    }
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

impl ConfigFile for RunConfig {
    const FOREIGN_TABLES: &[&str] = &["reward", "reward_pool"];

    fn validate(&self) -> Result<()> {
        self.rollout.validate()?;
        self.algorithm.validate()?;
        self.optimizer.validate()?;
        self.trainer.validate()
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
