//! LoRA adapters, as PEFT defines them: a linear layer `y = x·Wᵀ` becomes
//! `y = x·Wᵀ + (x·Aᵀ)·Bᵀ · s` with `A` `[r, in]`, `B` `[out, r]` and the
//! scaling `s = α / r` (`α / √r` with rsLoRA). `A` starts Kaiming-uniform
//! (PEFT's `kaiming_uniform_(a = √5)`: uniform in ±1/√in), `B` at zero, so
//! a new adapter leaves the model as it is.
//!
//! Adapter tensors are named after the layer they adapt
//! (`model.layers.0.self_attn.q_proj.lora_A.weight`); PEFT folders
//! (`adapter_config.json`, `adapter_model.safetensors`) prefix the names
//! with `base_model.model.` ([`PEFT_PREFIX`]).

use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::names::{ParamSpec, parameters};
use crate::weights::{HostTensor, Safetensors, WeightSource, save_safetensors};

/// What PEFT prefixes to adapter tensor names in its folders.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The adapter settings file of a PEFT folder.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

/// The adapter weights file of a PEFT folder.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Which linear layers carry adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Every linear layer of the decoder layers (not the output head), PEFT's `"all-linear"`.
    AllLinear,
    /// The layers named by one of these or ending in `.` and one of them,
    /// PEFT's rule for a list (`q_proj` adapts every layer's query
    /// projection, `model.layers.0.mlp.down_proj` one layer).
    Modules(Vec<String>),
    /// The layers whose whole name matches this regular expression, PEFT's
    /// rule for a single string.
    Pattern(String),
}

impl Targets {
    /// Whether the layer called `name` is a target.
    fn matches(&self, name: &str, pattern: Option<&regex::Regex>) -> bool {
        match self {
            Targets::AllLinear => true,
            Targets::Modules(targets) => targets.iter().any(|t| name_matches(name, t)),
            Targets::Pattern(_) => pattern.is_some_and(|p| p.is_match(name)),
        }
    }
}

/// PEFT's rule for one target of a list: the name itself or its ending after a dot.
fn name_matches(name: &str, target: &str) -> bool {
    name == target || name.strip_suffix(target).is_some_and(|head| head.ends_with('.'))
}

/// A LoRA configuration (PEFT's `LoraConfig`, the fields grpo supports).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// r, the adapters' rank.
    pub rank: usize,
    /// α, the numerator of the scaling.
    pub alpha: f64,
    /// Which layers are adapted.
    pub targets: Targets,
    /// rsLoRA's scaling `α / √r` instead of `α / r`.
    pub use_rslora: bool,
}

/// A linear layer that carries an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptedLayer {
    /// The layer's name, e.g. `model.layers.0.self_attn.q_proj`.
    pub name: String,
    /// Its input features.
    pub inputs: usize,
    /// Its output features.
    pub outputs: usize,
}

