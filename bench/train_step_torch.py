#!/usr/bin/env python3
"""PyTorch eager (CPU, f32) competitor of `grpo bench train-step`.

Times ONE full training step of the same model with the same maths as the
Rust side: zero_grad, forward, loss, backward, global grad-norm clipping
(torch.nn.utils.clip_grad_norm_, max norm 1.0) and an AdamW step (lr 1e-3,
betas (0.9, 0.999), eps 1e-8, weight_decay 0.01 on every parameter; PyTorch's
default CPU path, which is per tensor: no foreach or fused kernels), after
--warmup untimed steps, for --runs timed steps. Prints exactly one JSON line
on stdout:

    {"impl": "torch", "model": "mlp", "median_ms": ..., "best_ms": ..., "runs": 7}

Diagnostics (torch version, threads, first and last loss) go to stderr.
`--flops` prints the analytic FLOPs per step instead and needs no torch.

Models (inputs and targets are standard normal, drawn after
torch.manual_seed(0); weights normal(0, 0.02), biases zero, RMSNorm weights 1):

  mlp:   x [2048, 512] (batch 8 x seq 256 flattened);
         y = silu(x @ W1 + b1) @ W2 + b2, W1 [512, 2048], W2 [2048, 512];
         loss = mean((y - target)^2).
  block: Llama-style pre-norm transformer block without RoPE, x [8, 256, 512]:
         a = RMSNorm(x) (eps 1e-5); q, k, v = a @ Wq, a @ Wk, a @ Wv ([512, 512],
         no bias), 8 heads x 64; p = softmax(causal_mask(q k^T / sqrt(64)));
         h = x + merge_heads(p v) @ Wo; b = RMSNorm(h) (own weight);
         out = h + (silu(b @ Wg) * (b @ Wu)) @ Wd, Wg, Wu [512, 1408],
         Wd [1408, 512]; loss = mean((out - target)^2).
         Attention is written out (matmul, masked_fill, softmax), not
         F.scaled_dot_product_attention, so it is the same maths as grpo's.

FLOPs per step (matmul flops of the forward pass x 3: the backward pass of
each product costs two products of the same size; elementwise ops, softmax,
norms, clipping and AdamW are not counted). T = B*S = 2048 tokens, D = 512:

  mlp   = 3 * (2*T*D*F + 2*T*F*D),                      F = 2048
        = 3 * 4*T*D*F = 25,769,803,776            (~25.8 GFLOP)
  block = 3 * ( 4 * 2*T*D*D                             q, k, v, o projections
              + 2 * 2*B*H*S*S*Dh                        q k^T and p v (full S x S:
                                                        the causal mask saves nothing)
              + 3 * 2*T*D*Fb ),                         gate, up, down; Fb = 1408
          B = 8, S = 256, H = 8, Dh = 64
        = 3 * (4,294,967,296 + 1,073,741,824 + 8,858,370,048)
        = 42,681,237,504                          (~42.7 GFLOP)
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

BATCH = 8
SEQ = 256
TOKENS = BATCH * SEQ
D_MODEL = 512
MLP_HIDDEN = 2048
HEADS = 8
HEAD_DIM = D_MODEL // HEADS
BLOCK_HIDDEN = 1408
NORM_EPS = 1e-5
INIT_STD = 0.02

LR = 1e-3
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0

MODELS = ("mlp", "block")


def mlp_flops(tokens=TOKENS, d=D_MODEL, f=MLP_HIDDEN):
    """Forward matmul flops x 3 of the mlp step."""
    forward = 2 * tokens * d * f + 2 * tokens * f * d
    return 3 * forward


def block_flops(batch=BATCH, seq=SEQ, d=D_MODEL, heads=HEADS, f=BLOCK_HIDDEN):
    """Forward matmul flops x 3 of the transformer-block step."""
    tokens = batch * seq
    head_dim = d // heads
    projections = 4 * 2 * tokens * d * d
    attention = 2 * 2 * batch * heads * seq * seq * head_dim
    mlp = 3 * 2 * tokens * d * f
    return 3 * (projections + attention + mlp)


def train_step_flops(model):
    """Analytic FLOPs of one training step of `model` ("mlp" or "block")."""
    if model == "mlp":
        return mlp_flops()
    if model == "block":
        return block_flops()
    raise ValueError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")


def build_mlp(torch):
    """Parameters, input, target and loss function of the mlp model."""

    def weight(*shape):
        return torch.nn.Parameter(torch.randn(*shape) * INIT_STD)

    w1, b1 = weight(D_MODEL, MLP_HIDDEN), torch.nn.Parameter(torch.zeros(MLP_HIDDEN))
    w2, b2 = weight(MLP_HIDDEN, D_MODEL), torch.nn.Parameter(torch.zeros(D_MODEL))
    x = torch.randn(TOKENS, D_MODEL)
    target = torch.randn(TOKENS, D_MODEL)
    silu = torch.nn.functional.silu

    def loss_fn():
        h = silu(x @ w1 + b1)
        y = h @ w2 + b2
        return ((y - target) ** 2).mean()

    return [w1, b1, w2, b2], loss_fn


def build_block(torch):
    """Parameters, input, target and loss function of the transformer block."""

    def weight(*shape):
        return torch.nn.Parameter(torch.randn(*shape) * INIT_STD)

    norm1 = torch.nn.Parameter(torch.ones(D_MODEL))
    wq, wk, wv, wo = (weight(D_MODEL, D_MODEL) for _ in range(4))
    norm2 = torch.nn.Parameter(torch.ones(D_MODEL))
    wg, wu = weight(D_MODEL, BLOCK_HIDDEN), weight(D_MODEL, BLOCK_HIDDEN)
    wd = weight(BLOCK_HIDDEN, D_MODEL)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    target = torch.randn(BATCH, SEQ, D_MODEL)
    # True above the diagonal: key position j > query position i is masked.
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    silu = torch.nn.functional.silu

    def rms_norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w

    def heads(t):  # [B, S, D] -> [B, H, S, Dh]
        return t.view(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)

    def loss_fn():
        a = rms_norm(x, norm1)
        q, k, v = heads(a @ wq), heads(a @ wk), heads(a @ wv)
        scores = (q @ k.transpose(-2, -1)) * scale
        scores = scores.masked_fill(causal, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        o = (p @ v).transpose(1, 2).reshape(BATCH, SEQ, D_MODEL)
        h = x + o @ wo
        b = rms_norm(h, norm2)
        out = h + (silu(b @ wg) * (b @ wu)) @ wd
        return ((out - target) ** 2).mean()

    return [norm1, wq, wk, wv, wo, norm2, wg, wu, wd], loss_fn


def summarize(times_s):
    """Median and best of a list of durations in seconds, in milliseconds."""
    if not times_s:
        raise ValueError("no timed runs")
    return statistics.median(times_s) * 1e3, min(times_s) * 1e3


def result_line(model, times_s):
    """The JSON line this script prints for `model` and its timed runs."""
    median_ms, best_ms = summarize(times_s)
    return json.dumps(
        {
            "impl": "torch",
            "model": model,
            "median_ms": round(median_ms, 3),
            "best_ms": round(best_ms, 3),
            "runs": len(times_s),
        }
    )


def run(model, runs, warmup, threads):
    """Times `warmup` + `runs` training steps; returns the timed durations (s)."""
    import torch  # here, so that --flops and report.py need no torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    params, loss_fn = {"mlp": build_mlp, "block": build_block}[model](torch)
    opt = torch.optim.AdamW(
        params, lr=LR, betas=BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY
    )

    def step():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        opt.step()
        return loss

    losses = []
    for _ in range(warmup):
        losses.append(step().item())
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        loss = step()  # CPU eager: every op has finished when it returns
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {model}: "
        f"loss {losses[0]:.6f} -> {losses[-1]:.6f} over {len(losses)} steps",
        file=sys.stderr,
    )
    return times


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, help="model to train (required unless --flops)")
    parser.add_argument("--runs", type=int, default=7, help="timed steps (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch.set_num_threads (default: os.cpu_count())",
    )
    parser.add_argument(
        "--flops",
        action="store_true",
        help="print the analytic FLOPs per step as JSON (of --model, or of every model) and exit",
    )
    args = parser.parse_args(argv)
    if args.flops:
        return args
    if args.model is None:
        parser.error("--model is required")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.flops:
        for model in [args.model] if args.model else MODELS:
            flops = train_step_flops(model)
            print(json.dumps({"model": model, "flops": flops, "gflop": round(flops / 1e9, 3)}))
        return 0
    times = run(args.model, args.runs, args.warmup, args.threads)
    print(result_line(args.model, times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
