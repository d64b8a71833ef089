#!/usr/bin/env python3
"""Reference fixtures for the Gemma 2 / Gemma 3 / Llama / Mistral / Phi-3 / Qwen2 / Qwen3 / Qwen3-MoE decoders: tiny random
models built with Hugging Face transformers, their per-token log-probabilities
and entropies on a fixed padded batch, and the gradient of the masked
log-probability sum with respect to every parameter.

Regenerate (from the repository root; tools/venv.sh creates or extends the
venv with torch, transformers and safetensors and prints its python):

    "$(tools/venv.sh)" tools/make_parity_fixtures.py

Writes model/tests/fixtures/parity/<family>/{config.json, model.safetensors,
inputs.json, expected.safetensors} for family in llama, qwen2, qwen3, mistral,
phi3, gemma3, gemma2, qwen3_moe, and
model/tests/fixtures/parity/README.md (the definitions, the versions). The
output is deterministic (CPU, fixed seeds): a rerun rewrites the same bytes.
"""

import contextlib
import copy
import json
import math
import shutil
import sys
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_moe import modeling_qwen3_moe

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "model" / "tests" / "fixtures" / "parity"
MAX_TOTAL_BYTES = 2 * 1024 * 1024

BATCH, SEQ, PAD_TAIL, PAD_ID = 2, 12, 4, 0
VOCAB = 128
MATRIX_STD = 0.2  # weights and embeddings ~ N(0, 0.2^2): attention is far from uniform
BIAS_STD = 0.1  # q/k/v biases (qwen2) ~ N(0, 0.1^2)
NORM_STD = 0.1  # every RMSNorm weight ~ 1 + N(0, 0.1^2)
GRAD_F32_VS_F64_RTOL = 1e-5  # ||g32 - g64|| / ||g64||, per parameter
LOGPROB_F32_VS_F64_ATOL = 1e-5
SOFTCAP_FINAL = 3.0  # gemma2's caps
SOFTCAP_ATTENTION = 1.0

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    initializer_range=MATRIX_STD,  # only recorded: build() overwrites every parameter
    attn_implementation="eager",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
ROPE_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}
ROPE_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

# (family, config class, model class, modeling module, extra config); the
# index is the torch seed.
FAMILIES = [
    ("llama", LlamaConfig, LlamaForCausalLM, modeling_llama,
     dict(head_dim=8, tie_word_embeddings=False, rope_parameters=ROPE_LLAMA3)),
    ("qwen2", Qwen2Config, Qwen2ForCausalLM, modeling_qwen2,
     dict(tie_word_embeddings=True, rope_parameters=ROPE_DEFAULT, use_sliding_window=False)),
    ("qwen3", Qwen3Config, Qwen3ForCausalLM, modeling_qwen3,
     dict(head_dim=16, tie_word_embeddings=False, rope_parameters=ROPE_DEFAULT,
          attention_bias=False, use_sliding_window=False)),
    # Sliding windows narrower than the batch's 12 tokens, so that they matter.
    ("mistral", MistralConfig, MistralForCausalLM, modeling_mistral,
     dict(head_dim=8, tie_word_embeddings=False, rope_parameters=ROPE_DEFAULT, sliding_window=5)),
    # Fused qkv_proj and gate_up_proj.
    ("phi3", Phi3Config, Phi3ForCausalLM, modeling_phi3,
     dict(tie_word_embeddings=False, rope_parameters=ROPE_DEFAULT, sliding_window=7,
          resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    # A sliding layer (window 4) then a global one, each with its own RoPE
    # base; scores scaled by query_pre_attn_scalar 12 (not head_dim 8); tied.
    ("gemma3", Gemma3TextConfig, Gemma3ForCausalLM, modeling_gemma3,
     dict(head_dim=8, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
          query_pre_attn_scalar=12, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                           "full_attention": {"rope_type": "default", "rope_theta": 100.0}},
          final_logit_softcapping=None, attn_logit_softcapping=None)),
    # Gemma 2: transformers' default layers (0 sliding, window 4; 1 global),
    # one RoPE base, and caps low enough to bend the scores and the logits.
    ("gemma2", Gemma2Config, Gemma2ForCausalLM, modeling_gemma2,
     dict(head_dim=8, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
          query_pre_attn_scalar=12, sliding_window=4, rope_parameters=ROPE_DEFAULT,
          final_logit_softcapping=SOFTCAP_FINAL, attn_logit_softcapping=SOFTCAP_ATTENTION)),
    # Qwen3-MoE: 3 layers, 0 and 2 sparse (4 experts of width 16, top 2,
    # renormalized), 1 dense (mlp_only_layers); experts run by transformers'
    # eager loop.
    ("qwen3_moe", Qwen3MoeConfig, Qwen3MoeForCausalLM, modeling_qwen3_moe,
     dict(head_dim=8, tie_word_embeddings=False, rope_parameters=ROPE_DEFAULT, attention_bias=False,
          use_sliding_window=False, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
          router_aux_loss_coef=0.01, experts_implementation="eager")),
]
MOE_AUX_F32_VS_F64_RTOL = 1e-5
GREEDY_PROMPT, GREEDY_TOKENS = [5, 17, 99], 6  # qwen3_moe's greedy continuation


def check(cond, msg):
    if not cond:
        sys.exit(f"make_parity_fixtures.py: FAILED: {msg}")


# --- f64 evaluation ---------------------------------------------------------
# HF's decoders upcast to f32, not to the input dtype, in three places: RMSNorm
# (`hidden_states.to(torch.float32)`), the eager attention softmax
# (`softmax(..., dtype=torch.float32)`) and the rotary table (`.float()`). A
# plain `.double()` copy would therefore still be f32 there. For the f64
# reference these three compute in f64 instead (same formulas, for f32 inputs
# exactly HF's code path); the rotary frequencies stay HF's inv_freq buffer
# (computed in f32 at construction), only position * inv_freq, cos and sin are
# f64.


def _rms_norm_forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.promote_types(input_dtype, torch.float32))
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * h.to(input_dtype)


