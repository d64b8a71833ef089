#!/usr/bin/env python3
"""Side-by-side tables of grpo's benchmarks against their PyTorch competitors.

Reads JSON lines from the files named on the command line, or from stdin:

  train step:  {"impl": "grpo"|"torch", "model": "mlp", "median_ms": .., "best_ms": .., "runs": 7}
  model step:  {"impl": "grpo"|"torch-eager"|"torch-sdpa", "model": "smollm2-135m",
                "dtype": "f32"|"bf16", "batch": 8, "seq": 256, "median_ms": .., "best_ms": .., "runs": 3}
  matmul:      {"dtype": "f32", "n": 2048, "median_ms": .., "best_ms": .., "gflops": ..}
  generate:    {"impl": "grpo"|"transformers", "bench": "generate", "model": "smollm2-135m",
                "dtype", "batch", "prompt_tokens", "new_tokens", "prefill_tokens_per_s",
                "decode_tokens_per_s", "weight_bytes", ..; grpo's add "copy_gbps",
                transformers' "greedy_match" (and "greedy_mismatch_at")}

Train-step lines (`grpo bench train-step`, bench/train_step_torch.py) and
model-step lines (`grpo bench model-step`, bench/model_step_torch.py; told
apart by their "batch" and "seq" fields) get one table each; a file may hold
either or both; generate lines (`grpo bench generate`,
bench/generate_torch.py; told apart by "bench": "generate") a third.

Any other line (a log line, a blank, broken JSON) is skipped, with a note on
stderr for lines that start with "{" but do not parse. Several lines for the
same (impl, model), one per round of train_step.sh, are reduced to the median
of their medians (and the best of their bests). The ceiling is the median
`gflops` of the f32 n=2048 matmul lines. FLOPs per step come from a line's
"flops" field if it has one, else from train_step_torch.train_step_flops.

Train-step columns: model, grpo and torch median ms, speed-up (torch / grpo:
above 1 means grpo is faster), achieved GFLOP/s of each, and each as a share
of the ceiling.

Model-step rows are one per (model, batch x seq, dtype, impl): median ms
(median of the rounds' medians), tokens/s (batch * seq tokens per step),
GFLOP/s (model_step_torch.step_flops, or a line's "flops" field), MFU (that
as a share of the median n=2048 matmul GFLOP/s of the same dtype) and grpo's
speed-up over the row (row ms / grpo ms of the same model, shape and dtype).

Generate rows are one per (model, dtype, prompt + new tokens, batch): the
prefill and decode tokens/s of grpo and transformers (medians over the rounds'
lines), grpo / transformers of each (above 1 means grpo is faster), at batch 1
each decode rate as a share of the bandwidth limit (the median "copy_gbps" of
grpo's lines over the dtype's "weight_bytes": one read of every weight per
token), and whether transformers' greedy tokens equalled grpo's in every round;
below it the range of the lines' 1-minute load averages ("load_1m").

GRPO-loop lines (bench/grpo_loop.sh: {"bench": "grpo_loop", "system": "trl"|"grpo",
"round", "step", "step_time", "reward"}, grpo's with "time_generation", "time_reward",
"time_train", "time_weight_sync"; optional {"eval_step", "eval_accuracy"} lines and
TRL's {"info": {...}}) get a table of their own: per system the median step time
over steps 2.. of every round (step 1 compiles and warms up), trl / grpo, grpo's
median split, the mean reward per step over the rounds and the greedy accuracy
before and after training.
Needs no torch.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_torch import train_step_flops  # noqa: E402  (torch-free)
from model_step_torch import model_flops  # noqa: E402  (torch-free)

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


def _is_timing(record):
    return (
        isinstance(record.get("impl"), str)
        and isinstance(record.get("model"), str)
        and _number(record.get("median_ms")) is not None
    )


def _count(value):
    """`value` as a positive int, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def is_model_step(record):
    """A `grpo bench model-step` / model_step_torch.py line."""
    return (
        _is_timing(record)
        and isinstance(record.get("dtype"), str)
        and _count(record.get("batch")) is not None
        and _count(record.get("seq")) is not None
    )


