#!/usr/bin/env python3
"""Writes the SFT warm-start pairs for the arithmetic task: one- and
two-digit additions and subtractions as chat prompts (the questions of
examples/arithmetic/), each with its worked answer as the completion.

    python3 examples/sft/make_data.py [--rows 1100] [--seed 1]

Output: examples/sft/data.jsonl, one row per line:
{"prompt": [{"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "What is 47 - 9?"}],
 "completion": "47 - 9 = 38. The answer is 38."}
`grpo sft` renders the prompt with the model's chat template, appends the
completion's tokens and EOS, and trains on those tokens only. The config
holds out 100 rows for the eval loss (`[data] eval_size`). The default seed
differs from the GRPO data's, so the two sets are drawn independently."""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "arithmetic"))
from make_data import chat, problems  # noqa: E402  (the arithmetic example's generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    out = pathlib.Path(__file__).with_name("data.jsonl")
    with out.open("w") as f:
        for expression, answer in problems(args.seed, args.rows):
            row = {
                "prompt": chat(expression),
                "completion": f"{expression} = {answer}. The answer is {answer}.",
            }
            f.write(json.dumps(row) + "\n")
    print(f"wrote {args.rows} rows to {out}")


if __name__ == "__main__":
    main()