def _rotary_forward(self, x, position_ids):
    dt = torch.promote_types(x.dtype, torch.float32)
    freqs = position_ids[..., None].to(dt) * self.inv_freq.to(device=x.device, dtype=dt)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _gemma_norm_forward(self, x):
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
    return (h * (1.0 + self.weight.to(h.dtype))).type_as(x)


def _gemma_rotary_forward(self, x, position_ids, layer_type):
    dt = torch.promote_types(x.dtype, torch.float32)
    inv_freq = getattr(self, f"{layer_type}_inv_freq")
    scaling = getattr(self, f"{layer_type}_attention_scaling")
    freqs = position_ids[..., None].to(dt) * inv_freq.to(device=x.device, dtype=dt)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype=x.dtype), (emb.sin() * scaling).to(dtype=x.dtype)


@contextlib.contextmanager
def true_f64(module, family):
    prefix = {"llama": "Llama", "mistral": "Mistral", "phi3": "Phi3", "qwen2": "Qwen2", "qwen3": "Qwen3",
              "gemma2": "Gemma2", "gemma3": "Gemma3", "qwen3_moe": "Qwen3Moe"}[family]
    norm_cls = getattr(module, f"{prefix}RMSNorm")
    rope_cls = getattr(module, f"{prefix}RotaryEmbedding")
    norm_forward = _gemma_norm_forward if family.startswith("gemma") else _rms_norm_forward
    rope_forward = _gemma_rotary_forward if family == "gemma3" else _rotary_forward
    saved = (norm_cls.forward, rope_cls.forward, F.softmax)
    orig_softmax = F.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = torch.float64
        return orig_softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    norm_cls.forward, rope_cls.forward, torch.nn.functional.softmax = (norm_forward, rope_forward, softmax)
    try:
        yield
    finally:
        norm_cls.forward, rope_cls.forward, torch.nn.functional.softmax = saved


# --- the quantities ---------------------------------------------------------