def is_train_step(record):
    """A `grpo bench train-step` / train_step_torch.py line (no batch or seq)."""
    return _is_timing(record) and "batch" not in record and "seq" not in record


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


# --- model step ---------------------------------------------------------------

MODEL_IMPLS = ("grpo", "torch-eager", "torch-sdpa")
MODEL_DTYPES = ("f32", "bf16")


def model_step_flops(model, batch, seq, records=()):
    """FLOPs per step: a matching line's "flops" field, else the analytic count, else None."""
    for r in records:
        if (
            is_model_step(r)
            and (r["model"], r["batch"], r["seq"]) == (model, batch, seq)
            and _number(r.get("flops")) is not None
        ):
            return float(r["flops"])
    flops = model_flops(model, batch, seq)
    return None if flops is None else float(flops)


def aggregate_model_steps(records):
    """{(model, batch, seq, dtype, impl): {"median_ms", "best_ms", "rounds", "runs"}}."""
    groups = {}
    for r in records:
        if is_model_step(r):
            key = (r["model"], r["batch"], r["seq"], r["dtype"], r["impl"])
            groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        bests = [b for b in (_number(r.get("best_ms")) for r in rs) if b is not None]
        out[key] = {
            "median_ms": statistics.median(_number(r["median_ms"]) for r in rs),
            "best_ms": min(bests) if bests else None,
            "rounds": len(rs),
            "runs": sum(int(r.get("runs") or 0) for r in rs),
        }
    return out


def _order(value, known):
    return (known.index(value), "") if value in known else (len(known), value)


def matmul_ceilings(records, n=CEILING_N):
    """{dtype: median GFLOP/s of the n x n matmul lines of that dtype}."""
    dtypes = {r["dtype"] for r in records if is_matmul(r) and r["n"] == n}
    return {d: matmul_ceiling(records, d, n) for d in dtypes}


def build_model_rows(records):
    """One dict per (model, batch, seq, dtype, impl), grpo first within each dtype."""
    stats = aggregate_model_steps(records)
    ceilings = matmul_ceilings(records)
    keys = sorted(
        stats,
        key=lambda k: (k[0], k[1], k[2], _order(k[3], MODEL_DTYPES), _order(k[4], MODEL_IMPLS)),
    )
    rows = []
    for model, batch, seq, dtype, impl in keys:
        s = stats[(model, batch, seq, dtype, impl)]
        grpo = stats.get((model, batch, seq, dtype, "grpo"))
        flops = model_step_flops(model, batch, seq, records)
        ms = s["median_ms"]
        rate = gflops(flops, ms)
        ceiling = ceilings.get(dtype)
        rows.append(
            {
                "model": model,
                "batch": batch,
                "seq": seq,
                "dtype": dtype,
                "impl": impl,
                "flops": flops,
                "median_ms": ms,
                "best_ms": s["best_ms"],
                "rounds": s["rounds"],
                "runs": s["runs"],
                "tokens_per_s": batch * seq / (ms * 1e-3),
                "gflops": rate,
                "ceiling": ceiling,
                "mfu": _ratio(rate, ceiling),
                "speedup": None if impl == "grpo" or grpo is None else _ratio(ms, grpo["median_ms"]),
            }
        )
    return rows


