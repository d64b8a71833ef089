#!/usr/bin/env python3
"""Hugging Face transformers competitor (CPU, or CUDA with --device cuda) of `grpo bench generate`.

Times `model.generate` of SmolLM2-135M-Instruct on the prompt ids that
`grpo bench generate --tokens-out FILE` wrote (--tokens FILE), the same
method as the Rust side: per batch B, B copies of the prompt (attention mask
all ones, no padding), greedy (do_sample=False) or, when the tokens file
gives a "temperature" above 0, sampled at it from the whole vocabulary
(do_sample=True, top_k=0, top_p=1), EOS suppressed
(min_new_tokens = max_new_tokens), KV cache on (transformers' default
dynamic cache), the model loaded in --dtype (f32 or bf16), attention
implementation --attn (default sdpa). Each run calls generate twice; --warmup
untimed runs, then the medians of --runs timed ones:

    t1 = generate(max_new_tokens=1)            prefill tokens/s = B * prompt / t1
    t  = generate(max_new_tokens=1 + new)      decode tokens/s  = B * new / (t - t1)

Prints one JSON line per batch on stdout:

    {"impl": "transformers", "bench": "generate", "model": "smollm2-135m", "dtype": "f32",
     "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": ..., "full_ms": ...,
     "prefill_tokens_per_s": ..., "decode_tokens_per_s": ..., "runs": 3, "weight_bytes": ...,
     "load_1m": 0.4, "greedy_match": true}

At a temperature above 0 the line carries "temperature" and no tokens are
compared. "greedy_match" compares the greedy tokens of the batch's first row with
grpo's for the same batch from the tokens file (absent when the file has none;
"greedy_mismatch_at", the first differing position, is added when they
differ, and a warning goes to stderr). "weight_bytes" is the parameters'
bytes in the dtype (the tied embedding counted once); "load_1m" the 1-minute
load average when the batch was done (other work on the machine shows in it).

With --loras N the model carries N PEFT LoRA adapters of rank --lora-rank
on every linear layer (random A and B, init_lora_weights=False) and row i of
a batch uses adapter i mod N (PEFT's mixed-batch `adapter_names`), as
`grpo bench generate --loras N` does; the lines then carry "loras" and
"lora_rank", and greedy tokens are not compared (the adapters differ).

Diagnostics (versions, threads) go to stderr. The model folder is
${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}/models/
smollm2-135m-instruct, made by `cargo run --release -- setup`; --model-dir
names another.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_step_torch import MODEL_LABEL, default_model_dir, missing_model_message  # noqa: E402  (torch-free)

DTYPES = ("f32", "bf16")
ATTNS = ("eager", "sdpa")


def parse_batches(text):
    """"1,16,64" as [1, 16, 64]; every entry a positive int."""
    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of batch sizes") from None
    if not batches or any(b < 1 for b in batches):
        raise argparse.ArgumentTypeError(f"'{text}': batch sizes must be at least 1")
    return batches


def load_tokens(path):
    """The tokens file of `grpo bench generate --tokens-out`: {"prompt_ids", "greedy": {batch: ids}, ...}."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    ids = data.get("prompt_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"{path}: no prompt_ids list")
    return data


def first_mismatch(ours, theirs):
    """Index of the first position where the two token lists differ, or None if equal."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def rates(batch, prompt_tokens, new_tokens, t1, t):
    """(prefill tokens/s, decode tokens/s) from the median prefill and full times (s)."""
    if t <= t1:
        raise ValueError(f"batch {batch}: the full run ({t:.3f} s) was not slower than the prefill ({t1:.3f} s)")
    return batch * prompt_tokens / t1, batch * new_tokens / (t - t1)


def load_average():
    """The 1-minute load average, or None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def result_line(dtype, batch, prompt_tokens, new_tokens, prefill_s, full_s, weight_bytes,
                tokens=None, reference=None, model=MODEL_LABEL, load_1m=None, loras=0, lora_rank=0,
                temperature=0.0):
    """The JSON line of one batch: medians of the `prefill_s` and `full_s` durations (s).

    `tokens` (the first row's greedy ids) are compared with `reference` (grpo's) when both are given.
    """
    t1, t = statistics.median(prefill_s), statistics.median(full_s)
    prefill_rate, decode_rate = rates(batch, prompt_tokens, new_tokens, t1, t)
    line = {
        "impl": "transformers",
        "bench": "generate",
        "model": model,
        "dtype": dtype,
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "prefill_ms": round(t1 * 1e3, 3),
        "full_ms": round(t * 1e3, 3),
        "prefill_tokens_per_s": round(prefill_rate, 3),
        "decode_tokens_per_s": round(decode_rate, 3),
        "runs": len(full_s),
        "weight_bytes": weight_bytes,
        "load_1m": load_1m,
    }
    if loras:
        line["loras"], line["lora_rank"] = loras, lora_rank
    if temperature > 0:
        line["temperature"] = temperature
    if tokens is not None and reference is not None:
        at = first_mismatch(list(tokens), list(reference))
        line["greedy_match"] = at is None
        if at is not None:
            line["greedy_mismatch_at"] = at
    return json.dumps(line)