def token_stats(model, input_ids, attention_mask):
    """logprobs [B, T-1], entropy [B, T-1], mask [B, T-1], shifted logits."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    shifted = logits[:, :-1, :]
    logp_all = torch.log_softmax(shifted, dim=-1)
    targets = input_ids[:, 1:]
    logprobs = logp_all.gather(-1, targets[..., None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = attention_mask[:, 1:].to(logits.dtype)
    return logprobs, entropy, mask, shifted


def grads_of_masked_sum(model, input_ids, attention_mask):
    model.zero_grad(set_to_none=True)
    logprobs, entropy, mask, shifted = token_stats(model, input_ids, attention_mask)
    (logprobs * mask).sum().backward()
    grads = {}
    for name, p in model.named_parameters():
        check(p.grad is not None, f"no gradient for {name}")
        grads[name] = p.grad.detach().clone()
    return logprobs.detach(), entropy.detach(), mask, shifted.detach(), grads


def balance_and_grads(model, input_ids, attention_mask):
    """transformers' load-balancing loss (without its coefficient) over the
    real tokens, and its gradient per parameter (zeros where none flows)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_router_logits=True)
    out.aux_loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for n, p in model.named_parameters()}
    return out.aux_loss.detach(), grads


def grpo_names(grads, cfg):
    """Gradients under grpo's parameter names: transformers 5 holds each
    sparse layer's gate and up projections fused (`experts.gate_up_proj`,
    gate rows first); grpo stacks them apart (`experts.gate_proj`, `experts.up_proj`)."""
    out = {}
    for n, g in grads.items():
        if n.endswith("experts.gate_up_proj"):
            half = cfg.moe_intermediate_size
            stem = n[: -len("gate_up_proj")]
            out[stem + "gate_proj"] = g[:, :half]
            out[stem + "up_proj"] = g[:, half:]
        else:
            out[n] = g
    return out


def build(index, family, config_cls, model_cls, extra):
    torch.manual_seed(index)
    common = dict(COMMON)
    if family.startswith("gemma"):
        del common["hidden_act"]  # Gemma names it hidden_activation
    config = config_cls(**{**common, **extra})
    model = model_cls(config).to(torch.float32)
    # Gemma's norms scale by 1 + weight: the same scales as the others' weights.
    norm_mean = 0.0 if family.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # input/post_attention_layernorm, model.norm, q_norm, k_norm
                p.copy_(norm_mean + NORM_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn_like(p))
            else:
                p.copy_(MATRIX_STD * torch.randn_like(p))
    model.eval()  # no dropout anywhere (attention_dropout is 0 too); gradients still flow
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, SEQ - PAD_TAIL:] = 0
    input_ids[1, SEQ - PAD_TAIL:] = PAD_ID
    return model, input_ids, attention_mask


