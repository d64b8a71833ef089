//! GGUF files of the `llama`, `qwen2`, `qwen3` and `qwen3moe`
//! architectures as Hugging Face checkpoints: tensor names, the row order
//! of the rotary projections, and `config.json`.
//!
//! For `llama`, llama.cpp's converter reorders the rows of `attn_q` /
//! `attn_k` for its rotary layout (interleaved pairs); Hugging Face rotates
//! the two halves of each head. Per weight, Hugging Face order is
//! `reshape(heads, head_dim/2, 2, in) → swap axes 1 and 2 → reshape(out,
//! in)` of the GGUF rows. The Qwen files rotate halves as Hugging Face does
//! (NeoX style): their rows stay. `qwen3moe`'s experts are stored stacked
//! (`blk.N.ffn_gate_exps` `[experts, inner, hidden]`), as the decoder holds
//! them (`model.layers.N.mlp.experts.gate_proj`, see [`crate::experts`]);
//! the layers with a router (`ffn_gate_inp`) are the sparse ones, and
//! llama.cpp renormalizes the chosen experts' weights unless
//! `qwen3moe.expert_weights_norm` says otherwise.

use serde_json::{Value, json};

use super::reader::GgufFile;
use crate::{Error, Result};

/// Per-layer tensors: GGUF name (after `blk.N.`) and Hugging Face name
/// (after `model.layers.N.`).
const LAYER_NAMES: [(&str, &str); 12] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
];

/// A sparse layer's stacked experts: GGUF name (after `blk.N.`, before
/// `.weight`) and the decoder's name (after `model.layers.N.`, no suffix).
const EXPERT_NAMES: [(&str, &str); 3] = [
    ("ffn_gate_exps", "mlp.experts.gate_proj"),
    ("ffn_up_exps", "mlp.experts.up_proj"),
    ("ffn_down_exps", "mlp.experts.down_proj"),
];

/// The GGUF architectures grpo maps to Hugging Face.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    /// `llama` (Llama, SmolLM2): rotary rows permuted.
    Llama,
    /// `qwen2` (Qwen2, Qwen2.5): q/k/v biases.
    Qwen2,
    /// `qwen3` (Qwen3 dense): q/k norms.
    Qwen3,
    /// `qwen3moe` (Qwen3-MoE): q/k norms, routers and stacked experts.
    Qwen3Moe,
}

impl Arch {
    /// The architecture of `file` (`general.architecture`); others are refused.
    fn of(file: &GgufFile) -> Result<Arch> {
        match file.get_str("general.architecture")? {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            other => Err(config_error(
                file,
                "general.architecture",
                &format!("is `{other}`; grpo maps `llama`, `qwen2`, `qwen3` and `qwen3moe` GGUF files to Hugging Face"),
            )),
        }
    }

