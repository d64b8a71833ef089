#!/usr/bin/env python3
"""Writes the calculator task's data: arithmetic that SmolLM2-135M-Instruct
cannot do in its head, asked as chat turns, with the answer column the math
reward checks. A fifth of the problems are bare (a product or a quotient of
multi-digit numbers); the rest are two-step word problems whose expression
the model must build from the story (a*b-c, a*(b+c), p/a+c, ...).

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
  ("347 * 128 - 95 = 44321. The answer is 44321."), the baseline's warm start.

Word problems come in eight stories, each with its own shape of expression;
the SFT transcripts use only four of them, so after SFT the model knows how
to call the tool but must still find the expression of the other four
stories, whose shapes it has not seen (GRPO's and the held-out problems use
all eight)."""

import argparse
import json
import pathlib
import random
import re

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

# (story with {a}, {b}, {c}, {p}: the expression's shape over a, b, c and the
# answer q = p / a where a story divides).
WORD_PROBLEMS = [
    ("A shop packs {a} pencils in each box. It fills {b} boxes and sells {c} pencils. How many pencils are left?",
     "{a}*{b}-{c}"),
    ("A train carries {a} passengers on each trip. It makes {b} trips on Monday and {c} trips on Tuesday. "
     "How many passengers does it carry in all?", "{a}*({b}+{c})"),
    ("{p} apples are shared equally among {a} baskets, then {c} more apples are put in each basket. "
     "How many apples are in each basket now?", "{p}/{a}+{c}"),
    ("A printer prints {p} pages in {a} minutes at a steady rate. How many pages does it print in {c} minutes?",
     "{p}/{a}*{c}"),
    ("A ticket costs {a} dollars and a program costs {c} dollars. What do {b} tickets and {b} programs cost?",
     "({a}+{c})*{b}"),
    ("A farm plants {a} rows with {b} trees in each row, and {c} more trees by the gate. "
     "How many trees does it plant?", "{a}*{b}+{c}"),
    ("A tank holds {c} liters. {a} buckets of {b} liters each are taken out. How many liters are left?",
     "{c}-{a}*{b}"),
    ("{p} students are split into {a} equal groups, and {c} students leave each group. "
     "How many students are left in each group?", "{p}/{a}-{c}"),
]
SFT_STORIES = {0, 2, 4, 6}


def problem(rng: random.Random):
    """A seeded problem: (question, expression, answer, story); story is
    None for a bare question. Every answer is a positive whole number."""
    a = rng.randint(12, 999)
    b = rng.randint(12, 999)
    kind = rng.randrange(10)
    if kind == 0:
        return f"What is {a} * {b}?", f"{a}*{b}", a * b, None
    if kind == 1:
        return f"What is {a * b} divided by {a}?", f"{a * b}/{a}", b, None
    story = kind - 2
    text, shape = WORD_PROBLEMS[story]
    p = a * b  # the divided stories' total: p / a = b
    if "{c}-" in shape:
        c = a * b + rng.randint(10, 9999)  # the tank holds more than is taken out
    elif "-{c}" in shape:
        c = rng.randint(10, min(b - 1, 999) if "/" in shape else 999)
    else:
        c = rng.randint(12, 999)
    values = {"a": a, "b": b, "c": c, "p": p}
    expression = shape.format(**values)
    answer = eval(expression.replace("/", "//"))  # exact: every division here has no remainder
    return text.format(**values), expression, answer, story


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
    shown = re.sub(r"([-+*/])", r" \1 ", expression)
    return [{"role": "assistant", "content": f"{shown} = {answer}. The answer is {answer}."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seen = set()
    train, held_out, sft = [], [], []
    while len(train) < 2000 or len(held_out) < 500 or len(sft) < 400:
        question, expression, answer, story = problem(rng)
        if question in seen:
            continue
        seen.add(question)
        if len(held_out) < 500:
            held_out.append((question, expression, answer))
        elif len(sft) < 400 and (story is None or story in SFT_STORIES):
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
