//! Model configuration read from a Hugging Face `config.json`.
//!
//! Llama, Mistral, Phi-3, Qwen2, Qwen3, Qwen3-MoE, Gemma 2 and Gemma 3
//! share one decoder; the differences are data here: Qwen3-MoE's sparse
//! MLP layers ([`Experts`]), q/k/v biases (Qwen2, or Llama's
//! `attention_bias`), per-head q/k RMS norms (Qwen3, Gemma 3), fused q/k/v
//! and gate/up projections (Phi-3), Gemma's style ([`GemmaStyle`]: Gemma 2's
//! soft-capped attention scores and logits among it),
//! a head dimension that may differ from `hidden / heads`, tied embeddings,
//! Llama 3 RoPE scaling, and sliding attention windows (Mistral's and
//! Phi-3's `sliding_window` on every layer, Gemma's on its
//! `sliding_attention` layers: each token sees the `W` latest positions,
//! its own included). Anything else the
//! decoder does not implement (another activation, partial rotary
//! embeddings, other RoPE types) is refused with an error naming the field.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The decoder family, from `architectures` / `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (Llama 2/3, SmolLM2).
    Llama,
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5).
    Qwen2,
    /// `Qwen3ForCausalLM`.
    Qwen3,
    /// `Qwen3MoeForCausalLM` (Qwen3-30B-A3B, Qwen3-235B-A22B).
    Qwen3Moe,
    /// `MistralForCausalLM` (Mistral 7B, Ministral).
    Mistral,
    /// `Phi3ForCausalLM` (Phi-3, Phi-3.5 and Phi-4 mini).
    Phi3,
    /// `Gemma2ForCausalLM` (Gemma 2: 2B, 9B, 27B).
    Gemma2,
    /// `Gemma3ForCausalLM` (Gemma 3's text models: 270M, 1B).
    Gemma3,
}

/// What Gemma's decoders (2 and 3) do beyond the others: embeddings scaled
/// by √hidden; RMSNorm weights that are offsets from 1, applied in f32; the
/// attention output and the MLP output normalized before their residual
/// adds (`post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's
/// input norm is `pre_feedforward_layernorm`); GELU (tanh) gating; scores
/// scaled by `query_pre_attn_scalar^-1/2`; a RoPE base of its own for the
/// sliding layers (Gemma 3's); and soft-capping, `cap · tanh(x / cap)`, of
/// the attention scores and of the logits (Gemma 2's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmaStyle {
    /// The attention scores are divided by its square root.
    pub query_pre_attn_scalar: f64,
    /// The RoPE base of the sliding-window layers (the others use `rope_theta`).
    pub local_rope_theta: f64,
    /// The cap of the scaled attention scores (`attn_logit_softcapping`).
    pub attention_softcap: Option<f64>,
    /// The cap of the output logits (`final_logit_softcapping`).
    pub final_softcap: Option<f64>,
}

/// Qwen3-MoE's sparse MLP (`Qwen3MoeSparseMoeBlock`): a router picks
/// `top_k` of `count` SwiGLU experts for each token (softmax over the
/// experts, the `top_k` most probable, their probabilities renormalized to
/// sum to 1 when `normalize_top_k`), and the token's MLP output is the
/// experts' outputs weighted by them. Layers listed dense keep the plain MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    /// Experts per sparse layer (`num_experts`).
    pub count: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of each expert's SwiGLU hidden layer (`moe_intermediate_size`).
    pub intermediate_size: usize,
    /// Whether the chosen experts' probabilities are divided by their sum (`norm_topk_prob`).
    pub normalize_top_k: bool,
    /// Per layer, whether its MLP is sparse: every `decoder_sparse_step`-th
    /// layer not in `mlp_only_layers`.
    pub sparse_layers: Vec<bool>,
    /// The load-balancing loss's coefficient in training (`router_aux_loss_coef`).
    pub router_aux_loss_coef: f64,
    /// Whether training adds the load-balancing loss (`output_router_logits`,
    /// as transformers adds it only then).
    pub output_router_logits: bool,
}

/// Every family, in the order errors list them.
const FAMILIES: [Family; 8] = [
    Family::Gemma2,
    Family::Gemma3,
    Family::Llama,
    Family::Mistral,
    Family::Phi3,
    Family::Qwen2,
    Family::Qwen3,
    Family::Qwen3Moe,
];

impl Family {
    /// The Hugging Face architecture name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
            Family::Gemma2 => "Gemma2ForCausalLM",
            Family::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Mistral => "mistral",
            Family::Phi3 => "phi3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3_text",
        }
    }
}