    /// The prefix of its metadata keys.
    fn key(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// A tensor in Hugging Face naming and layout.
#[derive(Clone, Debug, PartialEq)]
pub struct HfTensor {
    /// Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Dimensions, outermost first (`[out, in]` for a linear weight).
    pub dims: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

/// The Hugging Face name of a GGUF tensor (`blk.3.ffn_up.weight` →
/// `model.layers.3.mlp.up_proj.weight`; stacked experts as the decoder
/// names them, `blk.3.ffn_gate_exps.weight` →
/// `model.layers.3.mlp.experts.gate_proj`), or `None` for a tensor that has
/// none (`rope_freqs.weight`, other architectures' names).
pub fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    if let Some((layer, part)) = layer_part(stem)
        && let Some((_, hf_part)) = EXPERT_NAMES.iter().find(|(g, _)| *g == part)
    {
        return (suffix == "weight").then(|| format!("model.layers.{layer}.{hf_part}"));
    }
    let hf = match stem {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let (layer, part) = layer_part(stem)?;
            let (_, hf_part) = LAYER_NAMES.iter().find(|(g, _)| *g == part)?;
            format!("model.layers.{layer}.{hf_part}")
        }
    };
    Some(format!("{hf}.{suffix}"))
}

/// Tensor `gguf_name` of a GGUF file, dequantized, with its Hugging Face
/// name, and a llama file's `q_proj` / `k_proj` rows put back in Hugging Face order.
pub fn hf_tensor_f32(file: &GgufFile, gguf_name: &str) -> Result<HfTensor> {
    let arch = Arch::of(file)?;
    let fail = |message: &str| Error::Tensor {
        path: file.path().to_path_buf(),
        tensor: gguf_name.into(),
        message: message.into(),
    };
    let name = hf_tensor_name(gguf_name).ok_or_else(|| fail("has no Hugging Face equivalent"))?;
    let (dims, data) = file.tensor_f32(gguf_name)?;
    let permuted = match arch {
        Arch::Llama => rotary_heads(file, gguf_name)?,
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => None,
    };
    let data = match permuted {
        None => data,
        Some(heads) => {
            let rows = dims.first().copied().unwrap_or(0);
            unpermute_rotary(&data, rows, heads)
                .ok_or_else(|| fail(&format!("{rows} rows are not {heads} heads of an even size")))?
        }
    };
    Ok(HfTensor { name, dims, data })
}

/// A Hugging Face `config.json` (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
/// `Qwen3ForCausalLM` or `Qwen3MoeForCausalLM`) from the metadata of a GGUF file. Embeddings are
/// tied when the file has no `output.weight`.
pub fn hf_config_json(file: &GgufFile) -> Result<Value> {
    let arch = Arch::of(file)?;
    let key = |name: &str| format!("{}.{name}", arch.key());
    let hidden = file.get_u32(&key("embedding_length"))?;
    let heads = file.get_u32(&key("attention.head_count"))?;
    if heads == 0 {
        return Err(config_error(file, &key("attention.head_count"), "is 0"));
    }
    if let Some(scaling) = file.get(&key("rope.scaling.type"))
        && scaling.as_str() != Some("none")
    {
        return Err(config_error(
            file,
            &key("rope.scaling.type"),
            &format!("holds {scaling}: rope scaling is not supported"),
        ));
    }
    let vocab_size = match file.optional(&key("vocab_size"), GgufFile::get_u32)? {
        Some(n) => n,
        None => file.get_string_array("tokenizer.ggml.tokens")?.len() as u32,
    };
    let token_id = |name: &str| file.optional(name, GgufFile::get_u32);
    let rope_theta = file.optional(&key("rope.freq_base"), GgufFile::get_f32)?;
    let layers = file.get_u32(&key("block_count"))?;
    let mut config = json!({
        "hidden_act": "silu",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads(file, arch)?,
        "head_dim": u32_or(file, &key("attention.key_length"), hidden / heads)?,
        "rope_theta": f32_json(rope_theta.unwrap_or(10000.0)),
        "rope_scaling": null,
        "rms_norm_eps": f32_json(file.get_f32(&key("attention.layer_norm_rms_epsilon"))?),
        "max_position_embeddings": file.get_u32(&key("context_length"))?,
        "vocab_size": vocab_size,
        "tie_word_embeddings": file.tensor("output.weight").is_none(),
        "attention_bias": file.tensor("blk.0.attn_q.bias").is_some(),
        "mlp_bias": file.tensor("blk.0.ffn_up.bias").is_some(),
        "bos_token_id": token_id("tokenizer.ggml.bos_token_id")?,
        "eos_token_id": token_id("tokenizer.ggml.eos_token_id")?,
        "pad_token_id": token_id("tokenizer.ggml.padding_token_id")?,
    });
    let fields = config.as_object_mut().expect("an object");
    match arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
            let (architecture, model_type) = match arch {
                Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
                Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
                _ => ("LlamaForCausalLM", "llama"),
            };
            fields.insert("architectures".into(), json!([architecture]));
            fields.insert("model_type".into(), model_type.into());
            fields.insert(
                "intermediate_size".into(),
                file.get_u32(&key("feed_forward_length"))?.into(),
            );
        }
        Arch::Qwen3Moe => {
            let expert_size = file.get_u32(&key("expert_feed_forward_length"))?;
            let dense: Vec<u32> = (0..layers)
                .filter(|l| file.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none())
                .collect();
            let normalize = file.optional(&key("expert_weights_norm"), GgufFile::get_bool)?;
            fields.insert("architectures".into(), json!(["Qwen3MoeForCausalLM"]));
            fields.insert("model_type".into(), "qwen3_moe".into());
            fields.insert(
                "intermediate_size".into(),
                u32_or(file, &key("feed_forward_length"), expert_size)?.into(),
            );
            fields.insert("num_experts".into(), file.get_u32(&key("expert_count"))?.into());
            fields.insert(
                "num_experts_per_tok".into(),
                file.get_u32(&key("expert_used_count"))?.into(),
            );
            fields.insert("moe_intermediate_size".into(), expert_size.into());
            fields.insert("norm_topk_prob".into(), normalize.unwrap_or(true).into());
            fields.insert("decoder_sparse_step".into(), 1.into());
            fields.insert("mlp_only_layers".into(), dense.into());
            fields.insert("use_sliding_window".into(), false.into());
        }
    }
    Ok(config)
}

