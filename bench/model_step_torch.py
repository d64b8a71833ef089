#!/usr/bin/env python3
"""Hugging Face transformers competitor (CPU, or CUDA with --device cuda) of `grpo bench model-step`.

Times training forward + backward of SmolLM2-135M-Instruct, the same maths as
the Rust side: random token ids [batch, seq] (torch.manual_seed(0), all real
tokens, no padding, no attention mask), logits = model(ids).logits,
loss = -mean over the batch x (seq - 1) next-token log-probs
(log_softmax(logits[:, :-1]) gathered at ids[:, 1:]), loss.backward() to the
gradients of every parameter; no optimizer step. Gradients are dropped
(zero_grad(set_to_none=True)) before each step, outside the timed span, so
every step computes them afresh. --warmup untimed steps, then --runs timed
ones. Everything, log_softmax included, runs in --dtype (f32 or bf16: the
model is loaded in that dtype; nothing is upcast).

--attn eager (attention written out: matmul, mask, softmax, matmul) or sdpa
(torch.nn.functional.scaled_dot_product_attention, a fused causal kernel).
Prints exactly one JSON line on stdout:

    {"impl": "torch-eager", "model": "smollm2-135m", "dtype": "f32", "batch": 8,
     "seq": 256, "median_ms": ..., "best_ms": ..., "runs": 3}

Diagnostics (versions, threads, the parameter count, the loss) go to stderr.
`--flops` prints the analytic FLOPs per step instead and needs no torch.

The model folder is ${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}/models/
smollm2-135m-instruct (config.json, model.safetensors, tokenizer files), made by
`cargo run --release -- setup`; --model-dir names another.

FLOPs per step (matmuls only; norms, RoPE, softmax, SiLU, the loss and the
embedding gather are not counted). T = B*S tokens: the forward computes the
logits of all S positions (the last one's are unused by the loss, but are
computed on both sides), so T = 8 * 256 = 2048.

  N       = every Linear weight of the model, the tied lm_head matrix once
            (it is the embedding matrix; the embedding lookup is no matmul)
          = L * (D*H*Dh + 2*D*K*Dh + H*Dh*D + 3*D*F) + V*D
  weights = 6 * N * T          forward 2*N*T, backward 4*N*T (two products
                               of the same size per product)
  attn    = 3 * 2*2*B*L*H*S*S*Dh   q k^T and p v over the full S x S (the
                                   causal mask saves nothing in the count),
                                   forward x 3 for forward + backward
  total   = weights + attn

SmolLM2-135M: L = 30 layers, D = 576, H = 9 heads, K = 3 kv heads, Dh = 64,
F = 1536, V = 49152 (tied):

  N       = 30 * (331,776 + 221,184 + 331,776 + 2,654,208) + 28,311,552
          = 30 * 3,538,944 + 28,311,552 = 134,479,872
  weights = 6 * 134,479,872 * 2048     = 1,652,488,667,136
  attn    = 3 * 4 * 8 * 30 * 9 * 256^2 * 64 = 108,716,359,680
  total   = 1,761,205,026,816 FLOP/step  (~1761 GFLOP; 859,963,392 per token)

so GFLOP/s = tokens/s * 0.860 (tokens/s * 0.807 for the 6*N part alone).
"""

import argparse
import json
import os
import statistics
import sys
import time

BATCH = 8
SEQ = 256
MODEL_LABEL = "smollm2-135m"
MODEL_FOLDER = "smollm2-135m-instruct"
DTYPES = ("f32", "bf16")
ATTNS = ("eager", "sdpa")

# config.json of SmolLM2-135M-Instruct, the fields the FLOP count reads; used
# when the model folder is absent (report.py, --flops, the unit tests).
SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
# Model labels (the JSON "model" field) whose config is known without a folder.
KNOWN_CONFIGS = {MODEL_LABEL: SMOLLM2_135M}