impl Family {
    /// Whether it is Gemma 2 or Gemma 3 ([`GemmaStyle`]).
    pub fn is_gemma(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }
}

impl std::str::FromStr for Family {
    type Err = Error;

    fn from_str(name: &str) -> Result<Family> {
        FAMILIES.into_iter().find(|f| f.model_type() == name).ok_or_else(|| {
            let names: Vec<&str> = FAMILIES.iter().map(|f| f.model_type()).collect();
            unsupported("family", format!("`{name}` is not one of {}", names.join(", ")))
        })
    }
}

/// Llama 3 RoPE frequency scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_positions: f64,
}

/// Everything the decoder needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub family: Family,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU hidden layer.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// Llama 3 frequency scaling, if any.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// RMS norm epsilon.
    pub rms_norm_eps: f64,
    /// Longest context.
    pub max_positions: usize,
    /// The sliding attention window, if the model has one: a token of a
    /// sliding layer attends to the last `W` positions.
    pub sliding_window: Option<usize>,
    /// Per layer, whether it attends through the window (all of Mistral's
    /// and Phi-3's with a window; Gemma's `sliding_attention` layers).
    pub sliding_layers: Vec<bool>,
    /// Gemma's differences, for Gemma 2 and 3.
    pub gemma: Option<GemmaStyle>,
    /// The sparse MLP layers' experts (Qwen3-MoE with experts).
    pub experts: Option<Experts>,
    /// Whether q/k/v come from one `qkv_proj` and gate/up from one
    /// `gate_up_proj` (Phi-3).
    pub fused_projections: bool,
    /// Whether `lm_head` is the embedding matrix.
    pub tie_embeddings: bool,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether q and k get a per-head RMS norm (Qwen3).
    pub qk_norm: bool,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens.
    pub eos_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    /// transformers ≥ 5 writes `rope_theta` and the scaling here instead.
    rope_parameters: Option<Value>,
    rms_norm_eps: f64,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
    sliding_window: Option<usize>,
    partial_rotary_factor: Option<f64>,
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    use_bidirectional_attention: Option<bool>,
    rope_local_base_freq: Option<f64>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<Value>,
    /// transformers ≥ 5 writes `num_local_experts` instead.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    router_aux_loss_coef: Option<f64>,
    output_router_logits: Option<bool>,
}

fn unsupported(field: &str, message: impl Into<String>) -> Error {
    Error::Config {
        field: field.to_string(),
        message: message.into(),
    }
}

