#!/usr/bin/env python3
"""Writes the calculator task's data: arithmetic that SmolLM2-135M-Instruct
cannot do in its head (multi-digit multiplication and division, one-step
word problems), asked as chat turns, with the answer column the math reward
checks.

    python3 examples/calculator/make_data.py [--seed 0]

Outputs, next to this script:

- train.jsonl: 2000 GRPO prompts {"prompt": [system, user], "answer": "44416"}.
- eval.jsonl: 500 held-out problems, the same shape; no problem is in
  another file.
- sft_tool.jsonl: 400 tool-use transcripts for `grpo sft`: the assistant
  calls `calculate` with the problem's expression, reads the result and
  answers; the row's "tools" column (TRL's) offers the tool as the run's
  `[environment]` does, so the SFT prompt is the GRPO prompt id for id.
- sft_plain.jsonl: the same 400 problems worked without a tool
  ("347 * 128 = 44416. The answer is 44416."), the baseline's warm start.

Word problems come in eight phrasings; the SFT transcripts use only four of
them, so after SFT the model has seen how to call the tool but must still
find the expression for the other four (GRPO's and the held-out problems use
all eight)."""

import argparse
import json
import pathlib
import random

# One system turn for every file: with the tool on offer the chat template
# adds the tool's signature to it.
SYSTEM_PROMPT = "Solve the problem. Answer with the number."

# The built-in `calculate` tool exactly as grpo offers it (env/src/calculate.rs;
# tests/examples.rs checks the two agree).
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluates an arithmetic expression exactly: numbers, + - * / ^ and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 12*(3+4)/5"}},
            "required": ["expression"],
        },
    },
}

# (question with {a} and {b}, the expression's operator). Multiplications
# ask for a × b; divisions give the product and ask for the quotient.
WORD_PROBLEMS = [
    ("A shop packs {a} pencils in each box. How many pencils are in {b} boxes?", "*"),
    ("A train carries {a} passengers on each trip. How many passengers does it carry in {b} trips?", "*"),
    ("{p} apples are shared equally among {a} baskets. How many apples go in each basket?", "/"),
    ("A printer prints {p} pages in {a} minutes at a steady rate. How many pages does it print per minute?", "/"),
    ("Each seat in a stadium costs {a} dollars. What do {b} seats cost?", "*"),
    ("A farm plants {a} rows with {b} trees in each row. How many trees does it plant?", "*"),
    ("A tank holds {p} liters and is emptied by {a} equal buckets. How many liters does each bucket take?", "/"),
    ("{p} students are split into {a} equal groups. How many students are in each group?", "/"),
]
SFT_PHRASINGS = {0, 2, 4, 6}


def problem(rng: random.Random):
    """A seeded problem: (question, expression, answer, phrasing); phrasing
    is None for a bare question."""
    a = rng.randint(12, 999)
    b = rng.randint(12, 999)
    kind = rng.randrange(10)
    if kind == 0:
        return f"What is {a} * {b}?", f"{a}*{b}", a * b, None
    if kind == 1:
        return f"What is {a * b} divided by {a}?", f"{a * b}/{a}", b, None
    phrasing = kind - 2
    text, op = WORD_PROBLEMS[phrasing]
    if op == "*":
        return text.format(a=a, b=b), f"{a}*{b}", a * b, phrasing
    return text.format(a=a, p=a * b), f"{a * b}/{a}", b, phrasing


def prompt(question: str):
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def tool_transcript(expression: str, answer: int):
    """The assistant calls the tool, reads its result, and answers."""
    call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(answer)},
        {"role": "assistant", "content": f"The answer is {answer}."},
    ]


def worked(expression: str, answer: int):
    """The worked solution without a tool."""
    shown = expression.replace("*", " * ").replace("/", " / ")
    return [{"role": "assistant", "content": f"{shown} = {answer}. The answer is {answer}."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seen = set()
    train, held_out, sft = [], [], []
    while len(train) < 2000 or len(held_out) < 500 or len(sft) < 400:
        question, expression, answer, phrasing = problem(rng)
        if question in seen:
            continue
        seen.add(question)
        if len(held_out) < 500:
            held_out.append((question, expression, answer))
        elif len(sft) < 400 and (phrasing is None or phrasing in SFT_PHRASINGS):
            sft.append((question, expression, answer))
        elif len(train) < 2000:
            train.append((question, expression, answer))
    here = pathlib.Path(__file__).parent

    def write(name, rows):
        with (here / name).open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {len(rows)} rows to {here / name}")

    write("train.jsonl", [{"prompt": prompt(q), "answer": str(a)} for q, _, a in train])
    write("eval.jsonl", [{"prompt": prompt(q), "answer": str(a)} for q, _, a in held_out])
    write(
        "sft_tool.jsonl",
        [{"prompt": prompt(q), "completion": tool_transcript(e, a), "tools": [CALCULATE]} for q, e, a in sft],
    )
    write(
        "sft_plain.jsonl",
        [{"prompt": prompt(q), "completion": worked(e, a)} for q, e, a in sft],
    )


if __name__ == "__main__":
    main()