def format_model_table(rows, ceilings=None):
    """A Markdown table of `rows` (from build_model_rows), the ceilings named above it."""
    ceilings = ceilings or {}
    named = [
        f"{d} {ceilings[d]:.1f} GFLOP/s"
        for d in sorted(ceilings, key=lambda d: _order(d, MODEL_DTYPES))
        if ceilings[d] is not None
    ]
    lines = [
        f"model step (forward + backward): {CEILING_N} matmul ceilings (grpo bench matmul): "
        + (", ".join(named) if named else "not measured"),
        "",
    ]
    header = [
        "model", "B×S", "dtype", "impl", "GFLOP/step", "median ms", "tokens/s",
        "GFLOP/s", "MFU (same-dtype ceiling)", "grpo speed-up (impl ms / grpo ms)",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" if i < 4 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        cells = [
            r["model"],
            f"{r['batch']}×{r['seq']}",
            r["dtype"],
            r["impl"],
            _fmt(r["flops"], ".1f", scale=1e-9),
            _fmt(r["median_ms"], ".1f"),
            _fmt(r["tokens_per_s"], ".1f"),
            _fmt(r["gflops"], ".1f"),
            _fmt(r["mfu"], ".0f", "%", 100.0),
            "—" if r["impl"] == "grpo" else _fmt(r["speedup"], ".2f", "x"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    rounds = sorted({r["rounds"] for r in rows})
    lines.append("")
    lines.append(
        "ms: median over rounds of each round's median; rounds per row: "
        + ", ".join(str(n) for n in rounds)
        + "; speed-up above 1 means grpo is faster"
    )
    return "\n".join(lines)


# --- generate -----------------------------------------------------------------

GENERATE_IMPLS = ("grpo", "transformers")


def is_generate(record):
    """A `grpo bench generate` / generate_torch.py line."""
    return (
        record.get("bench") == "generate"
        and isinstance(record.get("impl"), str)
        and isinstance(record.get("model"), str)
        and isinstance(record.get("dtype"), str)
        and all(_count(record.get(k)) is not None for k in ("batch", "prompt_tokens", "new_tokens"))
        and _number(record.get("prefill_tokens_per_s")) is not None
        and _number(record.get("decode_tokens_per_s")) is not None
    )


def _median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def copy_bandwidth(records):
    """Median "copy_gbps" of the generate lines (GB/s, bytes read + written by a copy), or None."""
    return _median_of(_number(r.get("copy_gbps")) for r in records if is_generate(r))


def weight_bytes(records, model, dtype):
    """The "weight_bytes" of a generate line of `model` in `dtype` (grpo's first), or None."""
    lines = sorted(
        (r for r in records if is_generate(r) and (r["model"], r["dtype"]) == (model, dtype)),
        key=lambda r: r["impl"] != "grpo",
    )
    for r in lines:
        if _count(r.get("weight_bytes")) is not None:
            return r["weight_bytes"]
    return None


def _greedy(lines):
    """"yes" if every line's greedy_match is true, "no (from token k)" if one is false, None if none says."""
    marks = [r for r in lines if isinstance(r.get("greedy_match"), bool)]
    if not marks:
        return None
    wrong = [r for r in marks if not r["greedy_match"]]
    if not wrong:
        return "yes"
    at = [r["greedy_mismatch_at"] for r in wrong if isinstance(r.get("greedy_mismatch_at"), int)]
    return f"no (from token {min(at)})" if at else "no"


def build_generate_rows(records):
    """One dict per (model, dtype, prompt_tokens, new_tokens, LoRA adapters and rank, temperature, batch),
    each impl's medians in it (lines without "loras" have none; without "temperature", greedy)."""
    groups = {}
    for r in records:
        if is_generate(r):
            count = _count(r.get("loras")) or 0
            loras = (count, _count(r.get("lora_rank")) or 0 if count else 0)  # no adapters: no rank
            temperature = _number(r.get("temperature")) or 0.0
            key = (r["model"], r["dtype"], r["prompt_tokens"], r["new_tokens"], loras, temperature, r["batch"])
            groups.setdefault(key, {}).setdefault(r["impl"], []).append(r)
    bandwidth = copy_bandwidth(records)
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], _order(k[1], MODEL_DTYPES), k[2], k[3], k[4], k[5], k[6])):
        model, dtype, prompt, new, (loras, rank), temperature, batch = key
        weights = weight_bytes(records, model, dtype)
        limit = bandwidth * 1e9 / weights if bandwidth is not None and weights else None
        row = {
            "model": model, "dtype": dtype, "prompt_tokens": prompt, "new_tokens": new, "batch": batch,
            "loras": loras, "lora_rank": rank, "temperature": temperature, "weight_bytes": weights,
            "bandwidth_tokens_per_s": limit,
        }
        for impl in GENERATE_IMPLS:
            lines = groups[key].get(impl, [])
            row[f"{impl}_rounds"] = len(lines)
            for rate in ("prefill", "decode"):
                row[f"{impl}_{rate}"] = _median_of(_number(r[f"{rate}_tokens_per_s"]) for r in lines)
            row[f"{impl}_of_limit"] = _ratio(row[f"{impl}_decode"], limit) if batch == 1 and not loras else None
        row["prefill_ratio"] = _ratio(row["grpo_prefill"], row["transformers_prefill"])
        row["decode_ratio"] = _ratio(row["grpo_decode"], row["transformers_decode"])
        row["greedy"] = _greedy(groups[key].get("transformers", []))
        rows.append(row)
    return rows