def hub_names(model):
    """The tensors `save_pretrained` writes: the named parameters, with each
    sparse layer's stacked experts split into one tensor per expert and
    projection (`mlp.experts.E.gate_proj.weight`), as checkpoints on the Hub hold them."""
    out = {}
    for n, p in model.named_parameters():
        p = p.detach()
        if n.endswith("experts.gate_up_proj"):
            gate, up = p.chunk(2, dim=1)
            for e in range(p.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate[e]
                out[n.replace("gate_up_proj", f"{e}.up_proj.weight")] = up[e]
        elif n.endswith("experts.down_proj"):
            for e in range(p.shape[0]):
                out[n.replace("down_proj", f"{e}.down_proj.weight")] = p[e]
        else:
            out[n] = p
    return out


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(index, family, config_cls, model_cls, module, extra):
    model, input_ids, attention_mask = build(index, family, config_cls, model_cls, extra)
    cfg = model.config
    names = [n for n, _ in model.named_parameters()]

    # Configuration checks: what each fixture is meant to exercise.
    check(cfg.num_key_value_heads < cfg.num_attention_heads, "GQA")
    if family == "qwen3":
        check(cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size, "qwen3 head_dim override")
    if family == "qwen2":
        for n, p in model.named_parameters():
            if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                check(bool((p != 0).all()), f"{n} has zeros")
        check(sum(n.endswith("proj.bias") for n in names) == 3 * cfg.num_hidden_layers, "qwen2 q/k/v biases")
    else:
        check(not any(n.endswith(".bias") for n in names), f"{family} has no biases")
    if cfg.tie_word_embeddings:
        check("lm_head.weight" not in names, "tied lm_head listed once, as model.embed_tokens.weight")
        check(model.lm_head.weight is model.model.embed_tokens.weight, f"{family} tie")
    else:
        check("lm_head.weight" in names, f"{family} untied lm_head")
    if family == "gemma3":
        check(cfg.layer_types == ["sliding_attention", "full_attention"], "gemma3 layer types")
        check(cfg.sliding_window < SEQ - PAD_TAIL, "gemma3 window narrower than every row")
        check(cfg.query_pre_attn_scalar != cfg.head_dim, "gemma3 score scale differs from head_dim")
    if family == "gemma2":
        check(cfg.layer_types == ["sliding_attention", "full_attention"], "gemma2 default layer types")
        check(cfg.sliding_window < SEQ - PAD_TAIL, "gemma2 window narrower than every row")
        check(not any("q_norm" in n for n in names), "gemma2 has no q/k norms")
        # Each cap changes the log-probs: without it they differ.
        with torch.no_grad():
            capped, _, _, _ = token_stats(model, input_ids, attention_mask)
            for key in ("final_logit_softcapping", "attn_logit_softcapping"):
                uncapped = copy.deepcopy(model)
                setattr(uncapped.config, key, None)
                for layer in uncapped.model.layers:
                    layer.self_attn.attn_logit_softcapping = uncapped.config.attn_logit_softcapping
                changed, _, _, _ = token_stats(uncapped, input_ids, attention_mask)
                check((changed - capped).abs().max().item() > 1e-2, f"gemma2 {key} bends the log-probs")
    if family == "llama":
        check(cfg.rope_parameters["rope_type"] == "llama3", "llama3 rope scaling")
    if family == "phi3":
        check(any(n.endswith("qkv_proj.weight") for n in names), "phi3 fused qkv")
        check(any(n.endswith("gate_up_proj.weight") for n in names), "phi3 fused gate/up")
    if family in ("mistral", "phi3"):
        check(cfg.sliding_window < SEQ - PAD_TAIL, f"{family} window narrower than every row")
    if family == "qwen3_moe":
        sparse = [type(layer.mlp).__name__ for layer in model.model.layers]
        check(sparse == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"], f"sparse layers {sparse}")
        check(model.config._experts_implementation == "eager", "experts run by the eager loop")
        # Every expert is somebody's choice, and no token's top-2 is a near tie.
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_router_logits=True)
        for logits in out.router_logits:
            probs = logits.float().softmax(-1)
            top = probs.topk(3, dim=-1).values
            check(len(set(probs.topk(2, dim=-1).indices.flatten().tolist())) == cfg.num_experts, "every expert used")
            check((top[:, 1] - top[:, 2]).min().item() > 1e-4, "no near tie at the top-k boundary")

    # f32, as the model runs.
    lp32, ent32, mask32, shifted32, g32 = grads_of_masked_sum(model, input_ids, attention_mask)

    # f64 copy (with the f32 upcasts of HF's code made f64, see true_f64).
    model64 = copy.deepcopy(model).to(torch.float64)
    with true_f64(module, family):
        lp64, ent64, mask64, shifted64, g64 = grads_of_masked_sum(model64, input_ids, attention_mask)
    balance = None
    if family == "qwen3_moe":
        b32, gb32 = balance_and_grads(model, input_ids, attention_mask)
        with true_f64(module, family):
            b64, gb64 = balance_and_grads(model64, input_ids, attention_mask)
        check(abs(b32.item() - b64.item()) <= MOE_AUX_F32_VS_F64_RTOL * b64.item(), "aux loss f32 vs f64")
        check(b64.item() > 1.0, f"aux loss {b64.item()} above its balanced value 1")
        balance = (b64, grpo_names(gb64, cfg))
        check(gb64["model.layers.0.mlp.gate.weight"].norm() > 0, "the aux loss reaches the router")

    worst_grad = 0.0
    for n in names:
        r = rel(g32[n].double(), g64[n])
        worst_grad = max(worst_grad, r)
        check(r <= GRAD_F32_VS_F64_RTOL, f"{family} grad.{n}: f32 vs f64 relative {r:.3e} > {GRAD_F32_VS_F64_RTOL}")
        check(g64[n].norm() > 0, f"{family} grad.{n} is all zero")
    lp_diff = (lp32.double() - lp64).abs().max().item()
    ent_diff = (ent32.double() - ent64).abs().max().item()
    check(lp_diff <= LOGPROB_F32_VS_F64_ATOL, f"{family} logprobs f32 vs f64 {lp_diff:.3e}")
    check(ent_diff <= LOGPROB_F32_VS_F64_ATOL, f"{family} entropy f32 vs f64 {ent_diff:.3e}")

    # Semantics: logprobs == -CrossEntropy on the shifted logits (both
    # precisions), the mask is exactly the padded targets.
    targets = input_ids[:, 1:]
    for lp, sh, tol in ((lp32, shifted32, 1e-6), (lp64, shifted64, 1e-12)):
        ce = torch.nn.CrossEntropyLoss(reduction="none")(sh.reshape(-1, VOCAB), targets.reshape(-1))
        d = (lp + ce.view(BATCH, SEQ - 1)).abs().max().item()
        check(d <= tol, f"{family} logprobs != -CrossEntropyLoss ({d:.3e})")
    expected_mask = torch.ones(BATCH, SEQ - 1)
    expected_mask[1, SEQ - 1 - PAD_TAIL:] = 0  # targets at positions 8..11 of row 1 are padding
    check(torch.equal(mask64.float(), expected_mask), "mask is not exactly the padded targets")
    check(torch.equal(mask64.float() == 0, (attention_mask[:, 1:] == 0)), "mask vs attention_mask")
    check(bool((input_ids[attention_mask == 0] == PAD_ID).all()), "pad ids")
    check(bool(torch.isfinite(lp64).all() and torch.isfinite(ent64).all()), "finite")

    # Write.
    d = OUT / family
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model.save_pretrained(d, safe_serialization=True)
    gen = d / "generation_config.json"
    if gen.exists():
        gen.unlink()
    check(sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"],
          f"save_pretrained wrote {sorted(p.name for p in d.iterdir())}")
    (d / "inputs.json").write_text(json.dumps(
        {"input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist()}) + "\n")
    tensors = {
        "logprobs": lp64.float().contiguous(),
        "mask": mask64.float().contiguous(),
        "entropy": ent64.float().contiguous(),
    }
    for n, g in grpo_names(g64, cfg).items():
        tensors[f"grad.{n}"] = g.float().contiguous()
    if balance is not None:
        # Greedy continuation of a fixed prompt, through transformers' KV cache.
        with torch.no_grad():
            prompt = torch.tensor([GREEDY_PROMPT])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=GREEDY_TOKENS,
                                 do_sample=False, eos_token_id=None, pad_token_id=PAD_ID)
        tensors["greedy"] = out[0, len(GREEDY_PROMPT):].float().contiguous()
        check(len(set(tensors["greedy"].tolist())) > 1, "greedy decoding does not repeat one token")
        tensors["balance"] = balance[0].float().reshape(1).contiguous()
        for n, g in balance[1].items():
            tensors[f"grad_balance.{n}"] = g.float().contiguous()
    # One metadata key: safetensors writes the metadata map in hash order, so
    # several keys would make the bytes differ from run to run.
    safetensors.torch.save_file(tensors, d / "expected.safetensors", metadata={
        "generator": f"tools/make_parity_fixtures.py family={family} "
                     f"transformers={transformers.__version__} torch={torch.__version__}",
    })

    # Round trip: the saved weights are the named parameters, and reloading the
    # directory with from_pretrained gives the same log-probabilities.
    with safetensors.safe_open(d / "model.safetensors", framework="pt") as f:
        saved = set(f.keys())
        hub = hub_names(model)
        check(saved == set(hub), f"{family} model.safetensors keys {sorted(saved ^ set(hub))}")
        for n, t in hub.items():
            check(torch.equal(f.get_tensor(n), t), f"{family} saved {n}")
    eager = dict(experts_implementation="eager") if family == "qwen3_moe" else {}
    reloaded = model_cls.from_pretrained(d, attn_implementation="eager", dtype=torch.float32, **eager).eval()
    with torch.no_grad():
        lp_re, _, _, _ = token_stats(reloaded, input_ids, attention_mask)
    check(torch.equal(lp_re, lp32), f"{family} reloaded model differs")

    # The same config in the older Hub layout (top-level rope_theta, plus
    # rope_scaling for llama3) means the same model to transformers.
    legacy = json.loads((d / "config.json").read_text())
    rope = legacy.pop("rope_parameters")
    if family == "gemma3":
        legacy["rope_theta"] = rope["full_attention"]["rope_theta"]
        legacy["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    else:
        legacy["rope_theta"] = rope["rope_theta"]
        if rope["rope_type"] != "default":
            legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    legacy_cfg = config_cls.from_dict(legacy, attn_implementation="eager", **eager)
    # Gemma 2's config adds a partial_rotary_factor of 1.0: the same rotation.
    def plain(rope):
        return {k: v for k, v in rope.items() if (k, v) != ("partial_rotary_factor", 1.0)}

    check(plain(legacy_cfg.rope_parameters) == plain(cfg.rope_parameters),
          f"{family} legacy rope config: {legacy_cfg.rope_parameters} != {cfg.rope_parameters}")
    legacy_model = model_cls(legacy_cfg).eval()
    legacy_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        lp_legacy, _, _, _ = token_stats(legacy_model, input_ids, attention_mask)
    check(torch.equal(lp_legacy, lp32), f"{family} legacy-layout config gives other logprobs")

    return {
        "family": family,
        "params": sum(p.numel() for p in model.parameters()),
        "names": names,
        "worst_grad_rel": worst_grad,
        "lp_diff": lp_diff,
        "ent_diff": ent_diff,
        "lp_range": (lp64[mask64 > 0].min().item(), lp64[mask64 > 0].max().item()),
        "ent_range": (ent64.min().item(), ent64.max().item()),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
    }


README = """\
# Parity fixtures: Gemma 2, Gemma 3, Llama, Mistral, Phi-3, Qwen2, Qwen3, Qwen3-MoE against Hugging Face transformers

Generated by `tools/make_parity_fixtures.py`; regenerate from the repository
root with

    "$(tools/venv.sh)" tools/make_parity_fixtures.py

(`tools/venv.sh` creates or extends `<grpo cache>/tools-venv`, i.e.
`${{GRPO_CACHE_DIR:-${{XDG_CACHE_HOME:-$HOME/.cache}}/grpo}}/tools-venv`, with
torch installed exactly as `bench/train_step.sh` installs it, plus
`transformers==5.24.0` and `safetensors==0.8.0`). CPU, fixed seeds: a rerun
rewrites the same bytes.

Versions: transformers {transformers}, torch {torch}, safetensors
{safetensors}, Python {python}.

## Models

One directory per family, `model.save_pretrained(dir, safe_serialization=True)`
(`config.json` + `model.safetensors`; no `generation_config.json`):

| dir | class | seed | head_dim | tied lm_head | biases | rope |
|---|---|---|---|---|---|---|
| `llama/` | `LlamaForCausalLM` | 0 | 8 | no | none | llama3: factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 16 |
| `qwen2/` | `Qwen2ForCausalLM` | 1 | 8 (= hidden / heads) | yes | q/k/v | default |
| `qwen3/` | `Qwen3ForCausalLM` | 2 | 16 (heads x head_dim = 64 != hidden 32) | no | none (q_norm/k_norm instead) | default |
| `mistral/` | `MistralForCausalLM` | 3 | 8 | no | none | default; `sliding_window` 5 |
| `phi3/` | `Phi3ForCausalLM` | 4 | 8 | no | none; fused `qkv_proj` and `gate_up_proj` | default; `sliding_window` 7 |
| `gemma3/` | `Gemma3ForCausalLM` | 5 | 8 (scores scaled by `query_pre_attn_scalar` 12) | yes | none (q_norm/k_norm; norms are offsets from 1, initialized 0.1 randn) | layer 0 sliding (window 4, base 10000), layer 1 global (base 100); GELU (tanh) |
| `qwen3_moe/` | `Qwen3MoeForCausalLM` | 7 | 8 | no | none (q_norm/k_norm) | default; 3 layers: 0 and 2 sparse (4 experts of width 16, 2 per token, `norm_topk_prob`), 1 dense (`mlp_only_layers`); experts by transformers' eager loop |
| `gemma2/` | `Gemma2ForCausalLM` | 6 | 8 (scores scaled by `query_pre_attn_scalar` 12) | yes | none (norms are offsets from 1, initialized 0.1 randn) | default (base 10000); layer 0 sliding (window 4), layer 1 global; attention scores soft-capped at 1, logits at 3 (each checked to change the log-probs); GELU (tanh) |

Common: f32, vocab_size 128, hidden_size 32, intermediate_size 64,
num_hidden_layers 2, num_attention_heads 4, num_key_value_heads 2 (GQA),
max_position_embeddings 64, rope_theta 10000, rms_norm_eps 1e-6, silu,
attn_implementation "eager". Mistral's and Phi-3's sliding windows are
narrower than both rows, so later tokens no longer see the first ones.

`config.json` is written by transformers 5, which stores the rope settings as
`"rope_parameters": {{"rope_type": ..., "rope_theta": 10000.0, ...}}` (with the
llama3 keys inside it for llama) rather than the top-level `rope_theta` +
`rope_scaling` that older checkpoints on the Hub carry; a loader that reads
real checkpoints should accept both (the script checks that the older layout,
`"rope_theta": 10000.0` and, for llama, `"rope_scaling": {{"rope_type": "llama3",
"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 16}}`, gives transformers the same
`rope_parameters` and bit-equal logprobs). The tied qwen2 `model.safetensors` has no
`lm_head.weight` (the head is `model.embed_tokens.weight`).

Weights: `torch.manual_seed(seed)`, the model is constructed (transformers'
own init), then every parameter, in `named_parameters()` order, is overwritten
from the same generator: RMSNorm weights (`*norm.weight`: input/post-attention
layernorms, `model.norm`, qwen3 `q_norm`/`k_norm`) = 1 + 0.1 randn; biases =
0.1 randn (non-zero); every other weight (embeddings, projections, lm_head) =
0.2 randn (large enough that attention is far from uniform).

## inputs.json

`{{"input_ids": [[12 ints], [12 ints]], "attention_mask": [[12], [12]]}}`:
batch 2, length 12, ids uniform in [0, 128) (drawn after the weights, same
generator); row 1 is right-padded: its last 4 positions have attention_mask 0
and id 0. The models are run as
`model(input_ids, attention_mask=attention_mask, use_cache=False)` with no
`position_ids`, so both rows use positions 0..11 (transformers' default) and
padded keys are masked out in attention (padded query rows still attend to
the real keys before them).

## expected.safetensors

With `logits` [2, 12, 128] the model output, `lsm = log_softmax(logits[:, :-1], -1)`:

| tensor | dtype | shape | definition |
|---|---|---|---|
| `logprobs` | f32 | [2, 11] | `logprobs[b, t] = lsm[b, t, input_ids[b, t+1]]`; computed at every position, also where the target is padding (the consumer masks) |
| `mask` | f32 | [2, 11] | `attention_mask[:, 1:]`: 1 everywhere except row 1, t = 7..10 |
| `entropy` | f32 | [2, 11] | `-(exp(lsm) * lsm).sum(-1)`, entropy of `softmax(logits[b, t])`, every position |
| `grad.<name>` | f32 | shape of the parameter | d/dp of `sum(logprobs * mask)` for every `(name, p)` in `model.named_parameters()` (HF names; qwen2's tied head appears once, as `grad.model.embed_tokens.weight`, and includes the head's contribution; qwen3_moe's fused `experts.gate_up_proj` [experts, 2·16, hidden] is written as grpo stacks it, `experts.gate_proj` and `experts.up_proj` [experts, 16, hidden], gate rows first) |
| `greedy` | f32 | [6] | qwen3_moe only: `model.generate([[5, 17, 99]], max_new_tokens=6, do_sample=False)`'s new token ids (f32 model, KV cache) |
| `balance` | f32 | [1] | qwen3_moe only: `model(..., output_router_logits=True).aux_loss`, transformers' `load_balancing_loss_func` over both sparse layers with the attention mask (no coefficient) |
| `grad_balance.<name>` | f32 | shape of the parameter | qwen3_moe only: d/dp of `balance`, named as `grad.<name>` (zeros where none flows: the head, the last layer's attention) |

Tensor metadata: one key, `generator` = "tools/make_parity_fixtures.py
family=<family> transformers=<version> torch=<version>".

All stored values come from an f64 copy of the model (`.to(torch.float64)`,
same weights, which are f32 values) and are cast to f32. HF's decoders upcast to
f32, not to the input dtype, in RMSNorm, in the eager softmax and in the
rotary cos/sin table; for the f64 run those three compute in f64 (same
formulas; the rotary inverse frequencies stay HF's `inv_freq` buffer, computed
in f32 at construction). The script checks, and fails otherwise:

- the f32 model (as it runs) against the f64 copy: per parameter
  `||g32 - g64|| / ||g64|| <= 1e-5` (worst here: {worst_grad}), logprobs and
  entropy within 1e-5 absolute (worst here: {worst_lp} and {worst_ent});
- `logprobs == -CrossEntropyLoss(reduction='none')(logits[:, :-1], input_ids[:, 1:])`
  (to 1e-6 in f32, 1e-12 in f64);
- `mask` is exactly 0 at the padded targets (row 1, t = 7..10) and 1 elsewhere;
- every gradient is non-zero; qwen2's q/k/v biases have no zeros;
- `model.safetensors` holds exactly the named parameters, bit-equal (qwen3_moe's
  experts as the Hub holds them, one `mlp.experts.E.{{gate,up,down}}_proj.weight`
  per expert), and
  `from_pretrained(dir)` reproduces the f32 logprobs bit for bit;
- the legacy config layout above means the same model.

## Files

{files}
"""


def main():
    check(transformers.__version__ == "5.24.0", f"transformers {transformers.__version__}, want 5.24.0 (tools/venv.sh)")
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # deterministic reductions
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for index, (family, config_cls, model_cls, module, extra) in enumerate(FAMILIES):
        r = make(index, family, config_cls, model_cls, module, extra)
        results.append(r)
        print(f"{family}: {r['params']} parameters, {len(r['names'])} tensors; f32 vs f64: grad rel <= "
              f"{r['worst_grad_rel']:.2e}, logprobs {r['lp_diff']:.2e}, entropy {r['ent_diff']:.2e}; "
              f"logprobs in [{r['lp_range'][0]:.3f}, {r['lp_range'][1]:.3f}], "
              f"entropy in [{r['ent_range'][0]:.3f}, {r['ent_range'][1]:.3f}] (uniform {math.log(VOCAB):.3f})")

    files = sorted(p for p in OUT.rglob("*") if p.is_file() and p.name != "README.md")
    total = sum(p.stat().st_size for p in files)
    rows = ["| file | bytes |", "|---|---|"]
    rows += [f"| `{p.relative_to(OUT)}` | {p.stat().st_size} |" for p in files]
    rows.append(f"| total (without this README) | {total} |")
    (OUT / "README.md").write_text(README.format(
        transformers=transformers.__version__,
        torch=torch.__version__,
        safetensors=safetensors.__version__,
        python=".".join(map(str, sys.version_info[:3])),
        worst_grad=f"{max(r['worst_grad_rel'] for r in results):.1e}",
        worst_lp=f"{max(r['lp_diff'] for r in results):.1e}",
        worst_ent=f"{max(r['ent_diff'] for r in results):.1e}",
        files="\n".join(rows),
    ))
    total += (OUT / "README.md").stat().st_size
    for p in files:
        print(f"{p.stat().st_size:>8}  {p.relative_to(ROOT)}")
    print(f"{total:>8}  total (with README.md), limit {MAX_TOTAL_BYTES}")
    check(total <= MAX_TOTAL_BYTES, f"fixtures are {total} bytes > {MAX_TOTAL_BYTES}")


if __name__ == "__main__":
    main()
