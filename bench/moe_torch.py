#!/usr/bin/env python3
"""transformers' Qwen3-MoE sparse MLP layer (Qwen3MoeSparseMoeBlock: router,
top-k, the experts' SwiGLU, the weighted sum) timed as `grpo bench moe`
times grpo's: forward + backward of sum(out²)/2 with respect to the tokens,
the router and the experts, on random tokens and weights of the same shapes.

    moe_torch.py --tokens N --hidden H --inner I --experts E --top-k K
                 --experts-implementation eager|grouped_mm [--dtype f32|bf16]
                 [--runs R] [--warmup W] [--threads T]

Prints one JSON line: the median and best step in ms (or why it could not run).
"""

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--inner", type=int, default=768)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--experts-implementation", default="eager")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    config = Qwen3MoeConfig(hidden_size=a.hidden, moe_intermediate_size=a.inner, num_experts=a.experts,
                            num_experts_per_tok=a.top_k, norm_topk_prob=True)
    config._experts_implementation = a.experts_implementation
    line = {"impl": f"transformers-{a.experts_implementation}", "tokens": a.tokens, "hidden": a.hidden,
            "inner": a.inner, "experts": a.experts, "top_k": a.top_k, "dtype": a.dtype, "threads": a.threads,
            "torch": torch.__version__}
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config).to(dtype)
    with torch.no_grad():
        for param in block.parameters():
            param.uniform_(-0.02, 0.02)
    x = (torch.rand(1, a.tokens, a.hidden) * 2 - 1).to(dtype).requires_grad_(True)

    def step():
        block.zero_grad(set_to_none=True)
        x.grad = None
        out = block(x)
        loss = out.float().square().sum() * 0.5
        loss.backward()

    try:
        for _ in range(a.warmup):
            step()
        times = []
        for _ in range(a.runs):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
    except Exception as error:  # an implementation this machine's torch lacks
        line["failed"] = f"{type(error).__name__}: {error}"[:300]
        print(json.dumps(line))
        return
    line.update(median_ms=statistics.median(times), best_ms=min(times), runs=a.runs)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
