#!/usr/bin/env bash
# The rollout fleet on this machine: the arithmetic example's step with the
# in-process engine against the same step on `grpo worker` processes, and
# the time to push the new weights to 1, 2 and 4 workers.
#
#   bench/fleet.sh [--steps S] [--workers-list 1,2,4] [--out FILE] [--no-build]
#
# 1. cargo build --release (unless --no-build); the model must be set up
#    (`cargo run --release -- setup`).
# 2. System "in-process": `grpo run examples/arithmetic/config.toml` for S
#    steps (default 4; 8 prompts x 8 samples, every group trained; bf16
#    compute, bf16 engine, weights handed over in memory), no eval, no
#    checkpoints.
# 3. System "N workers" for each N of --workers-list (default 1,2,4): N
#    `grpo worker --dtype bf16` processes on loopback (engine slots: the
#    step's 64 samples spread over them), the same run with
#    `[rollout] workers` set, `in_process = false` and `weight_dtype = "bf16"`
#    (the workers' engines are bf16, so nothing is lost on the wire).
# 4. Prints per system the median over steps 2..S (step 1 compiles) of the
#    step time and its split (generation, reward, train, weight sync), the
#    weight-sync rate and the largest worker peak resident memory; every
#    metrics line is kept in FILE (default
#    <grpo cache>/bench-results/fleet-<UTC>.jsonl).
# All processes share the machine's cores: on 2 cores, workers add no
# compute, only a second copy of the engine and the gRPC push.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

STEPS=4
WORKERS_LIST=1,2,4
OUT=
NO_BUILD=0
while (($#)); do
    case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --workers-list) WORKERS_LIST=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fleet.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 2)) || { echo "fleet.sh: --steps must be >= 2" >&2; exit 2; }
IFS=, read -r -a workers_list <<<"$WORKERS_LIST"
for n in "${workers_list[@]}"; do
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || { echo "fleet.sh: --workers-list takes counts >= 1, not '$n'" >&2; exit 2; }
done

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
GRPO=${CARGO_TARGET_DIR:-$ROOT/target}/release/grpo
((NO_BUILD)) || cargo build --release --quiet
[[ -x $GRPO ]] || { echo "fleet.sh: no $GRPO; build it with \`cargo build --release\`" >&2; exit 1; }
if [[ -z $OUT ]]; then
    mkdir -p "$CACHE/bench-results"
    OUT=$CACHE/bench-results/fleet-$(date -u +%Y%m%dT%H%M%SZ).jsonl
fi
: >"$OUT"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    ((${#PIDS[@]})) && kill "${PIDS[@]}" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
export GRPO_WORKER_TOKEN=bench-fleet-token
CONFIG=examples/arithmetic/config.toml

# Runs S steps with the extra --set arguments; keeps its step lines as SYSTEM's.
run_steps() {
    local system=$1 out=$WORK/out-$1
    shift
    echo "== $system" >&2
    "$GRPO" run "$CONFIG" --out "$out" --max-steps "$STEPS" \
        --set trainer.eval_every=0 --set checkpoint.every=0 --set optimizer.warmup_steps=0 \
        --set rollout.group_size=8 --set algorithm.dynamic_sampling=false "$@" >&2
    python3 - "$out/metrics.jsonl" "$system" >>"$OUT" <<'PYTHON'
import json, sys
path, system = sys.argv[1], sys.argv[2]
for line in open(path, encoding="utf-8"):
    m = json.loads(line)
    if "step_time" in m:
        keep = ("step", "step_time", "time_generation", "time_reward", "time_train", "time_weight_sync",
                "weight_sync_gb_per_s")
        print(json.dumps({"bench": "fleet", "system": system, **{k: m[k] for k in keep if k in m}}))
PYTHON
    rm -rf "$out"
}

run_steps in-process

for n in "${workers_list[@]}"; do
    slots=$(((64 + n - 1) / n))
    addrs=()
    for ((i = 0; i < n; i++)); do
        log=$WORK/worker-$n-$i.log
        "$GRPO" worker --port 0 --dtype bf16 --max-num-seqs "$slots" --max-model-len 128 >"$log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 600); do
            grep -q '^listening on ' "$log" && break
            sleep 0.1
        done
        addr=$(sed -n 's/^listening on //p' "$log")
        [[ -n $addr ]] || { echo "fleet.sh: worker $i did not start: $(cat "$log")" >&2; exit 1; }
        addrs+=("\"$addr\"")
    done
    list=$(IFS=,; echo "${addrs[*]}")
    run_steps "$n-workers" --set "rollout.workers=[$list]" --set rollout.in_process=false \
        --set 'rollout.weight_dtype="bf16"'
    # Each worker's peak resident memory (the engine, its KV cache and a staged update).
    for pid in "${PIDS[@]}"; do
        kib=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
        echo "{\"bench\": \"fleet\", \"system\": \"$n-workers\", \"worker_peak_rss_bytes\": $((kib * 1024))}" >>"$OUT"
    done
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
done

echo >&2
echo "results: $OUT" >&2
python3 - "$OUT" <<'PYTHON'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
rows = [r for r in lines if "step" in r]
worker_rss = {}
for r in lines:
    if "worker_peak_rss_bytes" in r:
        worker_rss[r["system"]] = max(worker_rss.get(r["system"], 0), r["worker_peak_rss_bytes"])
systems = list(dict.fromkeys(r["system"] for r in rows))
cols = ("step_time", "time_generation", "time_reward", "time_train", "time_weight_sync", "weight_sync_gb_per_s")
print("| system | steps | median s/step | generation s | reward s | train s | weight sync s | sync GB/s | worker peak RSS GB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
base = None
for system in systems:
    timed = [r for r in rows if r["system"] == system and r["step"] >= 2]
    med = {c: statistics.median(r[c] for r in timed) if all(c in r for r in timed) else float("nan") for c in cols}
    base = base or med["step_time"]
    print(f"| {system} | {len(timed)} | {med['step_time']:.2f} | {med['time_generation']:.2f} | "
          f"{med['time_reward']:.3f} | {med['time_train']:.2f} | {med['time_weight_sync']:.2f} | "
          f"{med['weight_sync_gb_per_s']:.2f} | "
          + (f"{worker_rss[system] / 1e9:.2f} |" if system in worker_rss else "- |"))
print(f"(medians over steps 2..; in-process / system step time: "
      + ", ".join(f"{s} {base / statistics.median(r['step_time'] for r in rows if r['system'] == s and r['step'] >= 2):.2f}x"
                  for s in systems) + ")")
PYTHON
