#!/usr/bin/env bash
# The SPMD learner on this machine: the arithmetic example's step with the
# learner on one device against the same step data-parallel and FSDP over
# two virtual CPU devices (`[trainer] parallelism`, `grpo run --cpu-devices 2`),
# and the parameters + AdamW state each device holds.
#
#   bench/spmd.sh [--steps S] [--out FILE] [--no-build]
#
# 1. cargo build --release (unless --no-build); the model must be set up
#    (`cargo run --release -- setup`).
# 2. For each system (one device; data parallel over 2; FSDP over 2):
#    `grpo run examples/arithmetic/config.toml` for S steps (default 4;
#    8 prompts x 8 samples, every group trained; bf16 compute on f32 master
#    weights, the bf16 in-process engine on the first device), no eval, no
#    checkpoints.
# 3. Prints per system the median over steps 2..S (step 1 compiles) of the
#    step time, the train time and the weight sync (which gathers the
#    shards), and the learner's state bytes per device; every metrics line
#    is kept in FILE (default <grpo cache>/bench-results/spmd-<UTC>.jsonl).
# Both virtual devices run on the same 2 cores, so SPMD adds no compute
# here: what this measures is the partitioned program's overhead and the
# memory each device holds. No competitor runs beside it: PyTorch FSDP on
# CPU needs one process per device over Gloo, a different setup from one
# process with several devices.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

STEPS=4
OUT=
NO_BUILD=0
while (($#)); do
    case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "spmd.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 2)) || { echo "spmd.sh: --steps must be >= 2" >&2; exit 2; }

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
GRPO=${CARGO_TARGET_DIR:-$ROOT/target}/release/grpo
((NO_BUILD)) || cargo build --release --quiet
[[ -x $GRPO ]] || { echo "spmd.sh: no $GRPO; build it with \`cargo build --release\`" >&2; exit 1; }
if [[ -z $OUT ]]; then
    mkdir -p "$CACHE/bench-results"
    OUT=$CACHE/bench-results/spmd-$(date -u +%Y%m%dT%H%M%SZ).jsonl
fi
: >"$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CONFIG=examples/arithmetic/config.toml

# Runs S steps on DEVICES devices with PARALLELISM; keeps its step lines as SYSTEM's.
run_steps() {
    local system=$1 devices=$2 parallelism=$3 out=$WORK/out-$1
    echo "== $system" >&2
    "$GRPO" run "$CONFIG" --out "$out" --max-steps "$STEPS" --cpu-devices "$devices" \
        --set trainer.eval_every=0 --set checkpoint.every=0 --set optimizer.warmup_steps=0 \
        --set rollout.group_size=8 --set algorithm.dynamic_sampling=false \
        --set "trainer.parallelism=\"$parallelism\"" >&2
    python3 - "$out/metrics.jsonl" "$system" >>"$OUT" <<'PYTHON'
import json, sys
path, system = sys.argv[1], sys.argv[2]
for line in open(path, encoding="utf-8"):
    m = json.loads(line)
    if "step_time" in m:
        keep = ("step", "step_time", "time_generation", "time_train", "time_weight_sync", "learner_state_bytes")
        print(json.dumps({"bench": "spmd", "system": system, **{k: m[k] for k in keep if k in m}}))
PYTHON
    rm -rf "$out"
}

run_steps one-device 1 none
run_steps data-parallel-2 2 data
run_steps fsdp-2 2 fsdp

echo >&2
echo "results: $OUT" >&2
python3 - "$OUT" <<'PYTHON'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
systems = list(dict.fromkeys(r["system"] for r in rows))
print("| learner | steps | median s/step | generation s | train s | weight sync s | state MB per device |")
print("|---|---:|---:|---:|---:|---:|---|")
base = None
for system in systems:
    timed = [r for r in rows if r["system"] == system and r["step"] >= 2]
    med = {c: statistics.median(r[c] for r in timed) for c in ("step_time", "time_generation", "time_train", "time_weight_sync")}
    base = base or med["time_train"]
    per_device = " / ".join(f"{b / 1e6:.0f}" for b in timed[-1]["learner_state_bytes"])
    print(f"| {system} | {len(timed)} | {med['step_time']:.2f} | {med['time_generation']:.2f} | "
          f"{med['time_train']:.2f} | {med['time_weight_sync']:.2f} | {per_device} |")
print("(medians over steps 2..; one-device / system train time: "
      + ", ".join(f"{s} {base / statistics.median(r['time_train'] for r in rows if r['system'] == s and r['step'] >= 2):.2f}x"
                  for s in systems) + ")")
PYTHON
