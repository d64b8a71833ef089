#!/usr/bin/env python3
"""The report of bench/accelerator.sh: one JSON file, rewritten whole after
each stage (written beside it, then renamed), so a run cut off still reports.

    accelerator_report.py REPORT start --platform P --quick 0|1 --torch 0|1 --torch-device D
    accelerator_report.py REPORT stage NAME --rc RC --seconds S --lines FILE
    accelerator_report.py REPORT finish

The file holds every stage's JSON lines (each tagged by what printed it) and a
"summary" derived from them, recomputed at each write:

- ceilings: grpo's best matmul rate per dtype, torch's bf16 matmul rate and
  device copy bandwidth (read + written), and the datasheet's dense peaks when
  the device is one this script knows;
- model_step: per model and dtype, grpo's and torch's median milliseconds, the
  speed-up torch / grpo (for f32 on a GPU also torch with TF32 products, the
  precision XLA uses), grpo's TFLOP/s (matmul FLOPs from
  model_step_torch.py --flops) and its MFU against grpo's own matmul ceiling
  and against the datasheet peak;
- generate: per model and batch, prefill and decode tokens/s of each and the
  ratios; at batch 1 the decode rate as a share of the bandwidth limit (the
  measured copy bandwidth over the weights' bytes: each decoded token reads
  every weight once);
- run: the median over steps 2.. of the GRPO step's phases (seconds).

Needs only the standard library.
"""

import datetime
import json
import os
import platform
import socket
import statistics
import sys

# Dense peaks by the vendor's datasheet (TFLOP/s), by a word of the device name.
# XLA runs f32 products in TF32 on these GPUs (an H200 gave 355 TFLOP/s on an
# f32 8192² product, five times its plain-f32 peak), so f32's peak is TF32's.
DATASHEET_TFLOPS = {
    "H200": {"bf16": 989.4, "f32": 494.7},
    "H100": {"bf16": 989.4, "f32": 494.7},
    "A100": {"bf16": 312.0, "f32": 156.0},
}


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, report):
    report["summary"] = summarize(report["stages"])
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tagged(stages, stage, tag):
    """The lines of `stage` printed by `tag`."""
    return [line for line in stages.get(stage, {}).get("lines", []) if line.get("tag") == tag]


def ceilings(stages):
    out = {}
    for line in tagged(stages, "matmul", "matmul"):
        key = f"grpo_{line['dtype']}_tflops"
        out[key] = max(out.get(key, 0.0), line["gflops"] / 1e3)
    for line in tagged(stages, "env", "torch-ceilings"):
        out["device"] = line["device"]
        out["torch_bf16_tflops"] = line["bf16_matmul_tflops"]
        out["copy_gbps"] = line["copy_gbps"]
        for word, peaks in DATASHEET_TFLOPS.items():
            if word in line["device"]:
                out["datasheet_tflops"] = peaks
    return out


def model_steps(stages, limits):
    out = []
    for stage in ("step-135m", "step-1b"):
        flops = [line for line in stages.get(stage, {}).get("lines", []) if line["tag"].startswith("flops-")]
        for line in stages.get(stage, {}).get("lines", []):
            if not line["tag"].startswith("grpo-"):
                continue
            model, dtype = line["tag"][len("grpo-"):].rsplit("-", 1)
            row = {"model": model, "dtype": dtype, "batch": line["batch"], "seq": line["seq"],
                   "grpo_ms": line["median_ms"]}
            torch_lines = tagged(stages, stage, f"torch-{model}-{dtype}")
            if torch_lines:
                row["torch_ms"] = torch_lines[0]["median_ms"]
                row["torch_over_grpo"] = row["torch_ms"] / row["grpo_ms"]
            tf32_lines = tagged(stages, stage, f"torch-{model}-{dtype}-tf32")
            if tf32_lines:
                row["torch_tf32_ms"] = tf32_lines[0]["median_ms"]
                row["torch_tf32_over_grpo"] = row["torch_tf32_ms"] / row["grpo_ms"]
            if flops:
                tflops = flops[0]["flops"] / (row["grpo_ms"] / 1e3) / 1e12
                row["grpo_tflops"] = tflops
                ceiling = limits.get(f"grpo_{dtype}_tflops")
                if ceiling:
                    row["mfu_of_grpo_matmul"] = tflops / ceiling
                peak = limits.get("datasheet_tflops", {}).get(dtype)
                if peak:
                    row["mfu_of_datasheet"] = tflops / peak
            out.append(row)
    return out