impl ModelConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<ModelConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("read", path, e))?;
        ModelConfig::from_json(&text).map_err(|e| match e {
            Error::Format { message, .. } => Error::format(path, message),
            other => other,
        })
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<ModelConfig> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| Error::format("config.json", format!("not a model config: {e}")))?;
        let family = family_of(&raw)?;
        let (field, activation, runs) = if family.is_gemma() {
            let given = raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref());
            (
                "hidden_activation",
                given.unwrap_or("gelu_pytorch_tanh"),
                "gelu_pytorch_tanh",
            )
        } else {
            ("hidden_act", raw.hidden_act.as_deref().unwrap_or("silu"), "silu")
        };
        if activation != runs {
            return Err(unsupported(
                field,
                format!("`{activation}` is not supported; {} runs {runs}", family.architecture()),
            ));
        }
        if raw.use_sliding_window {
            return Err(unsupported(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        // Top-level in older configs, inside `rope_parameters` in transformers 5's.
        let partial = raw
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("partial_rotary_factor"));
        let partial = partial.and_then(Value::as_f64).or(raw.partial_rotary_factor);
        if let Some(factor) = partial.filter(|&f| f != 1.0) {
            return Err(unsupported(
                "partial_rotary_factor",
                format!("{factor}: rotary embeddings over part of each head are not supported (only 1.0)"),
            ));
        }
        // Qwen2 and Qwen3 write a window they do not use (`use_sliding_window` false).
        let sliding_window = match family {
            Family::Mistral | Family::Phi3 | Family::Gemma2 | Family::Gemma3 => raw.sliding_window,
            Family::Llama | Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => None,
        };
        if sliding_window == Some(0) {
            return Err(unsupported("sliding_window", "a window of 0 tokens sees nothing"));
        }
        if raw.mlp_bias {
            return Err(unsupported("mlp_bias", "MLP biases are not supported"));
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(unsupported(
                "num_key_value_heads",
                format!("{kv_heads} key/value heads must divide {heads} attention heads"),
            ));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(unsupported(
                "head_dim",
                format!("{head_dim} must be even and positive for RoPE"),
            ));
        }
        let qkv_bias = match family {
            Family::Qwen2 => true,
            Family::Llama | Family::Qwen3 | Family::Qwen3Moe => raw.attention_bias.unwrap_or(false),
            Family::Mistral | Family::Phi3 => false,
            Family::Gemma2 | Family::Gemma3 => {
                if raw.attention_bias == Some(true) {
                    return Err(unsupported(
                        "attention_bias",
                        "Gemma with attention biases is not supported",
                    ));
                }
                false
            }
        };
        let (gemma, sliding_layers, global_theta) = if family.is_gemma() {
            let (style, layers, theta) = gemma_style(family, &raw)?;
            (Some(style), layers, Some(theta))
        } else {
            (None, vec![sliding_window.is_some(); raw.num_hidden_layers], None)
        };
        if sliding_window.is_none() && sliding_layers.iter().any(|&s| s) {
            return Err(unsupported("sliding_window", "sliding layers need a window"));
        }
        Ok(ModelConfig {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            rope_theta: global_theta.unwrap_or(
                raw.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
                    .or(raw.rope_theta)
                    .unwrap_or(10_000.0),
            ),
            rope_scaling: match family {
                // gemma_style refused every rope type but the default.
                Family::Gemma2 | Family::Gemma3 => None,
                _ => rope_scaling(raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref()))?,
            },
            rms_norm_eps: raw.rms_norm_eps,
            max_positions: raw.max_position_embeddings,
            sliding_window,
            sliding_layers,
            gemma,
            experts: experts(family, &raw)?,
            fused_projections: family == Family::Phi3,
            tie_embeddings: raw.tie_word_embeddings,
            qkv_bias,
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3),
            bos_token_id: raw.bos_token_id,
            eos_token_ids: token_ids(raw.eos_token_id.as_ref())?,
        })
    }

    /// The experts of layer `layer`'s MLP, when it is sparse.
    pub fn experts_of(&self, layer: usize) -> Option<&Experts> {
        self.experts
            .as_ref()
            .filter(|e| e.sparse_layers.get(layer).copied().unwrap_or(false))
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn slides(&self, layer: usize) -> bool {
        self.sliding_window.is_some() && self.sliding_layers.get(layer).copied().unwrap_or(false)
    }

    /// The factor of the attention scores: `head_dim^-1/2`, or Gemma's
    /// `query_pre_attn_scalar^-1/2`.
    pub fn attention_scale(&self) -> f64 {
        let scalar = self.gemma.map_or(self.head_dim as f64, |g| g.query_pre_attn_scalar);
        1.0 / scalar.sqrt()
    }

    /// The RoPE inverse frequencies of the sliding layers when they have
    /// their own base (Gemma 3), computed as [`ModelConfig::rope_inverse_frequencies`].
    pub fn local_rope_inverse_frequencies(&self) -> Option<Vec<f32>> {
        self.gemma
            .filter(|g| g.local_rope_theta != self.rope_theta)
            .map(|g| inverse_frequencies(self.head_dim, g.local_rope_theta))
    }

    /// The cap of the attention scores (Gemma 2's soft-capping), if any.
    pub fn attention_softcap(&self) -> Option<f64> {
        self.gemma.and_then(|g| g.attention_softcap)
    }

    /// The cap of the output logits (Gemma 2's soft-capping), if any.
    pub fn final_softcap(&self) -> Option<f64> {
        self.gemma.and_then(|g| g.final_softcap)
    }

    /// The RoPE inverse frequencies, one per pair of head dimensions, with
    /// Llama 3 scaling applied, computed in f32 as transformers does.
    pub fn rope_inverse_frequencies(&self) -> Vec<f32> {
        let plain = inverse_frequencies(self.head_dim, self.rope_theta).into_iter();
        let Some(s) = self.rope_scaling else {
            return plain.collect();
        };
        let (factor, low, high, old) = (
            s.factor as f32,
            s.low_freq_factor as f32,
            s.high_freq_factor as f32,
            s.original_max_positions as f32,
        );
        let low_wavelen = old / low;
        let high_wavelen = old / high;
        plain
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect()
    }
}

