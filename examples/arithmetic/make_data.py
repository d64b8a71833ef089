#!/usr/bin/env python3
"""Writes the arithmetic task's prompts: one- and two-digit additions and
subtractions as chat turns (a short system turn, then the question), with the
answer column the math reward checks.

    python3 examples/arithmetic/make_data.py [--rows 2200] [--seed 0]

Output: examples/arithmetic/data.jsonl, one row per line:
{"prompt": [{"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "What is 47 - 9?"}], "answer": "38"}
The run config holds out 200 rows for evaluation (`[data] eval_size`)."""

import argparse
import json
import pathlib
import random

SYSTEM_PROMPT = "Answer with a number."


def problems(seed: int, rows: int):
    """`rows` seeded problems as (expression, answer), e.g. ("47 - 9", 38);
    the SFT example's data comes from here too."""
    rng = random.Random(seed)
    for _ in range(rows):
        digits = rng.choice([1, 2])
        a = rng.randint(0, 10**digits - 1)
        b = rng.randint(0, 10**digits - 1)
        op = rng.choice(["+", "-"])
        answer = a + b if op == "+" else a - b
        yield f"{a} {op} {b}", answer


def chat(expression: str):
    """The prompt's chat turns asking for `expression`. The short system turn
    replaces the model's default one (about 20 tokens): 29 prompt tokens a
    row instead of 58, so a train step holds a third fewer tokens."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"What is {expression}?"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = pathlib.Path(__file__).with_name("data.jsonl")
    with out.open("w") as f:
        for expression, answer in problems(args.seed, args.rows):
            row = {"prompt": chat(expression), "answer": str(answer)}
            f.write(json.dumps(row) + "\n")
    print(f"wrote {args.rows} rows to {out}")


if __name__ == "__main__":
    main()