def cache_dir():
    """grpo's cache folder, as in xla/src/pjrt/locate.rs."""
    if os.environ.get("GRPO_CACHE_DIR"):
        return os.environ["GRPO_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "grpo")


def default_model_dir():
    return os.path.join(cache_dir(), "models", MODEL_FOLDER)


def _head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def linear_params(cfg):
    """N: the weights of every Linear of a Llama-style decoder, lm_head once."""
    d = cfg["hidden_size"]
    f = cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = _head_dim(cfg)
    per_layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * f
    # lm_head is one [V, D] matrix whether tied to the embedding or not; the
    # embedding itself is a lookup, not a matmul.
    return cfg["num_hidden_layers"] * per_layer + cfg["vocab_size"] * d


def step_flops(cfg, batch=BATCH, seq=SEQ, params=None):
    """{"params", "weights", "attention", "flops"} of one forward + backward step.

    `params` overrides N (e.g. counted from a loaded model).
    """
    n = linear_params(cfg) if params is None else params
    tokens = batch * seq
    weights = 6 * n * tokens
    attention = 3 * 2 * 2 * batch * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * seq * seq * _head_dim(cfg)
    return {"params": n, "weights": weights, "attention": attention, "flops": weights + attention}


def model_flops(model, batch=BATCH, seq=SEQ):
    """FLOPs per step of the model labelled `model` (KNOWN_CONFIGS), or None."""
    cfg = KNOWN_CONFIGS.get(model)
    return None if cfg is None else step_flops(cfg, batch, seq)["flops"]


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def summarize(times_s):
    """Median and best of a list of durations in seconds, in milliseconds."""
    if not times_s:
        raise ValueError("no timed runs")
    return statistics.median(times_s) * 1e3, min(times_s) * 1e3


def result_line(attn, dtype, batch, seq, times_s, model=MODEL_LABEL, checkpointing=None):
    """The JSON line this script prints; with `checkpointing` (whether
    gradient checkpointing was on, for --memory) also that and the process's
    peak RSS."""
    median_ms, best_ms = summarize(times_s)
    line = {
        "impl": f"torch-{attn}",
        "model": model,
        "dtype": dtype,
        "batch": batch,
        "seq": seq,
        "median_ms": round(median_ms, 3),
        "best_ms": round(best_ms, 3),
        "runs": len(times_s),
    }
    if checkpointing is not None:
        import resource

        line["activation_checkpointing"] = "layer" if checkpointing else "none"
        line["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return json.dumps(line)


def missing_model_message(model_dir):
    return (
        f"model_step_torch.py: no model at {model_dir} (config.json missing); "
        "create it with `cargo run --release -- setup`"
    )


def run(model_dir, attn, dtype, batch, seq, runs, warmup, threads, device="cpu", tf32=False, checkpointing=False):
    """Times `warmup` + `runs` forward + backward steps on `device` (f32 products
    in TF32 when `tf32`; each decoder layer recomputed in the backward pass when
    `checkpointing`: transformers' gradient checkpointing); returns the timed
    durations (s)."""
    import torch  # here, so that --flops and report.py need no torch
    import transformers

    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    transformers.utils.logging.disable_progress_bar()
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch_dtype, attn_implementation=attn
    ).to(device)
    model.config.use_cache = False
    model.train()  # dropout is 0 in SmolLM2; train mode only to be the training path
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # N counted from the model: every Linear weight, shared ones (the tied
    # lm_head) once.
    seen, counted = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            counted += module.weight.numel()
    cfg = load_config(model_dir)
    expected = linear_params(cfg)
    if counted != expected:
        print(
            f"model_step_torch.py: warning: {counted:,} Linear weights in the model, "
            f"{expected:,} from config.json; --flops uses the config",
            file=sys.stderr,
        )
    flops = step_flops(cfg, batch, seq, params=counted)["flops"]

    torch.manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq)).to(device)
    targets = ids[:, 1:].unsqueeze(-1)

    def step():
        logits = model(input_ids=ids, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1, :], dim=-1)
        loss = -logp.gather(-1, targets).mean()
        loss.backward()
        return loss

    losses = []
    for _ in range(warmup):
        model.zero_grad(set_to_none=True)
        losses.append(step().item())
    times = []
    for _ in range(runs):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = step()
        if device != "cpu":  # CPU eager has finished every op when backward returns
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    if missing:
        raise RuntimeError(f"no gradient for {len(missing)} parameters, e.g. {missing[0]}")
    median_ms = statistics.median(times) * 1e3
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{device}, {torch.get_num_threads()} threads, {attn} {dtype} {batch}x{seq}: "
        f"N = {counted:,} Linear weights, {flops / 1e9:.1f} GFLOP/step; "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; median {median_ms:.0f} ms = "
        f"{batch * seq / (median_ms / 1e3):.1f} tokens/s, {flops / (median_ms / 1e3) / 1e9:.1f} GFLOP/s",
        file=sys.stderr,
    )
    return times


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=None, help=f"HF model folder (default: <grpo cache>/models/{MODEL_FOLDER})")
    parser.add_argument("--attn", choices=ATTNS, default="eager", help="attn_implementation (default eager)")
    parser.add_argument("--dtype", choices=DTYPES, default="f32", help="parameter and compute dtype (default f32)")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"sequences per step (default {BATCH})")
    parser.add_argument("--seq", type=int, default=SEQ, help=f"tokens per sequence (default {SEQ})")
    parser.add_argument("--runs", type=int, default=3, help="timed steps (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1,
        help="torch.set_num_threads (default: os.cpu_count())",
    )
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each decoder layer in the backward pass (transformers' "
                        "gradient_checkpointing_enable)")
    parser.add_argument("--memory", action="store_true",
                        help="the line also says whether checkpointing was on and the process's peak RSS")
    parser.add_argument("--tf32", action="store_true",
                        help="let CUDA run f32 products in TF32 (as XLA does by default on GPUs)")
    parser.add_argument(
        "--flops", action="store_true",
        help="print the analytic FLOPs per step as JSON (from the folder's config.json, "
        "else the built-in SmolLM2-135M config) and exit",
    )
    args = parser.parse_args(argv)
    if args.batch < 1 or args.seq < 2:
        parser.error("--batch must be at least 1 and --seq at least 2")
    if args.flops:
        return args
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model_dir = args.model_dir or default_model_dir()
    have_model = os.path.isfile(os.path.join(model_dir, "config.json"))
    if args.flops:
        cfg, source = (load_config(model_dir), model_dir) if have_model else (SMOLLM2_135M, "built-in")
        counts = step_flops(cfg, args.batch, args.seq)
        tokens = args.batch * args.seq
        print(json.dumps({
            "model": os.path.basename(os.path.normpath(model_dir)) if have_model else MODEL_LABEL, "config": source, "batch": args.batch, "seq": args.seq,
            **counts, "gflop": round(counts["flops"] / 1e9, 3),
            "flops_per_token": counts["flops"] / tokens,
        }))
        return 0
    if not have_model:
        print(missing_model_message(model_dir), file=sys.stderr)
        return 1
    times = run(
        model_dir, args.attn, args.dtype, args.batch, args.seq, args.runs, args.warmup, args.threads, args.device,
        args.tf32, args.gradient_checkpointing,
    )
    checkpointing = args.gradient_checkpointing if args.memory else None
    print(result_line(args.attn, args.dtype, args.batch, args.seq, times, checkpointing=checkpointing), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