impl ModelConfig {
    /// The Hugging Face `config.json` of this config (what transformers reads back).
    pub fn to_hf_json(&self) -> Value {
        let rope_scaling = self.rope_scaling.map(|s| {
            serde_json::json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_positions,
            })
        });
        let mut json = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids.first(),
            "torch_dtype": "float32",
        });
        if self.family == Family::Llama {
            json["attention_bias"] = Value::Bool(self.qkv_bias);
            json["mlp_bias"] = Value::Bool(false);
        }
        if matches!(
            self.family,
            Family::Mistral | Family::Phi3 | Family::Gemma2 | Family::Gemma3
        ) {
            json["sliding_window"] = self.sliding_window.into();
        }
        if self.family == Family::Qwen3Moe {
            json["attention_bias"] = Value::Bool(self.qkv_bias);
            json["use_sliding_window"] = Value::Bool(false);
            let object = json.as_object_mut().expect("an object");
            match &self.experts {
                Some(e) => {
                    let dense: Vec<usize> = (0..self.layers).filter(|&l| !e.sparse_layers[l]).collect();
                    object.insert("num_experts".into(), e.count.into());
                    object.insert("num_experts_per_tok".into(), e.top_k.into());
                    object.insert("moe_intermediate_size".into(), e.intermediate_size.into());
                    object.insert("norm_topk_prob".into(), e.normalize_top_k.into());
                    object.insert("decoder_sparse_step".into(), 1.into());
                    object.insert("mlp_only_layers".into(), dense.into());
                    object.insert("router_aux_loss_coef".into(), e.router_aux_loss_coef.into());
                    object.insert("output_router_logits".into(), e.output_router_logits.into());
                }
                None => {
                    object.insert("num_experts".into(), 0.into());
                }
            }
        }
        if let Some(g) = self.gemma {
            let object = json.as_object_mut().expect("an object");
            object.remove("hidden_act");
            object.insert("hidden_activation".into(), "gelu_pytorch_tanh".into());
            // transformers' Gemma configs hold an integer here, and refuse 16.0.
            let scalar = g.query_pre_attn_scalar;
            let scalar = if scalar.fract() == 0.0 && scalar.abs() < 1e15 {
                Value::from(scalar as i64)
            } else {
                Value::from(scalar)
            };
            object.insert("query_pre_attn_scalar".into(), scalar);
            if self.family == Family::Gemma3 {
                object.insert("rope_local_base_freq".into(), g.local_rope_theta.into());
            }
            object.insert("attn_logit_softcapping".into(), g.attention_softcap.into());
            object.insert("final_logit_softcapping".into(), g.final_softcap.into());
            let types: Vec<&str> = self
                .sliding_layers
                .iter()
                .map(|&s| if s { "sliding_attention" } else { "full_attention" })
                .collect();
            object.insert("layer_types".into(), types.into());
            object.insert("attention_bias".into(), false.into());
        }
        json
    }
}

fn family_of(raw: &RawConfig) -> Result<Family> {
    let by_architecture = raw
        .architectures
        .iter()
        .find_map(|a| FAMILIES.into_iter().find(|f| f.architecture() == a));
    let by_type = raw
        .model_type
        .as_deref()
        .and_then(|t| FAMILIES.into_iter().find(|f| f.model_type() == t));
    by_architecture.or(by_type).ok_or_else(|| {
        let names: Vec<&str> = FAMILIES.iter().map(|f| f.architecture()).collect();
        unsupported(
            "architectures",
            format!(
                "{:?} (model_type {:?}) is not supported; grpo runs {}",
                raw.architectures,
                raw.model_type,
                names.join(", ")
            ),
        )
    })
}

