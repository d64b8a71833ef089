//! Llama-architecture GGUF files as Hugging Face checkpoints: tensor names,
//! the row order of the rotary projections, and `config.json`.
//!
//! llama.cpp's converter reorders the rows of `attn_q` / `attn_k` for its
//! rotary layout (interleaved pairs); Hugging Face rotates the two halves of
//! each head. Per weight, Hugging Face order is `reshape(heads, head_dim/2, 2,
//! in) → swap axes 1 and 2 → reshape(out, in)` of the GGUF rows.

use serde_json::{Value, json};

use super::reader::GgufFile;
use crate::{Error, Result};

/// Per-layer tensors: GGUF name (after `blk.N.`) and Hugging Face name
/// (after `model.layers.N.`).
const LAYER_NAMES: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

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

/// The Hugging Face name of a llama GGUF tensor (`blk.3.ffn_up.weight` →
/// `model.layers.3.mlp.up_proj.weight`), or `None` for a tensor that has
/// none (`rope_freqs.weight`, other architectures' names).
pub fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
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

/// Tensor `gguf_name` of a llama GGUF file, dequantized, with its Hugging
/// Face name, and `q_proj` / `k_proj` rows put back in Hugging Face order.
pub fn hf_tensor_f32(file: &GgufFile, gguf_name: &str) -> Result<HfTensor> {
    require_llama(file)?;
    let fail = |message: &str| Error::Tensor {
        path: file.path().to_path_buf(),
        tensor: gguf_name.into(),
        message: message.into(),
    };
    let name = hf_tensor_name(gguf_name).ok_or_else(|| fail("has no Hugging Face llama equivalent"))?;
    let (dims, data) = file.tensor_f32(gguf_name)?;
    let data = match rotary_heads(file, gguf_name)? {
        None => data,
        Some(heads) => {
            let rows = dims.first().copied().unwrap_or(0);
            unpermute_rotary(&data, rows, heads)
                .ok_or_else(|| fail(&format!("{rows} rows are not {heads} heads of an even size")))?
        }
    };
    Ok(HfTensor { name, dims, data })
}

/// A Hugging Face `LlamaForCausalLM` `config.json` from the metadata of a
/// llama GGUF file. Embeddings are tied when the file has no `output.weight`.
pub fn hf_config_json(file: &GgufFile) -> Result<Value> {
    require_llama(file)?;
    let hidden = file.get_u32("llama.embedding_length")?;
    let heads = file.get_u32("llama.attention.head_count")?;
    if heads == 0 {
        return Err(config_error(file, "llama.attention.head_count", "is 0"));
    }
    if let Some(scaling) = file.get("llama.rope.scaling.type")
        && scaling.as_str() != Some("none")
    {
        return Err(config_error(
            file,
            "llama.rope.scaling.type",
            &format!("holds {scaling}: rope scaling is not supported"),
        ));
    }
    let vocab_size = match file.optional("llama.vocab_size", GgufFile::get_u32)? {
        Some(n) => n,
        None => file.get_string_array("tokenizer.ggml.tokens")?.len() as u32,
    };
    let token_id = |key: &str| file.optional(key, GgufFile::get_u32);
    let rope_theta = file.optional("llama.rope.freq_base", GgufFile::get_f32)?;
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": file.get_u32("llama.feed_forward_length")?,
        "num_hidden_layers": file.get_u32("llama.block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads(file)?,
        "head_dim": u32_or(file, "llama.attention.key_length", hidden / heads)?,
        "rope_theta": f32_json(rope_theta.unwrap_or(10000.0)),
        "rope_scaling": null,
        "rms_norm_eps": f32_json(file.get_f32("llama.attention.layer_norm_rms_epsilon")?),
        "max_position_embeddings": file.get_u32("llama.context_length")?,
        "vocab_size": vocab_size,
        "tie_word_embeddings": file.tensor("output.weight").is_none(),
        "attention_bias": file.tensor("blk.0.attn_q.bias").is_some(),
        "mlp_bias": file.tensor("blk.0.ffn_up.bias").is_some(),
        "bos_token_id": token_id("tokenizer.ggml.bos_token_id")?,
        "eos_token_id": token_id("tokenizer.ggml.eos_token_id")?,
        "pad_token_id": token_id("tokenizer.ggml.padding_token_id")?,
    }))
}

/// Refuses files whose `general.architecture` is not `llama`.
fn require_llama(file: &GgufFile) -> Result<()> {
    let arch = file.get_str("general.architecture")?;
    if arch == "llama" {
        Ok(())
    } else {
        Err(config_error(
            file,
            "general.architecture",
            &format!("is `{arch}`; grpo maps only `llama` GGUF files to Hugging Face"),
        ))
    }
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
        Some("attn_k") => kv_heads(file)?,
        _ => return Ok(None),
    };
    Ok(Some(heads as usize))
}

/// `llama.attention.head_count_kv`, defaulting to the query head count.
fn kv_heads(file: &GgufFile) -> Result<u32> {
    let heads = file.get_u32("llama.attention.head_count")?;
    u32_or(file, "llama.attention.head_count_kv", heads)
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