fn config_error(file: &GgufFile, field: &str, problem: &str) -> Error {
    Error::Config {
        field: field.into(),
        message: format!("{}: {problem}", file.path().display()),
    }
}

/// `blk.N.part` → `(N, part)`.
fn layer_part(stem: &str) -> Option<(&str, &str)> {
    let (layer, part) = stem.strip_prefix("blk.")?.split_once('.')?;
    let is_number = !layer.is_empty() && layer.bytes().all(|b| b.is_ascii_digit());
    is_number.then_some((layer, part))
}

/// The head count whose rotary rows `gguf_name` holds, for `attn_q` / `attn_k`.
fn rotary_heads(file: &GgufFile, gguf_name: &str) -> Result<Option<usize>> {
    let part = gguf_name
        .rsplit_once('.')
        .and_then(|(stem, _)| layer_part(stem))
        .map(|(_, part)| part);
    let heads = match part {
        Some("attn_q") => file.get_u32("llama.attention.head_count")?,
        Some("attn_k") => kv_heads(file, Arch::Llama)?,
        _ => return Ok(None),
    };
    Ok(Some(heads as usize))
}

/// `<arch>.attention.head_count_kv`, defaulting to the query head count.
fn kv_heads(file: &GgufFile, arch: Arch) -> Result<u32> {
    let heads = file.get_u32(&format!("{}.attention.head_count", arch.key()))?;
    u32_or(file, &format!("{}.attention.head_count_kv", arch.key()), heads)
}

/// The integer `key`, or `default` when absent.
fn u32_or(file: &GgufFile, key: &str, default: u32) -> Result<u32> {
    Ok(file.optional(key, GgufFile::get_u32)?.unwrap_or(default))
}

/// An f32 as the JSON number of its shortest decimal (`1e-5`, not
/// `9.99999974e-6`), as Hugging Face configs write it.
fn f32_json(x: f32) -> Value {
    x.to_string().parse::<f64>().map_or(Value::Null, |v| json!(v))
}

/// Rows `rows` of `data` from GGUF to Hugging Face rotary order: GGUF row
/// `h·d + 2i + j` becomes row `h·d + j·d/2 + i` (head `h` of size `d`).
/// `None` if `rows` is not `heads` heads of an even size.
fn unpermute_rotary(data: &[f32], rows: usize, heads: usize) -> Option<Vec<f32>> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) || !data.len().is_multiple_of(rows) {
        return None;
    }
    let (cols, head_dim) = (data.len() / rows, rows / heads);
    let mut out = Vec::with_capacity(data.len());
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..head_dim / 2 {
                let src = h * head_dim + 2 * i + j;
                out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Some(out)
}
