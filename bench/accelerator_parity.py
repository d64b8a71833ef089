#!/usr/bin/env python3
"""The accelerator check's smoke test: grpo's log-probs against transformers'.

Reads the `grpo logprobs` input (--input: {"prompt", "completion"} lines) and
its output (--logprobs: {"logprobs": [...]} lines), scores the same text with
transformers in f32 on --device (prompt and completion tokenized each on its
own, as `grpo logprobs` does), and prints one JSON line:

    {"tokens": 19, "max_abs_diff": 3.1e-06, "tolerance": 0.0001, "ok": true}

--tolerance defaults to 1e-4; bench/accelerator.sh gives 1e-2 when grpo ran on
a GPU, where XLA may run f32 products in TF32 and torch does not. Exits 1 when
the difference is above it.
"""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--logprobs", required=True)
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest absolute difference allowed")
    args = parser.parse_args()

    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model = model.to(args.device).eval()
    with open(args.input) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(args.logprobs) as f:
        ours = [json.loads(line)["logprobs"] for line in f if line.strip()]
    if len(rows) != len(ours):
        print(f"accelerator_parity.py: {len(rows)} inputs but {len(ours)} grpo answers", file=sys.stderr)
        return 1
    worst, tokens = 0.0, 0
    for row, grpo in zip(rows, ours):
        prompt = tokenizer(row["prompt"])["input_ids"]
        completion = tokenizer(row["completion"])["input_ids"]
        ids = torch.tensor([prompt + completion], device=args.device)
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        theirs = logp.gather(-1, ids[0, len(prompt):].unsqueeze(-1)).squeeze(-1).tolist()
        if len(theirs) != len(grpo):
            print(f"accelerator_parity.py: {len(grpo)} grpo log-probs for {len(theirs)} tokens", file=sys.stderr)
            return 1
        worst = max([worst] + [abs(a - b) for a, b in zip(grpo, theirs)])
        tokens += len(theirs)
    ok = worst <= args.tolerance
    print(json.dumps({"tokens": tokens, "max_abs_diff": worst, "tolerance": args.tolerance, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
