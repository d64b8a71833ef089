#!/usr/bin/env bash
# LoRA against full fine-tuning on the arithmetic example (SmolLM2-135M-Instruct,
# 16 prompts x 16 samples a step): step time, training time, learner state,
# peak resident memory and bytes per weight sync, for full fine-tuning
# (examples/arithmetic/config.toml) and LoRA at each rank
# (examples/arithmetic/lora.toml, alpha = rank: the same scaling at every rank).
#
#   bench/lora.sh [--steps S] [--ranks 8,32,128] [--rounds R] [--out FILE]
#
# Each run is `grpo run --max-steps S` with evaluations and checkpoints off, in
# a fresh folder; its metrics.jsonl lines are kept in FILE (default
# <grpo cache>/bench-results/lora-<UTC time>.jsonl), tagged with the case.
# R rounds run every case once each, in turn (they see the same machine noise).
# The table gives medians over steps 2..S of every round (step 1 compiles) and,
# for memory, the largest figure seen. Held-out accuracy needs the examples'
# full 100 steps (`grpo run examples/arithmetic/lora.toml`). Defaults: 6 steps,
# ranks 8,32,128, 1 round. Needs `cargo run --release -- setup` first.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=6
RANKS=8,32,128
ROUNDS=1
OUT=
while (($#)); do
    case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "lora.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $STEPS =~ ^[0-9]+$ && $ROUNDS =~ ^[0-9]+$ ]] && ((STEPS >= 2 && ROUNDS >= 1)) || {
    echo "lora.sh: --steps must be at least 2 and --rounds at least 1" >&2
    exit 2
}
[[ $RANKS =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "lora.sh: --ranks is a comma-separated list of ranks" >&2; exit 2; }
# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
ROOT=$PWD
TORCH_ONLY=0 # read by bench/common.sh: there is no torch side here
# shellcheck source=bench/common.sh
source bench/common.sh
grpo_bench lora "\"steps\": $STEPS"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# run CASE CONFIG [--set KEY=VALUE…]: one run, its step lines tagged with CASE into $OUT.
run() {
    local case=$1 config=$2
    shift 2
    echo "== $case" >&2
    rm -rf "$WORK/out"
    "$GRPO" run "$config" --max-steps "$STEPS" --out "$WORK/out" \
        --set trainer.eval_every=0 --set checkpoint.every=0 "$@" 2>"$WORK/stderr" || {
        cat "$WORK/stderr" >&2
        echo "lora.sh: the $case run failed" >&2
        exit 1
    }
    python3 - "$case" "$WORK/out/metrics.jsonl" >>"$OUT" <<'PY'
import json, sys
case, path = sys.argv[1], sys.argv[2]
for line in open(path):
    row = json.loads(line)
    if "loss" in row:
        print(json.dumps({"case": case, **row}))
PY
}
IFS=, read -r -a RANK_LIST <<<"$RANKS"
for ((round = 1; round <= ROUNDS; round++)); do
    run full examples/arithmetic/config.toml
    for rank in "${RANK_LIST[@]}"; do
        run "lora-r$rank" examples/arithmetic/lora.toml --set "lora.rank=$rank" --set "lora.alpha=$rank"
    done
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"case"' in l]
cases = list(dict.fromkeys(r["case"] for r in rows))
def med(case, key):
    values = [r[key] for r in rows if r["case"] == case and r["step"] >= 2 and key in r]
    return statistics.median(values) if values else float("nan")
def most(case, key):
    values = [max(r[key]) if isinstance(r[key], list) else r[key] for r in rows if r["case"] == case and key in r]
    return max(values) if values else float("nan")
full = {k: med("full", k) for k in ("step_time", "time_train", "weight_sync_bytes")}
full_state, full_rss = most("full", "learner_state_bytes"), most("full", "peak_rss_bytes")
print(f"{'case':>10} {'step s':>7} {'train s':>7} {'sync MB':>9} {'state MB':>9} {'peak RSS MB':>11}"
      f" {'sync /full':>10} {'state /full':>11}")
for case in cases:
    sync, state = med(case, "weight_sync_bytes"), most(case, "learner_state_bytes")
    print(f"{case:>10} {med(case, 'step_time'):7.2f} {med(case, 'time_train'):7.2f} {sync / 1e6:9.2f}"
          f" {state / 1e6:9.1f} {most(case, 'peak_rss_bytes') / 1e6:11.0f}"
          f" {sync / full['weight_sync_bytes']:10.4f} {state / full_state:11.3f}")
print(f"(medians over steps 2..; memory: the largest seen; results in {sys.argv[1]})")
PY