impl LoraConfig {
    /// The factor the adapter's product is scaled by.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// The layers of the model of `config` that carry adapters, in
    /// parameter order; refuses a rank of 0 and a target the model lacks.
    pub fn layers(&self, config: &ModelConfig) -> Result<Vec<AdaptedLayer>> {
        let bad = |message: String| Error::Config {
            field: "lora".to_string(),
            message,
        };
        if self.rank == 0 {
            return Err(bad("the rank must be at least 1".to_string()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(bad(format!("alpha must be a positive number, got {}", self.alpha)));
        }
        let linear = linear_layers(config);
        let mut kinds: Vec<String> = Vec::new();
        for layer in &linear {
            let kind = leaf(&layer.name).to_string();
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let choices = || format!("choose among {} or \"all-linear\"", kinds.join(", "));
        let pattern = match &self.targets {
            Targets::Pattern(p) => Some(
                regex::Regex::new(&format!("^(?:{p})$"))
                    .map_err(|e| bad(format!("target_modules `{p}` is not a regular expression: {e}")))?,
            ),
            Targets::Modules(names) if names.is_empty() => {
                return Err(bad(format!("target_modules names no layer: {}", choices())));
            }
            Targets::Modules(names) => {
                if let Some(name) = names.iter().find(|t| !linear.iter().any(|l| name_matches(&l.name, t))) {
                    return Err(bad(format!(
                        "target module `{name}` is not a linear layer of this model: {}",
                        choices()
                    )));
                }
                None
            }
            Targets::AllLinear => None,
        };
        let adapted: Vec<AdaptedLayer> = linear
            .into_iter()
            .filter(|l| self.targets.matches(&l.name, pattern.as_ref()))
            .collect();
        if adapted.is_empty() {
            return Err(bad(format!(
                "target_modules matches no layer of this model: {}",
                choices()
            )));
        }
        Ok(adapted)
    }

    /// Whether `other` makes the same adapters on the model of `config`:
    /// the same layers, rank and scaling, however the targets are written.
    pub fn same_adapters(&self, other: &LoraConfig, config: &ModelConfig) -> bool {
        let layers = |lora: &LoraConfig| lora.layers(config).ok();
        self.rank == other.rank
            && self.scaling() == other.scaling()
            && self.use_rslora == other.use_rslora
            && layers(self) == layers(other)
    }

    /// A short description: rank, α and the kinds of layers adapted on the
    /// model of `config` (`rank 8, alpha 16 on q_proj, v_proj`).
    pub fn describe(&self, config: &ModelConfig) -> String {
        let mut kinds: Vec<String> = self
            .layers(config)
            .unwrap_or_default()
            .iter()
            .map(|l| leaf(&l.name).to_string())
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        let rslora = if self.use_rslora { " (rsLoRA)" } else { "" };
        format!(
            "rank {}, alpha {}{rslora} on {}",
            self.rank,
            self.alpha,
            kinds.join(", ")
        )
    }

    /// PEFT's `adapter_config.json` for these adapters on `layers` of the
    /// model at `base` (a path or a Hub name).
    pub fn peft_config(&self, layers: &[AdaptedLayer], base: &str) -> Value {
        let mut targets: Vec<&str> = layers.iter().map(|l| leaf(&l.name)).collect();
        targets.sort_unstable();
        targets.dedup();
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
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

/// The last part of a layer's name (`q_proj`).
fn leaf(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// Every linear layer of the decoder layers of `config` (the output head
/// and embeddings excluded), in parameter order.
pub fn linear_layers(config: &ModelConfig) -> Vec<AdaptedLayer> {
    parameters(config)
        .into_iter()
        .filter(|p| p.name.starts_with("model.layers.") && p.name.ends_with("_proj.weight") && p.dims.len() == 2)
        .map(|p| AdaptedLayer {
            name: p.name.trim_end_matches(".weight").to_string(),
            inputs: p.dims[1],
            outputs: p.dims[0],
        })
        .collect()
}

/// The adapter tensors of `layers` at `rank`: per layer `lora_A` `[r, in]`
/// then `lora_B` `[out, r]`.
pub fn adapter_parameters(layers: &[AdaptedLayer], rank: usize) -> Vec<ParamSpec> {
    layers
        .iter()
        .flat_map(|l| {
            [
                ParamSpec {
                    name: format!("{}.lora_A.weight", l.name),
                    dims: vec![rank, l.inputs],
                },
                ParamSpec {
                    name: format!("{}.lora_B.weight", l.name),
                    dims: vec![l.outputs, rank],
                },
            ]
        })
        .collect()
}

/// New adapters for `layers` from `seed`, as PEFT initializes them: `A`
/// uniform in ±1/√in, `B` zero.
pub fn new_adapters(layers: &[AdaptedLayer], rank: usize, seed: u64) -> Result<BTreeMap<String, HostTensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    adapter_parameters(layers, rank)
        .into_iter()
        .map(|spec| {
            let count: usize = spec.dims.iter().product();
            let data = if spec.name.ends_with(".lora_A.weight") {
                let bound = 1.0 / (spec.dims[1] as f32).sqrt();
                (0..count).map(|_| rng.random_range(-bound..bound)).collect()
            } else {
                vec![0.0; count]
            };
            Ok((spec.name, HostTensor::new(spec.dims, data)?))
        })
        .collect()
}

/// A PEFT adapter folder: its settings and its tensors under grpo's names.
#[derive(Debug, Clone)]
pub struct AdapterFolder {
    /// The adapters' settings.
    pub lora: LoraConfig,
    /// The tensors, named as [`adapter_parameters`] names them.
    pub tensors: BTreeMap<String, HostTensor>,
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
        Ok(AdapterFolder { lora, tensors })
    }

    /// Writes the folder into `dir` (created if needed): the settings for
    /// the model of `config` at `base`, the tensors in f32 under PEFT's names.
    pub fn write(&self, dir: &Path, config: &ModelConfig, base: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let layers = self.lora.layers(config)?;
        let settings = serde_json::to_string_pretty(&self.lora.peft_config(&layers, base)).expect("JSON values print");
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

/// A base model's weights with adapter tensors beside them: what a decoder
/// with adapters uploads.
pub struct WithAdapters<'a> {
    /// The base model's weights.
    pub base: &'a dyn WeightSource,
    /// The adapter tensors, named as [`adapter_parameters`] names them.
    pub adapters: &'a BTreeMap<String, HostTensor>,
}

impl WeightSource for WithAdapters<'_> {
    fn location(&self) -> std::path::PathBuf {
        self.base.location()
    }

    fn names(&self) -> Vec<String> {
        let mut names = self.base.names();
        names.extend(self.adapters.keys().cloned());
        names.sort();
        names
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self.adapters.get(name) {
            Some(tensor) => Ok(tensor.clone()),
            None => self.base.tensor(name),
        }
    }
}

/// A base model's weights with adapters merged in: each adapted layer's
/// weight becomes `W + s·B·A` (summed in f64, stored f32), the rest as the
/// base has them — a plain model with the adapters' behaviour, for engines
/// that take whole weights and for merged folders.
pub struct Merged<'a> {
    /// The base model's weights.
    pub base: &'a dyn WeightSource,
    /// The adapters' settings.
    pub lora: &'a LoraConfig,
    /// The adapter tensors, named as [`adapter_parameters`] names them.
    pub adapters: &'a BTreeMap<String, HostTensor>,
}

impl WeightSource for Merged<'_> {
    fn location(&self) -> std::path::PathBuf {
        self.base.location()
    }

    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let mut weight = self.base.tensor(name)?;
        let Some(layer) = name.strip_suffix(".weight") else {
            return Ok(weight);
        };
        let (Some(a), Some(b)) = (
            self.adapters.get(&format!("{layer}.lora_A.weight")),
            self.adapters.get(&format!("{layer}.lora_B.weight")),
        ) else {
            return Ok(weight);
        };
        merge_into(&mut weight, a, b, self.lora.scaling()).map_err(|message| Error::Tensor {
            path: self.base.location(),
            tensor: name.to_string(),
            message,
        })?;
        Ok(weight)
    }
}

/// `weight` `[out, in]` += `scaling`·`b`·`a` for `a` `[r, in]`, `b` `[out, r]`.
fn merge_into(
    weight: &mut HostTensor,
    a: &HostTensor,
    b: &HostTensor,
    scaling: f64,
) -> std::result::Result<(), String> {
    let (outputs, inputs) = match weight.dims[..] {
        [o, i] => (o, i),
        _ => return Err(format!("shape {:?} is not a linear layer's", weight.dims)),
    };
    let rank = a.dims.first().copied().unwrap_or(0);
    if a.dims != [rank, inputs] || b.dims != [outputs, rank] {
        return Err(format!(
            "adapters of shapes {:?} and {:?} do not fit a [{outputs}, {inputs}] weight",
            a.dims, b.dims
        ));
    }
    if b.data.iter().all(|&v| v == 0.0) {
        return Ok(()); // new adapters: nothing to add
    }
    for o in 0..outputs {
        let b_row = &b.data[o * rank..(o + 1) * rank];
        for (i, w) in weight.data[o * inputs..(o + 1) * inputs].iter_mut().enumerate() {
            let update: f64 = b_row
                .iter()
                .enumerate()
                .map(|(k, &bk)| f64::from(bk) * f64::from(a.data[k * inputs + i]))
                .sum();
            *w = (f64::from(*w) + scaling * update) as f32;
        }
    }
    Ok(())
}
