#!/usr/bin/env bash
# Measures the calculator example end to end: greedy accuracy, tool-call rate
# and valid-call rate on the 500 held-out problems (eval.jsonl)
#
#   1. before SFT (the bundled model, the tool on offer),
#   2. after SFT on tool transcripts (sft_tool.toml; step 0 of config.toml),
#   3. after GRPO with the tool (config.toml),
#   4. the tool-less baseline: SFT on worked solutions (sft_plain.toml),
#      then GRPO without the tool (config_plain.toml), same budget.
#
#   examples/calculator/measure.sh [--no-build] [PHASE…]
#
# PHASEs (default: all, in this order): before, sft_tool, grpo_tool,
# sft_plain, grpo_plain; a later phase reads the earlier phases' runs.
# Runs write under runs/calculator/ (their metrics.jsonl hold every figure);
# the summary is printed at the end and kept in runs/calculator/summary.json.
# Each phase's wall time excludes nothing: it includes its evaluations,
# whose own time is in the eval lines' `eval_runtime`.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=1
if [[ ${1:-} == --no-build ]]; then
    BUILD=0
    shift
fi
PHASES=("$@")
((${#PHASES[@]})) || PHASES=(before sft_tool grpo_tool sft_plain grpo_plain)
((BUILD)) && cargo build --release --quiet
GRPO=${CARGO_TARGET_DIR:-target}/release/grpo
EXAMPLE=examples/calculator
RUNS=runs/calculator
mkdir -p "$RUNS"

# Runs phase NAME's command if NAME was asked for; its wall time goes to times.jsonl.
timed() {
    local name=$1
    shift
    [[ " ${PHASES[*]} " == *" $name "* ]] || return 0
    local start
    start=$(date +%s)
    "$@"
    echo "{\"phase\": \"$name\", \"seconds\": $(($(date +%s) - start))}" >>"$RUNS/times.jsonl"
}

touch "$RUNS/times.jsonl"
timed before "$GRPO" run "$EXAMPLE/config.toml" --max-steps 0 --out "$RUNS/before_sft" \
    --set 'model.name="smollm2-135m-instruct"'
timed sft_tool "$GRPO" sft "$EXAMPLE/sft_tool.toml"
timed grpo_tool "$GRPO" run "$EXAMPLE/config.toml"
timed sft_plain "$GRPO" sft "$EXAMPLE/sft_plain.toml"
timed grpo_plain "$GRPO" run "$EXAMPLE/config_plain.toml"

for run in before_sft grpo_tool grpo_plain; do
    [[ -f $RUNS/$run/metrics.jsonl ]] || exit 0
done
python3 - "$RUNS" <<'EOF'
import json, pathlib, sys

runs = pathlib.Path(sys.argv[1])

def evals(name):
    lines = [json.loads(l) for l in (runs / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [l for l in lines if "eval_accuracy" in l]

def row(label, line):
    calls = line.get("eval_tools/call_frequency")
    failures = line.get("eval_tools/failure_frequency")
    return {
        "policy": label,
        "step": line["step"],
        "accuracy": line["eval_accuracy"],
        "tool_call_rate": calls,
        "valid_call_rate": None if failures is None or not calls else 1 - failures,
        "eval_seconds": line.get("eval_runtime"),
    }

tool, plain = evals("grpo_tool"), evals("grpo_plain")
rows = [
    row("before SFT", evals("before_sft")[0]),
    row("after SFT (tool)", tool[0]),
    row("after GRPO (tool)", tool[-1]),
    row("after SFT (no tool)", plain[0]),
    row("after GRPO (no tool)", plain[-1]),
]
times = [json.loads(l) for l in (runs / "times.jsonl").read_text().splitlines()]
times = list({t["phase"]: t for t in times}.values())  # a phase run again: its last time
summary = {"rows": rows, "curve_tool": [row("tool", l) for l in tool], "curve_plain": [row("no tool", l) for l in plain], "times": times}
(runs / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
fmt = lambda v: "—" if v is None else f"{100 * v:.1f} %"
print(f"{'policy':<22} {'accuracy':>9} {'tool calls':>11} {'valid calls':>12}")
for r in rows:
    print(f"{r['policy']:<22} {fmt(r['accuracy']):>9} {fmt(r['tool_call_rate']):>11} {fmt(r['valid_call_rate']):>12}")
for t in times:
    print(f"{t['phase']}: {t['seconds'] / 60:.1f} min")
EOF
