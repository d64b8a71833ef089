//! `[rollout]`: generation and the fleet that does it.

use std::net::SocketAddr;
use std::path::PathBuf;

use grpo_rollout::guided::Guide;
use serde::Deserialize;

use super::values::require;
use super::{Dtype, DtypeSetting, MAX_BATCH, MAX_COUNT, MAX_GROUP_SIZE, MAX_MODEL_LEN, Seconds};
use crate::error::{Error, Result};

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
    /// Nucleus sampling: keep the smallest set of tokens reaching this
    /// mass, in (0, 1]. Default 1 (off). The learner scores at the
    /// temperature only, as TRL's does; the importance correction covers the rest.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 keeps all. Default 0.
    pub top_k: u32,
    /// Drop tokens below this fraction of the most likely one's
    /// probability, in [0, 1). Default 0 (off).
    pub min_p: f32,
    /// vLLM's repetition penalty, above 0 and at most 100; 1 is off. Default 1.
    pub repetition_penalty: f32,
    /// The in-process engine's weight and KV-cache dtype: "auto" (default:
    /// the faster on this machine, measured), "f32" or "bf16" (the loss's
    /// importance correction covers the rollout/learner mismatch).
    pub dtype: DtypeSetting,
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
    /// A CA certificate (PEM) that workers' certificates must chain to:
    /// workers are then called over TLS (addresses without a scheme become
    /// `https://`). Without it, `https://` addresses are checked against the
    /// system's roots and the others are plain HTTP/2. Relative to the config file.
    pub tls_ca: Option<PathBuf>,
    /// The certificate chain (PEM) the registry (`listen`) serves TLS with;
    /// needs `tls_key`. Relative to the config file.
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert`. Relative to the config file.
    pub tls_key: Option<PathBuf>,
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
    /// Guided decoding of every rollout, as vLLM's `structured_outputs`
    /// (one of `json`, `regex`, `choice`, `grammar`, `json_object = true`;
    /// see `grpo_rollout::guided::Guide::from_options`); a data row's own
    /// `structured_outputs` column takes precedence. Default none.
    pub structured_outputs: Option<serde_json::Value>,
}

impl Default for RolloutSection {
    fn default() -> Self {
        let seconds = |s: f64| Seconds::try_from(s).expect("a valid default");
        RolloutSection {
            group_size: 8,
            prompts_per_step: 8,
            max_completion_tokens: 32,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            max_model_len: 256,
            dtype: DtypeSetting::Auto,
            seed: 0,
            workers: Vec::new(),
            listen: None,
            in_process: None,
            engines: 1,
            worker_token_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            weight_dtype: Dtype::F32,
            heartbeat_s: seconds(2.0),
            worker_timeout_s: seconds(10.0),
            worker_wait_s: seconds(600.0),
            max_staleness: 0,
            structured_outputs: None,
        }
    }
}

impl RolloutSection {
    /// The guide of `structured_outputs`, if set.
    pub fn guide(&self) -> Result<Option<Guide>> {
        self.structured_outputs
            .as_ref()
            .map(|options| {
                Guide::from_options(options).map_err(|message| Error::Config {
                    field: "rollout.structured_outputs",
                    message,
                })
            })
            .transpose()
    }

    /// Checks the section's values and their combinations.
    pub(crate) fn validate(&self) -> Result<()> {
        self.guide()?;
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
            "rollout.top_p",
            self.top_p > 0.0 && self.top_p <= 1.0,
            self.top_p,
            "in (0, 1]; 1 keeps every token",
        )?;
        require(
            "rollout.top_k",
            self.top_k <= i32::MAX as u32,
            self.top_k,
            "0 (every token) or a count of tokens",
        )?;
        require(
            "rollout.min_p",
            (0.0..1.0).contains(&self.min_p),
            self.min_p,
            "in [0, 1); 0 keeps every token",
        )?;
        require(
            "rollout.repetition_penalty",
            self.repetition_penalty > 0.0 && self.repetition_penalty <= 100.0,
            self.repetition_penalty,
            "above 0 and at most 100; 1 is off",
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
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(Error::Config {
                field: if self.tls_cert.is_some() {
                    "rollout.tls_key"
                } else {
                    "rollout.tls_cert"
                },
                message: "rollout.tls_cert and rollout.tls_key go together: give both (the registry serves TLS) \
                          or neither"
                    .to_string(),
            });
        }
        if self.tls_cert.is_some() && self.listen.is_none() {
            return Err(Error::Config {
                field: "rollout.tls_cert",
                message: "it is the registry's certificate: give rollout.listen too".to_string(),
            });
        }
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