/// Qwen3-MoE's experts from its config fields (`None` for the other
/// families, and for a Qwen3-MoE whose every layer is dense); the fields
/// are checked to describe a router that can pick its experts.
fn experts(family: Family, raw: &RawConfig) -> Result<Option<Experts>> {
    if family != Family::Qwen3Moe {
        return Ok(None);
    }
    // transformers' Qwen3MoeConfig defaults for fields a config leaves out.
    let count = raw.num_experts.or(raw.num_local_experts).unwrap_or(128);
    let step = raw.decoder_sparse_step.unwrap_or(1);
    if step == 0 {
        return Err(unsupported("decoder_sparse_step", "must be at least 1"));
    }
    let dense = raw.mlp_only_layers.clone().unwrap_or_default();
    if let Some(&layer) = dense.iter().find(|&&l| l >= raw.num_hidden_layers) {
        return Err(unsupported(
            "mlp_only_layers",
            format!("layer {layer} is not one of the {} layers", raw.num_hidden_layers),
        ));
    }
    let sparse_layers: Vec<bool> = (0..raw.num_hidden_layers)
        .map(|l| count > 0 && !dense.contains(&l) && (l + 1) % step == 0)
        .collect();
    if !sparse_layers.contains(&true) {
        return Ok(None);
    }
    let top_k = raw.num_experts_per_tok.unwrap_or(8);
    if top_k == 0 || top_k > count {
        return Err(unsupported(
            "num_experts_per_tok",
            format!("{top_k} must be between 1 and the {count} experts"),
        ));
    }
    let intermediate_size = raw.moe_intermediate_size.unwrap_or(768);
    if intermediate_size == 0 {
        return Err(unsupported("moe_intermediate_size", "must be at least 1"));
    }
    let router_aux_loss_coef = raw.router_aux_loss_coef.unwrap_or(0.001);
    if !(router_aux_loss_coef.is_finite() && router_aux_loss_coef >= 0.0) {
        return Err(unsupported(
            "router_aux_loss_coef",
            format!("{router_aux_loss_coef} must be a finite number ≥ 0"),
        ));
    }
    Ok(Some(Experts {
        count,
        top_k,
        intermediate_size,
        normalize_top_k: raw.norm_topk_prob.unwrap_or(false),
        sparse_layers,
        router_aux_loss_coef,
        output_router_logits: raw.output_router_logits.unwrap_or(false),
    }))
}

/// `1 / theta^(2i / dim)` for each pair of `dim` head dimensions, in f32 as transformers computes it.
fn inverse_frequencies(dim: usize, theta: f64) -> Vec<f32> {
    let (d, base) = (dim as f32, theta as f32);
    (0..dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / d)).collect()
}

