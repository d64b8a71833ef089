"""Reads a run's TensorBoard event files with TensorBoard's own reader and
checks them, and the completions table, against the run's metrics.jsonl.

Usage: tensorboard_check.py OUT LOGGING_STEPS MAX_STEPS ROWS

OUT is the run's output folder, reported every LOGGING_STEPS steps (and at
the last, MAX_STEPS), each completions table ROWS rows long. Raises on a
mismatch; prints "tensorboard checks passed" at the end. Run by tests/run.rs
with the interpreter of tools/test-venv.sh.
"""

import json
import math
import pathlib
import sys

from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


def main():
    out, every, last, rows = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:5])
    reports = sorted({s for s in range(every, last + 1, every)} | {last})
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {line["step"]: line for line in metrics}

    files = sorted((out / "tensorboard").glob("events.out.tfevents.*"))
    assert files, "no event file"
    # The reader TensorBoard's own pages use (scalars come back as tensors).
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    scalar_tags = events.Tags()["tensors"]

    def scalars(tag):
        return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]

    # Each report once (a resumed run's START purged what the killed one
    # logged after its checkpoint), the mean of the steps since the last.
    reward = scalars("train/reward")
    assert [step for step, _ in reward] == reports, (reward, reports)
    previous = 0
    for step, value in reward:
        window = [by_step[s]["reward"] for s in range(previous + 1, step + 1) if "reward" in by_step.get(s, {})]
        expected = sum(window) / len(window)
        assert math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-7), (step, value, expected)
        previous = step
    for name in ["loss", "grad_norm", "completions/mean_length", "num_tokens"]:
        assert f"train/{name}" in scalar_tags, (name, scalar_tags)
    # Evaluations at their own steps: before the first, every EVAL_EVERY, after the last.
    accuracy = scalars("eval/accuracy")
    evaluated = [s for s, line in sorted(by_step.items()) if "eval_accuracy" in line]
    assert [step for step, _ in accuracy] == evaluated and evaluated[0] == 0, (accuracy, evaluated)
    for step, value in accuracy:
        assert math.isclose(value, by_step[step]["eval_accuracy"], rel_tol=1e-6, abs_tol=1e-7), (step, value)

    tables = events.Tensors("completions")
    assert [t.step for t in tables] == reports, [t.step for t in tables]
    for t in tables:
        text = tensor_util.make_ndarray(t.tensor_proto).item().decode()
        lines = text.strip().split("\n")
        assert lines[0] == "| prompt | completion | reward | advantage |", lines[0]
        assert len(lines) == 2 + rows, text

    table = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted({row["step"] for row in table}) == reports
    for step in reports:
        assert sum(row["step"] == step for row in table) == rows, step
    assert all({"prompt", "completion", "reward", "advantage"} <= set(row) for row in table)
    print("tensorboard checks passed", flush=True)


if __name__ == "__main__":
    main()
