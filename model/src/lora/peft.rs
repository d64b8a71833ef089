//! PEFT adapter folders (`adapter_config.json`, `adapter_model.safetensors`)
//! read and written: PEFT's settings as a [`LoraConfig`] (the options grpo
//! does not apply refused by name), tensor names with PEFT's
//! `base_model.model.` prefix.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::{AdaptedLayer, LoraConfig, Targets, adapter_parameters, leaf};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::weights::{HostTensor, Safetensors, WeightSource, save_safetensors};

/// What PEFT prefixes to adapter tensor names in its folders.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The adapter settings file of a PEFT folder.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

/// The adapter weights file of a PEFT folder.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

impl LoraConfig {
    /// PEFT's `adapter_config.json` for these adapters on `layers` of the
    /// model at `base` (a path or a Hub name), trained with `dropout`.
    pub fn peft_config(&self, layers: &[AdaptedLayer], base: &str, dropout: f64) -> Value {
        let mut targets: Vec<&str> = layers.iter().map(|l| leaf(&l.name)).collect();
        targets.sort_unstable();
        targets.dedup();
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": dropout,
            "target_modules": targets,
            "use_rslora": self.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }

    /// The settings of a PEFT `adapter_config.json` (read from `path`),
    /// refusing the options grpo does not apply (DoRA, biases, per-layer
    /// ranks, extra trained modules, …) by name.
    pub fn from_peft(path: &Path, config: &Value) -> Result<LoraConfig> {
        let bad = |message: String| Error::format(path, message);
        let field = |name: &str| config.get(name).filter(|v| !v.is_null());
        match field("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => {
                return Err(bad(format!(
                    "peft_type {other:?} is not LORA: grpo reads LoRA adapters only"
                )));
            }
        }
        let refused = |name: &str, supported: &dyn Fn(&Value) -> bool| -> Result<()> {
            match field(name) {
                Some(value) if !supported(value) => Err(bad(format!(
                    "`{name}` = {value} is not supported (grpo applies plain LoRA on linear layers)"
                ))),
                _ => Ok(()),
            }
        };
        let off = |v: &Value| v == &json!(false);
        let empty = |v: &Value| v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty());
        let unset = |_: &Value| false;
        for (name, neutral) in [
            ("use_dora", &off as &dyn Fn(&Value) -> bool),
            ("lora_bias", &off),
            ("use_qalora", &off),
            ("use_bdlora", &off),
            ("fan_in_fan_out", &off),
            ("bias", &|v: &Value| v == &json!("none")),
            ("modules_to_save", &empty),
            ("exclude_modules", &empty),
            ("target_parameters", &empty),
            ("rank_pattern", &empty),
            ("alpha_pattern", &empty),
            ("layers_to_transform", &unset),
            ("layers_pattern", &unset),
            ("layer_replication", &unset),
            ("trainable_token_indices", &unset),
            ("alora_invocation_tokens", &unset),
            ("megatron_config", &unset),
        ] {
            refused(name, neutral)?;
        }
        let rank = field("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("`r` must be a positive integer".to_string()))?;
        let alpha = field("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("`lora_alpha` must be a number".to_string()))?;
        let targets = match field("target_modules") {
            Some(Value::String(s)) if s == "all-linear" => Targets::AllLinear,
            Some(Value::String(s)) => Targets::Pattern(s.clone()),
            Some(Value::Array(names)) => Targets::Modules(
                names
                    .iter()
                    .map(|n| {
                        n.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| bad(format!("target module {n} is not a name")))
                    })
                    .collect::<Result<_>>()?,
            ),
            other => return Err(bad(format!("`target_modules` {other:?} names no layers"))),
        };
        Ok(LoraConfig {
            rank: rank as usize,
            alpha,
            targets,
            use_rslora: field("use_rslora").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

/// A PEFT adapter folder: its settings and its tensors under grpo's names.
#[derive(Debug, Clone)]
pub struct AdapterFolder {
    /// The adapters' settings.
    pub lora: LoraConfig,
    /// The tensors, named as [`adapter_parameters`] names them.
    pub tensors: BTreeMap<String, HostTensor>,
    /// The dropout on the adapters' inputs they were trained with (PEFT's
    /// `lora_dropout`; inference never applies it).
    pub dropout: f64,
}

impl AdapterFolder {
    /// Reads a PEFT folder and checks its tensors against the model of
    /// `config`: every adapted layer's two tensors in the right shapes,
    /// nothing else.
    pub fn read(dir: &Path, config: &ModelConfig) -> Result<AdapterFolder> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io("read", &config_path, e))?;
        let settings: Value =
            serde_json::from_str(&text).map_err(|e| Error::format(&config_path, format!("not JSON: {e}")))?;
        let lora = LoraConfig::from_peft(&config_path, &settings)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let file = Safetensors::open_files(std::slice::from_ref(&weights_path))?;
        let layers = lora
            .layers(config)
            .map_err(|e| Error::format(&config_path, e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for spec in adapter_parameters(&layers, lora.rank) {
            let stored = peft_name(&spec.name);
            let tensor = file.tensor(&stored)?;
            if tensor.dims != spec.dims {
                return Err(Error::Tensor {
                    path: weights_path,
                    tensor: stored,
                    message: format!("shape {:?}, the model's layer needs {:?}", tensor.dims, spec.dims),
                });
            }
            tensors.insert(spec.name, tensor);
        }
        if let Some(extra) = file.names().into_iter().find(|n| !tensors.contains_key(grpo_name(n))) {
            return Err(Error::Tensor {
                path: weights_path,
                tensor: extra,
                message: "not an adapter of the configured target modules".to_string(),
            });
        }
        let dropout = settings
            .get("lora_dropout")
            .and_then(Value::as_f64)
            .filter(|p| (0.0..1.0).contains(p))
            .unwrap_or(0.0);
        Ok(AdapterFolder { lora, tensors, dropout })
    }

    /// Writes the folder into `dir` (created if needed): the settings for
    /// the model of `config` at `base`, the tensors in f32 under PEFT's names.
    pub fn write(&self, dir: &Path, config: &ModelConfig, base: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let layers = self.lora.layers(config)?;
        let settings = serde_json::to_string_pretty(&self.lora.peft_config(&layers, base, self.dropout))
            .expect("JSON values print");
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        std::fs::write(&config_path, settings).map_err(|e| Error::io("write", &config_path, e))?;
        let named = self
            .tensors
            .iter()
            .map(|(name, t)| (peft_name(name), t.clone()))
            .collect();
        save_safetensors(dir.join(ADAPTER_WEIGHTS_FILE), &named)
    }
}

/// An adapter tensor's name in a PEFT folder.
pub fn peft_name(name: &str) -> String {
    format!("{PEFT_PREFIX}{name}")
}

/// An adapter tensor's grpo name from its PEFT name.
fn grpo_name(stored: &str) -> &str {
    stored.strip_prefix(PEFT_PREFIX).unwrap_or(stored)
}