/// Gemma's style, which layers slide, and the RoPE base of the others.
/// Gemma 3's RoPE settings come nested per layer type
/// (`rope_parameters.{full, sliding}_attention`, transformers 5) or flat
/// (`rope_theta`, `rope_local_base_freq`); Gemma 2's are one base for every
/// layer (`rope_parameters.rope_theta` or `rope_theta`). Only the default
/// RoPE type is supported. transformers' defaults: Gemma 2 slides every
/// other layer (the first included), Gemma 3 five of every six.
fn gemma_style(family: Family, raw: &RawConfig) -> Result<(GemmaStyle, Vec<bool>, f64)> {
    for (field, value) in [
        ("final_logit_softcapping", raw.final_logit_softcapping),
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
    ] {
        if let Some(cap) = value.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(unsupported(field, format!("{cap}: a cap must be a positive number")));
        }
    }
    if raw.use_bidirectional_attention == Some(true) {
        return Err(unsupported(
            "use_bidirectional_attention",
            "bidirectional attention is not a causal language model",
        ));
    }
    let flat = raw.rope_parameters.as_ref().filter(|p| p.get("rope_theta").is_some());
    if let Some(other) = flat
        .and_then(|p| p.get("rope_type"))
        .and_then(Value::as_str)
        .filter(|t| *t != "default")
    {
        return Err(unsupported(
            "rope_parameters",
            format!("rope type `{other}` is not supported (only default)"),
        ));
    }
    let nested = |kind: &str| raw.rope_parameters.as_ref().and_then(|p| p.get(kind));
    for kind in ["full_attention", "sliding_attention"] {
        let rope_type = nested(kind).and_then(|p| p.get("rope_type")).and_then(Value::as_str);
        if let Some(other) = rope_type.filter(|t| *t != "default") {
            return Err(unsupported(
                "rope_parameters",
                format!("{kind} rope type `{other}` is not supported (only default)"),
            ));
        }
    }
    if raw.rope_scaling.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(unsupported("rope_scaling", "RoPE scaling of Gemma is not supported"));
    }
    let theta = |kind: &str| nested(kind).and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
    let flat_theta = flat.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
    let (global, local, pattern) = if family == Family::Gemma2 {
        for (field, given) in [
            ("rope_local_base_freq", raw.rope_local_base_freq.is_some()),
            ("sliding_window_pattern", raw.sliding_window_pattern.is_some()),
        ] {
            if given {
                return Err(unsupported(field, "is Gemma 3's; Gemma 2 does not read it"));
            }
        }
        let theta = flat_theta.or(raw.rope_theta).unwrap_or(10_000.0);
        (theta, theta, 2)
    } else {
        let global = theta("full_attention").or(raw.rope_theta).unwrap_or(1_000_000.0);
        let local = theta("sliding_attention")
            .or(raw.rope_local_base_freq)
            .unwrap_or(10_000.0);
        (global, local, raw.sliding_window_pattern.unwrap_or(6))
    };
    let layers = match &raw.layer_types {
        Some(types) => {
            if types.len() != raw.num_hidden_layers {
                return Err(unsupported(
                    "layer_types",
                    format!("{} types for {} layers", types.len(), raw.num_hidden_layers),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(unsupported("layer_types", format!("`{other}` is not a layer type"))),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        // transformers' defaults: every `pattern`-th layer is global.
        None => (0..raw.num_hidden_layers)
            .map(|i| (i + 1) % pattern.max(1) != 0)
            .collect(),
    };
    let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
    let style = GemmaStyle {
        query_pre_attn_scalar: raw.query_pre_attn_scalar.unwrap_or(head_dim as f64),
        local_rope_theta: local,
        attention_softcap: raw.attn_logit_softcapping,
        final_softcap: raw.final_logit_softcapping,
    };
    Ok((style, layers, global))
}

fn rope_scaling(value: Option<&Value>) -> Result<Option<Llama3RopeScaling>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if kind == "default" {
        return Ok(None);
    }
    if kind != "llama3" {
        return Err(unsupported(
            "rope_scaling",
            format!("rope type `{kind}` is not supported (only llama3)"),
        ));
    }
    let number = |key: &str| {
        value
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| unsupported("rope_scaling", format!("llama3 scaling needs a number `{key}`")))
    };
    Ok(Some(Llama3RopeScaling {
        factor: number("factor")?,
        low_freq_factor: number("low_freq_factor")?,
        high_freq_factor: number("high_freq_factor")?,
        original_max_positions: number("original_max_position_embeddings")?,
    }))
}

fn token_ids(value: Option<&Value>) -> Result<Vec<u32>> {
    let bad = || unsupported("eos_token_id", "must be a token id or a list of token ids");
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad))
            .collect(),
        Some(v) => Ok(vec![v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}"#;

    #[test]
    fn reads_a_llama_config() {
        let c = ModelConfig::from_json(LLAMA).unwrap();
        assert_eq!((c.family, c.heads, c.kv_heads, c.head_dim), (Family::Llama, 9, 3, 64));
        assert!(c.tie_embeddings && !c.qkv_bias && !c.qk_norm);
        assert_eq!(c.eos_token_ids, [2]);
        let inv = c.rope_inverse_frequencies();
        assert_eq!(inv.len(), 32);
        assert_eq!(inv[0], 1.0);
        assert!((inv[1] - 100000f32.powf(-2.0 / 64.0)).abs() < 1e-9);
    }

    #[test]
    fn the_hf_json_reads_back_the_same() {
        let c = ModelConfig::from_json(LLAMA).unwrap();
        assert_eq!(ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap(), c);
    }

    #[test]
    fn sliding_windows_and_fused_projections_read_back() {
        let mistral = LLAMA
            .replace("LlamaForCausalLM", "MistralForCausalLM")
            .replace("\"llama\"", "\"mistral\"")
            .replace("\"rms_norm_eps\"", "\"sliding_window\": 4096, \"rms_norm_eps\"");
        let c = ModelConfig::from_json(&mistral).unwrap();
        assert_eq!(
            (c.family, c.max_positions, c.sliding_window),
            (Family::Mistral, 8192, Some(4096))
        );
        assert!(c.slides(0) && c.slides(29));
        assert_eq!(ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap(), c);
        let unbounded = mistral.replace("\"sliding_window\": 4096", "\"sliding_window\": null");
        assert!(!ModelConfig::from_json(&unbounded).unwrap().slides(0));
        // Qwen2's window is unused unless `use_sliding_window` says otherwise.
        let qwen2 = LLAMA
            .replace("LlamaForCausalLM", "Qwen2ForCausalLM")
            .replace("\"llama\"", "\"qwen2\"")
            .replace("\"rms_norm_eps\"", "\"sliding_window\": 4096, \"rms_norm_eps\"");
        assert_eq!(ModelConfig::from_json(&qwen2).unwrap().sliding_window, None);
        let phi3 = LLAMA
            .replace("LlamaForCausalLM", "Phi3ForCausalLM")
            .replace("\"llama\"", "\"phi3\"");
        let c = ModelConfig::from_json(&phi3).unwrap();
        assert!(c.fused_projections && c.family == Family::Phi3);
        assert_eq!(ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap(), c);
    }

    #[test]
    fn gemma3_reads_both_rope_layouts_and_back() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/parity/gemma3/config.json");
        let c = ModelConfig::from_file(path).unwrap();
        assert_eq!(
            (c.family, c.rope_theta, c.sliding_window),
            (Family::Gemma3, 100.0, Some(4))
        );
        assert_eq!(c.sliding_layers, [true, false]);
        assert!(c.slides(0) && !c.slides(1) && c.qk_norm && c.tie_embeddings);
        let g = c.gemma.unwrap();
        assert_eq!((g.query_pre_attn_scalar, g.local_rope_theta), (12.0, 10_000.0));
        assert_eq!(c.attention_scale(), 1.0 / 12f64.sqrt());
        // to_hf_json writes the flat layout (rope_theta, rope_local_base_freq).
        let flat = c.to_hf_json();
        assert_eq!(flat["rope_local_base_freq"], 10_000.0);
        assert_eq!(ModelConfig::from_json(&flat.to_string()).unwrap(), c);
        let text = std::fs::read_to_string(path).unwrap();
        for (field, edit) in [
            (
                "final_logit_softcapping",
                ("\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 0.0"),
            ),
            (
                "attn_logit_softcapping",
                ("\"attn_logit_softcapping\": null", "\"attn_logit_softcapping\": -50.0"),
            ),
            ("hidden_activation", ("\"gelu_pytorch_tanh\"", "\"relu\"")),
            (
                "use_bidirectional_attention",
                (
                    "\"use_bidirectional_attention\": false",
                    "\"use_bidirectional_attention\": true",
                ),
            ),
            (
                "layer_types",
                ("\"full_attention\"\n  ]", "\"full_attention\", \"full_attention\"\n  ]"),
            ),
        ] {
            let changed = text.replacen(edit.0, edit.1, 1);
            assert_ne!(changed, text, "{field}: the edit applies");
            let error = ModelConfig::from_json(&changed).unwrap_err().to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn gemma2_reads_its_caps_and_layers_and_back() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/parity/gemma2/config.json");
        let c = ModelConfig::from_file(path).unwrap();
        assert_eq!(
            (c.family, c.rope_theta, c.sliding_window),
            (Family::Gemma2, 10_000.0, Some(4))
        );
        assert_eq!(c.sliding_layers, [true, false]);
        assert!(!c.qk_norm && c.tie_embeddings);
        assert_eq!((c.attention_softcap(), c.final_softcap()), (Some(1.0), Some(3.0)));
        assert_eq!(c.local_rope_inverse_frequencies(), None, "one RoPE base");
        assert_eq!(c.attention_scale(), 1.0 / 12f64.sqrt());
        let back = c.to_hf_json();
        assert!(back.get("rope_local_base_freq").is_none());
        // An integer, as transformers' Gemma configs require.
        assert!(back["query_pre_attn_scalar"].is_i64(), "{back}");
        assert_eq!(ModelConfig::from_json(&back.to_string()).unwrap(), c);
        // Without layer_types, transformers slides every other layer, the first included.
        let mut json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("layer_types");
        json["num_hidden_layers"] = 5.into();
        let c = ModelConfig::from_json(&json.to_string()).unwrap();
        assert_eq!(c.sliding_layers, [true, false, true, false, true]);
        for (field, value) in [
            ("rope_local_base_freq", Value::from(10_000.0)),
            ("sliding_window_pattern", Value::from(6)),
            ("final_logit_softcapping", Value::from(0.0)),
        ] {
            let mut changed = json.clone();
            changed[field] = value;
            let error = ModelConfig::from_json(&changed.to_string()).unwrap_err().to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    /// Qwen3-30B-A3B's config.json (the Hub's field names).
    const QWEN3_MOE: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "tie_word_embeddings": false,
        "hidden_act": "silu", "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
        "output_router_logits": false, "bos_token_id": 151643, "eos_token_id": 151645}"#;

    #[test]
    fn reads_qwen3_moe_experts_and_back() {
        let c = ModelConfig::from_json(QWEN3_MOE).unwrap();
        let e = c.experts.clone().unwrap();
        assert_eq!((e.count, e.top_k, e.intermediate_size), (128, 8, 768));
        assert!(e.normalize_top_k && !e.output_router_logits && c.qk_norm);
        assert!(c.experts_of(0).is_some() && c.experts_of(47).is_some());
        assert_eq!(ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap(), c);
        // transformers 5 writes num_local_experts; every other layer sparse, layer 1 dense.
        let mixed = QWEN3_MOE
            .replace("\"num_experts\"", "\"num_local_experts\"")
            .replace("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2")
            .replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [3]");
        let c = ModelConfig::from_json(&mixed).unwrap();
        let sparse: Vec<bool> = (0..6).map(|l| c.experts_of(l).is_some()).collect();
        assert_eq!(sparse, [false, true, false, false, false, true]);
        assert_eq!(ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap(), c);
        // No experts at all: the plain MLP everywhere.
        let dense = QWEN3_MOE.replace("\"num_experts\": 128", "\"num_experts\": 0");
        assert_eq!(ModelConfig::from_json(&dense).unwrap().experts, None);
        for (from, to, field) in [
            (
                "\"num_experts_per_tok\": 8",
                "\"num_experts_per_tok\": 129",
                "num_experts_per_tok",
            ),
            (
                "\"num_experts_per_tok\": 8",
                "\"num_experts_per_tok\": 0",
                "num_experts_per_tok",
            ),
            (
                "\"decoder_sparse_step\": 1",
                "\"decoder_sparse_step\": 0",
                "decoder_sparse_step",
            ),
            (
                "\"mlp_only_layers\": []",
                "\"mlp_only_layers\": [48]",
                "mlp_only_layers",
            ),
            (
                "\"moe_intermediate_size\": 768",
                "\"moe_intermediate_size\": 0",
                "moe_intermediate_size",
            ),
            (
                "\"router_aux_loss_coef\": 0.001",
                "\"router_aux_loss_coef\": -1",
                "router_aux_loss_coef",
            ),
            (
                "\"use_sliding_window\": false",
                "\"use_sliding_window\": true",
                "use_sliding_window",
            ),
        ] {
            let error = ModelConfig::from_json(&QWEN3_MOE.replace(from, to))
                .unwrap_err()
                .to_string();
            assert!(error.contains(field), "{to}: {error}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let other = LLAMA
            .replace("LlamaForCausalLM", "GemmaForCausalLM")
            .replace("\"llama\"", "\"gemma\"");
        let error = ModelConfig::from_json(&other).unwrap_err().to_string();
        assert!(
            error.contains("GemmaForCausalLM") && error.contains("architectures") && error.contains("Phi3ForCausalLM"),
            "{error}"
        );
        let partial = LLAMA.replace("\"rms_norm_eps\"", "\"partial_rotary_factor\": 0.75, \"rms_norm_eps\"");
        let error = ModelConfig::from_json(&partial).unwrap_err().to_string();
        assert!(error.contains("partial_rotary_factor"), "{error}");
        let nested = LLAMA.replace(
            "\"rope_theta\": 100000.0",
            "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 100000.0, \"partial_rotary_factor\": 0.5}",
        );
        let error = ModelConfig::from_json(&nested).unwrap_err().to_string();
        assert!(error.contains("partial_rotary_factor"), "{error}");
        let empty_window = LLAMA
            .replace("LlamaForCausalLM", "MistralForCausalLM")
            .replace("\"llama\"", "\"mistral\"")
            .replace("\"rms_norm_eps\"", "\"sliding_window\": 0, \"rms_norm_eps\"");
        let error = ModelConfig::from_json(&empty_window).unwrap_err().to_string();
        assert!(error.contains("sliding_window"), "{error}");
        let gelu = LLAMA.replace("\"silu\"", "\"gelu\"");
        assert!(
            ModelConfig::from_json(&gelu)
                .unwrap_err()
                .to_string()
                .contains("hidden_act")
        );
        let yarn = LLAMA.replace(
            "\"rope_theta\"",
            "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}, \"rope_theta\"",
        );
        assert!(ModelConfig::from_json(&yarn).unwrap_err().to_string().contains("yarn"));
        let heads = LLAMA.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4");
        assert!(
            ModelConfig::from_json(&heads)
                .unwrap_err()
                .to_string()
                .contains("num_key_value_heads")
        );
        assert!(matches!(ModelConfig::from_json("{}"), Err(Error::Format { .. })));
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let scaled = LLAMA.replace(
            "\"rope_theta\"",
            "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}, \"rope_theta\"",
        );
        let plain = ModelConfig::from_json(LLAMA).unwrap().rope_inverse_frequencies();
        let c = ModelConfig::from_json(&scaled).unwrap();
        let inv = c.rope_inverse_frequencies();
        assert_eq!(inv[0], plain[0], "short wavelengths are kept");
        assert!(
            (inv[31] - plain[31] / 8.0).abs() < 1e-12,
            "long wavelengths are divided by the factor"
        );
    }
}