def generation(stages, limits):
    out = []
    for stage in ("gen-135m", "gen-1b"):
        for line in stages.get(stage, {}).get("lines", []):
            if not line["tag"].startswith("grpo-"):
                continue
            model = line["tag"][len("grpo-"):]
            row = {"model": model, "batch": line["batch"], "dtype": line["dtype"],
                   "grpo_prefill_tps": line["prefill_tokens_per_s"], "grpo_decode_tps": line["decode_tokens_per_s"]}
            theirs = [t for t in tagged(stages, stage, f"torch-{model}") if t["batch"] == line["batch"]]
            if theirs:
                row["torch_prefill_tps"] = theirs[0]["prefill_tokens_per_s"]
                row["torch_decode_tps"] = theirs[0]["decode_tokens_per_s"]
                row["decode_grpo_over_torch"] = row["grpo_decode_tps"] / row["torch_decode_tps"]
                row["prefill_grpo_over_torch"] = row["grpo_prefill_tps"] / row["torch_prefill_tps"]
                row["greedy_match"] = theirs[0].get("greedy_match")
            if line["batch"] == 1 and "copy_gbps" in limits:
                limit = limits["copy_gbps"] * 1e9 / line["weight_bytes"]
                row["bandwidth_limit_tps"] = limit
                row["bandwidth_fraction"] = row["grpo_decode_tps"] / limit
            out.append(row)
    return out


def runs(stages):
    out = {}
    for stage, tag in (("smoke", "smoke-run"), ("run-135m", "run")):
        steps = [line for line in tagged(stages, stage, tag) if "step_time" in line]
        later = [line for line in steps if line["step"] >= 2] or steps
        if later:
            out[stage] = {
                key: statistics.median(line[key] for line in later)
                for key in ("step_time", "time_generation", "time_train", "time_weight_sync", "time_reward")
                if all(key in line for line in later)
            }
            out[stage]["steps"] = len(steps)
            out[stage]["last_loss"] = steps[-1].get("loss")
    return out


def summarize(stages):
    limits = ceilings(stages)
    summary = {"ceilings": limits, "model_step": model_steps(stages, limits),
               "generate": generation(stages, limits), "run": runs(stages)}
    parity = tagged(stages, "smoke", "logprob-parity")
    if parity:
        summary["logprob_parity"] = parity[0]
    summary["stages_ok"] = sorted(name for name, s in stages.items() if s["ok"])
    summary["stages_failed"] = sorted(name for name, s in stages.items() if not s["ok"])
    return summary


def option(args, name, default=None):
    if name in args:
        return args[args.index(name) + 1]
    if default is None:
        raise SystemExit(f"accelerator_report.py: {name} is required")
    return default


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    path, verb, rest = argv[0], argv[1], argv[2:]
    if verb == "start":
        report = {"started": now(), "host": socket.gethostname(), "cpu": cpu_model(),
                  "platform": option(rest, "--platform"), "quick": option(rest, "--quick") == "1",
                  "torch": option(rest, "--torch") == "1", "torch_device": option(rest, "--torch-device"),
                  "stages": {}}
        save(path, report)
    elif verb == "stage":
        name, rc = rest[0], int(option(rest, "--rc"))
        lines = []
        with open(option(rest, "--lines")) as f:
            for text in f:
                try:
                    lines.append(json.loads(text))
                except json.JSONDecodeError:
                    pass  # a line cut off by the stage's time limit
        report = load(path)
        report["stages"][name] = {"ok": rc == 0, "rc": rc, "timed_out": rc in (124, 137),
                                  "seconds": float(option(rest, "--seconds")), "lines": lines}
        save(path, report)
        state = "ok" if rc == 0 else ("timed out" if rc in (124, 137) else f"failed (exit {rc})")
        print(f"   {name}: {state} in {float(option(rest, '--seconds')):.1f} s, {len(lines)} JSON lines")
    elif verb == "finish":
        report = load(path)
        report["finished"] = now()
        save(path, report)
        print(json.dumps(report["summary"], indent=1))
    else:
        raise SystemExit(f"accelerator_report.py: unknown verb {verb!r} (start, stage, finish)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