def run(args, tokens_file):
    """Times every batch, printing its JSON line."""
    import torch  # here, so that the unit tests need no torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch_dtype, attn_implementation=args.attn
    ).to(args.device)
    model.eval()
    adapter_names = None
    if args.loras:
        import peft

        config = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, target_modules="all-linear",
                                 init_lora_weights=False)
        torch.manual_seed(0)
        model = peft.get_peft_model(model, config, adapter_name="a0")
        for k in range(1, args.loras):
            model.add_adapter(f"a{k}", config)
        model.eval()
        adapter_names = [f"a{i % args.loras}" for i in range(max(args.batch))]
        print(f"peft {peft.__version__}: {args.loras} adapters of rank {args.lora_rank} on every linear layer",
              file=sys.stderr)
    seen, weight_bytes = set(), 0
    for p in model.parameters():  # parameters() yields a tied tensor once; the id check makes sure
        if id(p) not in seen:
            seen.add(id(p))
            weight_bytes += p.numel() * p.element_size()
    prompt = tokens_file["prompt_ids"]
    greedy = tokens_file.get("greedy") or {}
    temperature = float(tokens_file.get("temperature") or 0.0)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
        else {"do_sample": False}
    eos = model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {args.device}, {torch.get_num_threads()} threads, "
        f"{args.attn} {args.dtype}: {weight_bytes / 1e6:.1f} MB of weights; prompt {len(prompt)} tokens, "
        f"{args.new_tokens} new",
        file=sys.stderr,
    )

    for batch in args.batch:
        ids = torch.tensor([prompt] * batch, dtype=torch.long, device=args.device)
        mask = torch.ones_like(ids)

        def generate(max_new):
            mixed = {"adapter_names": adapter_names[:batch]} if adapter_names else {}
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                    pad_token_id=pad, **sampling, **mixed,
                )
            if out.shape != (batch, len(prompt) + max_new):
                raise RuntimeError(f"generate returned shape {tuple(out.shape)}, not {(batch, len(prompt) + max_new)}")
            return out[0, len(prompt):].tolist()

        prefill_s, full_s, tokens = [], [], None
        for run_index in range(args.warmup + args.runs):
            start = time.perf_counter()
            generate(1)  # done when generate returns: its tokens are read back to the host
            middle = time.perf_counter()
            tokens = generate(1 + args.new_tokens)
            if run_index >= args.warmup:
                prefill_s.append(middle - start)
                full_s.append(time.perf_counter() - middle)
        reference = None if args.loras or temperature > 0 else greedy.get(str(batch))
        line = result_line(args.dtype, batch, len(prompt), args.new_tokens, prefill_s, full_s, weight_bytes,
                           tokens, reference, load_1m=load_average(), loras=args.loras, lora_rank=args.lora_rank,
                           temperature=temperature)
        record = json.loads(line)
        if record.get("greedy_match") is False:
            at = record["greedy_mismatch_at"]
            print(
                f"generate_torch.py: warning: batch {batch}: greedy tokens differ from grpo's from position "
                f"{at} (transformers {tokens[at:at + 4]}, grpo {reference[at:at + 4]})",
                file=sys.stderr,
            )
        print(
            f"batch {batch}: prefill {record['prefill_ms']:.1f} ms = {record['prefill_tokens_per_s']:.1f} tokens/s, "
            f"decode {record['decode_tokens_per_s']:.1f} tokens/s",
            file=sys.stderr,
        )
        print(line, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", required=True,
                        help="JSON file of `grpo bench generate --tokens-out` (the prompt ids, grpo's greedy tokens)")
    parser.add_argument("--model-dir", default=None, help="HF model folder (default: <grpo cache>/models/smollm2-135m-instruct)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    parser.add_argument("--batch", type=parse_batches, default=[1, 16, 64], help="batch sizes (default 1,16,64)")
    parser.add_argument("--new-tokens", type=int, default=64, help="decode tokens timed per request (default 64)")
    parser.add_argument("--dtype", choices=DTYPES, default="f32", help="parameter and compute dtype (default f32)")
    parser.add_argument("--attn", choices=ATTNS, default="sdpa", help="attn_implementation (default sdpa)")
    parser.add_argument("--runs", type=int, default=3, help="timed calls per setting (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch.set_num_threads (default: os.cpu_count())")
    parser.add_argument("--loras", type=int, default=0,
                        help="PEFT LoRA adapters on every linear layer, row i using adapter i mod N (default 0: none)")
    parser.add_argument("--lora-rank", type=int, default=16, help="the adapters' rank (default 16)")
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or args.runs < 1 or args.threads < 1:
        parser.error("--new-tokens, --runs and --threads must be at least 1")
    if args.loras < 0 or args.lora_rank < 1:
        parser.error("--loras must not be negative and --lora-rank must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.model_dir = args.model_dir or default_model_dir()
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        print(missing_model_message(args.model_dir).replace("model_step_torch.py", "generate_torch.py"), file=sys.stderr)
        return 1
    try:
        tokens_file = load_tokens(args.tokens)
    except (OSError, ValueError) as err:
        print(f"generate_torch.py: {err}", file=sys.stderr)
        return 1
    if tokens_file.get("dtype") not in (None, args.dtype):
        print(f"generate_torch.py: warning: {args.tokens} holds grpo's {tokens_file['dtype']} tokens; "
              f"comparing them with {args.dtype}", file=sys.stderr)
    run(args, tokens_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
