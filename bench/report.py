#!/usr/bin/env python3
"""Side-by-side table of `grpo bench train-step` against bench/train_step_torch.py.

Reads JSON lines from the files named on the command line, or from stdin:

  train step:  {"impl": "grpo"|"torch", "model": "mlp", "median_ms": .., "best_ms": .., "runs": 7}
  matmul:      {"dtype": "f32", "n": 2048, "median_ms": .., "best_ms": .., "gflops": ..}

Any other line (a log line, a blank, broken JSON) is skipped, with a note on
stderr for lines that start with "{" but do not parse. Several lines for the
same (impl, model), one per round of train_step.sh, are reduced to the median
of their medians (and the best of their bests). The ceiling is the median
`gflops` of the f32 n=2048 matmul lines. FLOPs per step come from a line's
"flops" field if it has one, else from train_step_torch.train_step_flops.

Columns: model, grpo and torch median ms, speed-up (torch / grpo: above 1 means
grpo is faster), achieved GFLOP/s of each, and each as a share of the ceiling.
Needs no torch.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_torch import train_step_flops  # noqa: E402  (torch-free)

IMPLS = ("grpo", "torch")
CEILING_DTYPE = "f32"
CEILING_N = 2048


def parse_lines(lines, warn=None):
    """JSON objects of `lines`; other lines are skipped (`warn(msg)` for broken JSON)."""
    records = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if warn:
                warn(f"line {number}: not JSON ({err.msg}): {line[:80]}")
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _number(value):
    """`value` as a positive finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if 0 < value < float("inf") else None


def is_train_step(record):
    return (
        isinstance(record.get("impl"), str)
        and isinstance(record.get("model"), str)
        and _number(record.get("median_ms")) is not None
    )


def is_matmul(record):
    return (
        "dtype" in record
        and "n" in record
        and _number(record.get("gflops")) is not None
    )


def matmul_ceiling(records, dtype=CEILING_DTYPE, n=CEILING_N):
    """Median GFLOP/s of the matmul lines of `dtype` and size `n`, or None."""
    rates = [
        _number(r["gflops"])
        for r in records
        if is_matmul(r) and r["dtype"] == dtype and r["n"] == n
    ]
    return statistics.median(rates) if rates else None


def step_flops(model, records=()):
    """FLOPs per step of `model`: a record's "flops" field, else the analytic count."""
    for r in records:
        if r.get("model") == model and _number(r.get("flops")) is not None:
            return float(r["flops"])
    try:
        return float(train_step_flops(model))
    except ValueError:
        return None


def aggregate(records):
    """{(impl, model): {"median_ms", "best_ms", "rounds", "runs"}} over the train-step lines."""
    groups = {}
    for r in records:
        if is_train_step(r):
            groups.setdefault((r["impl"], r["model"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        bests = [_number(r.get("best_ms")) for r in rs]
        bests = [b for b in bests if b is not None]
        out[key] = {
            "median_ms": statistics.median(_number(r["median_ms"]) for r in rs),
            "best_ms": min(bests) if bests else None,
            "rounds": len(rs),
            "runs": sum(int(r.get("runs") or 0) for r in rs),
        }
    return out


def gflops(flops, ms):
    """GFLOP/s of `flops` done in `ms` milliseconds, or None."""
    if flops is None or ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e9


def _ratio(a, b):
    return a / b if a is not None and b else None


def build_rows(records):
    """One dict per model, in order of first appearance (mlp, block first if present)."""
    stats = aggregate(records)
    ceiling = matmul_ceiling(records)
    models = []
    for impl, model in stats:
        if model not in models:
            models.append(model)
    order = {"mlp": 0, "block": 1}
    models.sort(key=lambda m: order.get(m, len(order)))
    rows = []
    for model in models:
        flops = step_flops(model, records)
        row = {"model": model, "flops": flops}
        for impl in IMPLS:
            s = stats.get((impl, model))
            ms = s["median_ms"] if s else None
            row[f"{impl}_ms"] = ms
            row[f"{impl}_rounds"] = s["rounds"] if s else 0
            row[f"{impl}_gflops"] = gflops(flops, ms)
            row[f"{impl}_of_ceiling"] = _ratio(row[f"{impl}_gflops"], ceiling)
        row["speedup"] = _ratio(row["torch_ms"], row["grpo_ms"])
        rows.append(row)
    return rows


def _fmt(value, spec, unit="", scale=1.0):
    """`value * scale` formatted with `spec` and `unit`, or "n/a" for None."""
    return "n/a" if value is None else format(value * scale, spec) + unit


def format_table(rows, ceiling=None):
    """A Markdown table of `rows` (from build_rows), with the ceiling named above it."""
    lines = [
        f"f32 {CEILING_N} matmul ceiling (grpo bench matmul): "
        + (f"{ceiling:.1f} GFLOP/s" if ceiling is not None else "not measured"),
        "",
    ]
    header = [
        "model", "GFLOP/step", "grpo ms", "torch ms", "speed-up (torch/grpo)",
        "grpo GFLOP/s", "torch GFLOP/s", "grpo / ceiling", "torch / ceiling",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        cells = [
            r["model"],
            _fmt(r["flops"], ".2f", scale=1e-9),
            _fmt(r["grpo_ms"], ".1f"),
            _fmt(r["torch_ms"], ".1f"),
            _fmt(r["speedup"], ".2f", "x"),
            _fmt(r["grpo_gflops"], ".1f"),
            _fmt(r["torch_gflops"], ".1f"),
            _fmt(r["grpo_of_ceiling"], ".0f", "%", 100.0),
            _fmt(r["torch_of_ceiling"], ".0f", "%", 100.0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    rounds = sorted({(r["grpo_rounds"], r["torch_rounds"]) for r in rows})
    lines.append("")
    lines.append(
        "ms: median over rounds of each round's median; rounds (grpo, torch): "
        + ", ".join(f"{g}/{t}" for g, t in rounds)
    )
    return "\n".join(lines)


def report(lines, warn=None):
    """The whole report for the JSON `lines`."""
    records = parse_lines(lines, warn)
    rows = build_rows(records)
    if not rows:
        raise ValueError("no train-step lines found")
    return format_table(rows, matmul_ceiling(records))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="JSON-lines files (default: stdin)")
    args = parser.parse_args(argv)
    lines = []
    if args.files:
        for path in args.files:
            with open(path, encoding="utf-8") as f:
                lines.extend(f.read().splitlines())
    else:
        lines = sys.stdin.read().splitlines()
    try:
        print(report(lines, warn=lambda msg: print(f"report.py: {msg}", file=sys.stderr)))
    except ValueError as err:
        print(f"report.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
