//! The parameters of a decoder in Hugging Face names and shapes, in the
//! order the traced programs take them. Checkpoint loading and saving, and
//! weight sync, use this one list.

use crate::config::ModelConfig;

/// A parameter's Hugging Face name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Dimensions, outermost first (linear weights are `[out, in]`, as in PyTorch).
    pub dims: Vec<usize>,
}

/// Builds dotted names under a prefix (`model.layers.3` → `model.layers.3.mlp`).
#[derive(Debug, Clone)]
struct Prefix(String);

impl Prefix {
    fn pp(&self, part: impl std::fmt::Display) -> Prefix {
        Prefix(format!("{}.{part}", self.0))
    }

    fn name(&self, leaf: &str) -> String {
        format!("{}.{leaf}", self.0)
    }
}

/// Every parameter of the decoder described by `config`, in program order:
/// embeddings, then per layer the attention and MLP weights (a sparse
/// layer's router and stacked experts), the final norm, and `lm_head` when
/// embeddings are not tied.
pub fn parameters(config: &ModelConfig) -> Vec<ParamSpec> {
    let (h, i, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let q = config.heads * config.head_dim;
    let kv = config.kv_heads * config.head_dim;
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<usize>| out.push(ParamSpec { name, dims });
    let model = Prefix("model".to_string());
    add(model.pp("embed_tokens").name("weight"), vec![v, h]);
    for layer in 0..config.layers {
        let block = model.pp("layers").pp(layer);
        add(block.pp("input_layernorm").name("weight"), vec![h]);
        let attn = block.pp("self_attn");
        if config.fused_projections {
            add(attn.pp("qkv_proj").name("weight"), vec![q + 2 * kv, h]);
        } else {
            for (proj, out_dim) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                add(attn.pp(proj).name("weight"), vec![out_dim, h]);
                if config.qkv_bias {
                    add(attn.pp(proj).name("bias"), vec![out_dim]);
                }
            }
        }
        add(attn.pp("o_proj").name("weight"), vec![h, q]);
        if config.qk_norm {
            add(attn.pp("q_norm").name("weight"), vec![config.head_dim]);
            add(attn.pp("k_norm").name("weight"), vec![config.head_dim]);
        }
        add(block.pp("post_attention_layernorm").name("weight"), vec![h]);
        if config.gemma.is_some() {
            add(block.pp("pre_feedforward_layernorm").name("weight"), vec![h]);
            add(block.pp("post_feedforward_layernorm").name("weight"), vec![h]);
        }
        let mlp = block.pp("mlp");
        if let Some(experts) = config.experts_of(layer) {
            // The router, then each projection of every expert stacked
            // (`[experts, out, in]`; see `crate::experts` for the checkpoint layout).
            let (e, ei) = (experts.count, experts.intermediate_size);
            add(mlp.pp("gate").name("weight"), vec![e, h]);
            let stacked = mlp.pp("experts");
            add(stacked.name("gate_proj"), vec![e, ei, h]);
            add(stacked.name("up_proj"), vec![e, ei, h]);
            add(stacked.name("down_proj"), vec![e, h, ei]);
            continue;
        }
        if config.fused_projections {
            add(mlp.pp("gate_up_proj").name("weight"), vec![2 * i, h]);
        } else {
            add(mlp.pp("gate_proj").name("weight"), vec![i, h]);
            add(mlp.pp("up_proj").name("weight"), vec![i, h]);
        }
        add(mlp.pp("down_proj").name("weight"), vec![h, i]);
    }
    add(model.pp("norm").name("weight"), vec![h]);
    if !config.tie_embeddings {
        add("lm_head.weight".to_string(), vec![v, h]);
    }
    out
}