def load_range(records):
    """(lowest, highest) "load_1m" of the generate lines, or None if none has one."""
    loads = [r["load_1m"] for r in records if is_generate(r) and _number(r.get("load_1m")) is not None]
    return (min(loads), max(loads)) if loads else None


def format_generate_table(rows, bandwidth=None, loads=None):
    """A Markdown table of `rows` (from build_generate_rows), the bandwidth and limits named above it,
    the range of 1-minute load averages (`loads`, from load_range) below it."""
    limits = []
    for r in rows:
        if r["batch"] == 1 and not r["loras"] and r["weight_bytes"] and r["bandwidth_tokens_per_s"] is not None:
            limits.append(
                f"{r['dtype']} {r['weight_bytes'] / 1e6:.1f} MB of weights → {r['bandwidth_tokens_per_s']:.1f} tokens/s"
            )
    lines = [
        "generate (greedy unless the model cell names a temperature, EOS ignored; tokens/s): copy bandwidth "
        + (f"{bandwidth:.1f} GB/s (grpo, copy_from_slice, bytes read + written)" if bandwidth is not None else "not measured")
        + ("; batch-1 decode limits: " + ", ".join(dict.fromkeys(limits)) if limits else ""),
        "",
    ]
    header = [
        "model", "dtype", "prompt+new", "batch", "grpo prefill", "transformers prefill", "prefill grpo/tf",
        "grpo decode", "transformers decode", "decode grpo/tf", "grpo / bw limit", "tf / bw limit", "greedy = grpo",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        adapters = f" + {r['loras']} LoRA r{r['lora_rank']}" if r["loras"] else ""
        if r.get("temperature"):
            adapters += f", sampled at T {r['temperature']:g}"
        cells = [
            r["model"] + adapters,
            r["dtype"],
            f"{r['prompt_tokens']}+{r['new_tokens']}",
            str(r["batch"]),
            _fmt(r["grpo_prefill"], ".1f"),
            _fmt(r["transformers_prefill"], ".1f"),
            _fmt(r["prefill_ratio"], ".2f", "x"),
            _fmt(r["grpo_decode"], ".1f"),
            _fmt(r["transformers_decode"], ".1f"),
            _fmt(r["decode_ratio"], ".2f", "x"),
            "—" if r["batch"] != 1 or r["loras"] else _fmt(r["grpo_of_limit"], ".0f", "%", 100.0),
            "—" if r["batch"] != 1 or r["loras"] else _fmt(r["transformers_of_limit"], ".0f", "%", 100.0),
            r["greedy"] or "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    rounds = sorted({(r["grpo_rounds"], r["transformers_rounds"]) for r in rows})
    lines.append("")
    lines.append(
        "tokens/s: median over rounds; prefill = batch·prompt / t(1 token), decode = batch·new / "
        "(t(1 + new tokens) − t(1 token)); rounds (grpo, transformers): "
        + ", ".join(f"{g}/{t}" for g, t in rounds)
        + "; grpo/tf above 1 means grpo is faster"
        + (f"; 1-minute load average {loads[0]:.2f}–{loads[1]:.2f}" if loads else "")
    )
    return "\n".join(lines)


# --- GRPO loop ----------------------------------------------------------------

LOOP_SYSTEMS = ("trl", "grpo", "grpo-bf16")
GRPO_SYSTEMS = ("grpo", "grpo-bf16")  # f32, and bf16 compute + bf16 engine
LOOP_SPLIT = ("time_generation", "time_reward", "time_train", "time_weight_sync")


def is_grpo_loop(record):
    """A bench/grpo_loop.sh step line (grpo_loop_trl.py or `grpo run`'s metrics.jsonl)."""
    return (
        record.get("bench") == "grpo_loop"
        and record.get("system") in LOOP_SYSTEMS
        and _count(record.get("step")) is not None
        and _number(record.get("step_time")) is not None
    )


def _is_loop_eval(record):
    return (
        record.get("bench") == "grpo_loop"
        and record.get("system") in LOOP_SYSTEMS
        and isinstance(record.get("eval_step"), int)
        and isinstance(record.get("eval_accuracy"), (int, float))
    )


def build_grpo_loop_summary(records):
    """Per system: median step time over steps >= 2 (step 1 compiles and warms up; all steps if
    there is no later one), the first step's median, mean reward per step over the rounds and the
    start / end greedy accuracy; trl / grpo; grpo's median split over the same steps. None if no lines."""
    lines = [r for r in records if is_grpo_loop(r)]
    if not lines:
        return None
    systems = {}
    for system in LOOP_SYSTEMS:
        mine = [r for r in lines if r["system"] == system]
        if not mine:
            continue
        later = [r for r in mine if r["step"] >= 2]
        timed = later or mine
        rewards = {}
        for r in mine:
            if isinstance(r.get("reward"), (int, float)) and not isinstance(r.get("reward"), bool):
                rewards.setdefault(r["step"], []).append(float(r["reward"]))
        evals = {}
        for r in records:
            if _is_loop_eval(r) and r["system"] == system:
                evals.setdefault(r["eval_step"], []).append(float(r["eval_accuracy"]))
        entry = {
            "rounds": len({r.get("round", 1) for r in mine}),
            "steps": max(r["step"] for r in mine),
            "timed": len(timed),
            "warmup_excluded": bool(later),
            "median_s": statistics.median(_number(r["step_time"]) for r in timed),
            "first_s": _median_of(_number(r["step_time"]) for r in mine if r["step"] == 1),
            "reward_per_step": {k: statistics.mean(v) for k, v in sorted(rewards.items())},
            "mean_reward": statistics.mean(x for v in rewards.values() for x in v) if rewards else None,
            "eval_start": statistics.mean(evals[min(evals)]) if evals else None,
            "eval_end": statistics.mean(evals[max(evals)]) if len(evals) > 1 else None,
            "peak_rss_gb": _max_of(_number(r.get("peak_rss_bytes")) for r in mine),
        }
        if system in GRPO_SYSTEMS:
            entry["split"] = {k: _median_of(_number(r.get(k)) for r in timed) for k in LOOP_SPLIT}
            if any(v is None for v in entry["split"].values()):
                entry["split"] = {k: v for k, v in entry["split"].items() if v is not None}
        systems[system] = entry
    trl = systems.get("trl")
    ratios = {g: _ratio(trl["median_s"], systems[g]["median_s"]) for g in GRPO_SYSTEMS if trl and g in systems}
    return {"systems": systems, "ratio": ratios.get("grpo"), "ratios": ratios}


def _max_of(values):
    """The largest of the numbers among `values`, in GB (bytes / 1e9); None if there are none."""
    present = [v for v in values if v is not None]
    return max(present) / 1e9 if present else None


def _loop_info(records):
    """The first TRL info line's dict ({} if none)."""
    for r in records:
        if r.get("bench") == "grpo_loop" and isinstance(r.get("info"), dict):
            return r["info"]
    return {}


def format_grpo_loop_table(summary, info=None):
    """Markdown for build_grpo_loop_summary's `summary`; `info` (TRL's info line) names the batch."""
    info = info or {}
    systems = summary["systems"]
    shape = ""
    if all(k in info for k in ("prompts", "samples", "max_tokens")):
        shape = (
            f" ({info['prompts']} prompts × {info['samples']} samples = {info['prompts'] * info['samples']} "
            f"sequences a step, ≤ {info['max_tokens']} new tokens)"
        )
    ratios = [f"trl / {g} = {r:.2f}x" for g, r in summary["ratios"].items() if r is not None]
    lines = [
        f"GRPO loop, SmolLM2-135M-Instruct on CPU{shape}: "
        + (", ".join(ratios) if ratios else "trl / grpo n/a")
        + " (median step time; above 1 means grpo is faster; trl and grpo in f32, grpo-bf16 with bf16"
        " compute on f32 master weights and a bf16 engine)",
        "",
    ]
    header = ["system", "rounds", "steps", "median s/step", "step-1 s", "mean reward", "eval accuracy start → end",
              "peak RSS GB"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---|" + "|".join("---:" for _ in header[1:]) + "|")
    for system in LOOP_SYSTEMS:
        s = systems.get(system)
        if not s:
            continue
        ev = "n/a"
        if s["eval_start"] is not None:
            ev = f"{s['eval_start'] * 100:.1f}% → " + _fmt(s["eval_end"], ".1f", "%", 100.0)
        lines.append("| " + " | ".join([
            system, str(s["rounds"]), str(s["steps"]), _fmt(s["median_s"], ".2f"), _fmt(s["first_s"], ".2f"),
            _fmt(s["mean_reward"], ".3f"), ev, _fmt(s["peak_rss_gb"], ".2f"),
        ]) + " |")
    names = {"time_generation": "generation", "time_reward": "reward", "time_train": "train",
             "time_weight_sync": "weight sync"}
    for system in GRPO_SYSTEMS:
        grpo = systems.get(system)
        if not (grpo and grpo.get("split")):
            continue
        parts = [
            f"{names[k]} {v:.2f} s ({v / grpo['median_s'] * 100:.0f}%)" if grpo["median_s"] else f"{names[k]} {v:.2f} s"
            for k, v in grpo["split"].items()
        ]
        lines.append("")
        lines.append(f"{system} split (medians over the same steps): " + ", ".join(parts))
    steps = sorted({k for s in systems.values() for k in s["reward_per_step"]})
    if steps:
        present = [x for x in LOOP_SYSTEMS if x in systems]
        lines.append("")
        lines.append("| step | " + " | ".join(f"{x} reward" for x in present) + " |")
        lines.append("|---:|" + "|".join("---:" for _ in present) + "|")
        for k in steps:
            lines.append(f"| {k} | " + " | ".join(_fmt(systems[x]["reward_per_step"].get(k), ".3f") for x in present) + " |")
    excluded = all(s["warmup_excluded"] for s in systems.values())
    lines.append("")
    lines.append(
        ("median s/step over steps 2.. of every round (step 1 compiles and warms up)" if excluded
         else "median s/step over all steps (a run of 1 step: the warm-up is included)")
        + "; reward: mean over the rounds of each step's mean reward; eval: greedy accuracy on the held-out rows"
        + "; peak RSS: the largest process's peak resident memory over its steps"
    )
    return "\n".join(lines)


def report(lines, warn=None):
    """The whole report for the JSON `lines`: the GRPO-loop, generate, model-step and train-step tables."""
    records = parse_lines(lines, warn)
    parts = []
    loop = build_grpo_loop_summary(records)
    if loop:
        parts.append(format_grpo_loop_table(loop, _loop_info(records)))
    generate_rows = build_generate_rows(records)
    if generate_rows:
        parts.append(format_generate_table(generate_rows, copy_bandwidth(records), load_range(records)))
    model_rows = build_model_rows(records)
    if model_rows:
        parts.append(format_model_table(model_rows, matmul_ceilings(records)))
    rows = build_rows(records)
    if rows:
        parts.append(format_table(rows, matmul_ceiling(records)))
    if not parts:
        raise ValueError("no train-step, model-step, generate or grpo_loop lines found")
    return "\n\n".join(parts)


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
