#!/usr/bin/env bash
# Activation checkpointing, side by side: training forward + backward of
# SmolLM2-135M-Instruct on one row of S tokens, each decoder layer kept whole
# or recomputed in the backward pass — grpo (`grpo bench model-step
# --activation-checkpointing none|layer`, one XLA program) against
# transformers (`bench/model_step_torch.py --attn eager [--gradient-checkpointing]`).
#
#   bench/checkpointing.sh [--seqs 1024,2048] [--rounds R] [--runs N] [--warmup W]
#                          [--dtype f32|bf16] [--threads T] [--out FILE]
#
# Per row length and round, the four runs interleaved, each one JSON line with
# its median step time and its process's peak RSS; grpo's lines also carry the
# memory XLA's buffer assignment gives the program (temp_bytes: activations
# and the backward's intermediates). A run that fails (the kernel kills one
# that runs out of memory) is a line saying so, not the end of the benchmark.
# Then, for grpo, the longest
# row whose program fits in 24 GiB (temporaries + arguments + outputs, by
# compiling without running: `--compile-only`) without and with checkpointing,
# up to the model's context.
# Every line goes to FILE (default <grpo cache>/bench-results/checkpointing-<UTC>.jsonl);
# the table at the end gives each side's time and memory ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SEQS=1024,2048
ROUNDS=2
RUNS=3
WARMUP=1
DTYPE=f32
THREADS=$(nproc)
OUT=
TORCH_ONLY=0
MODEL=smollm2-135m-instruct
LIMIT=$((24 << 30))
while (($#)); do
    case $1 in
    --seqs) SEQS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "checkpointing.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$RUNS" "$WARMUP" "$THREADS"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "checkpointing.sh: '$n' is not a count" >&2; exit 2; }
done
((ROUNDS >= 1 && RUNS >= 1 && THREADS >= 1)) || { echo "checkpointing.sh: rounds, runs and threads must be >= 1" >&2; exit 2; }
[[ $DTYPE == f32 || $DTYPE == bf16 ]] || { echo "checkpointing.sh: dtype '$DTYPE' is not f32 or bf16" >&2; exit 2; }
IFS=, read -r -a SEQ_LIST <<<"$SEQS"
for s in "${SEQ_LIST[@]}"; do
    [[ $s =~ ^[0-9]+$ ]] && ((s >= 2)) || { echo "checkpointing.sh: '$s' is not a row length" >&2; exit 2; }
done

# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
# shellcheck source=bench/common.sh
source bench/common.sh
model_tools "$MODEL"
build_grpo
open_results checkpointing
write_meta checkpointing

# Runs CMD for the run described by the JSON pairs WHAT; a failure becomes a line.
measured() {
    local what=$1 lines status=0
    shift
    lines=$("$@") || status=$?
    lines=$(grep '^{' <<<"$lines" || true)
    if ((status != 0)) || [[ -z $lines ]]; then
        lines="{$what, \"failed\": \"exit status $status\"}"
        echo "checkpointing.sh: failed (status $status; 137 is a kill, as for running out of memory): $*" >&2
    fi
    printf '%s\n' "$lines" | tee -a "$OUT"
}

for seq in "${SEQ_LIST[@]}"; do
    for ((round = 1; round <= ROUNDS; round++)); do
        echo "== $seq tokens, round $round/$ROUNDS" >&2
        for ac in none layer; do
            what="\"seq\": $seq, \"activation_checkpointing\": \"$ac\""
            measured "\"impl\": \"grpo\", $what" \
                "$GRPO" bench model-step --model "$MODEL" --batch 1 --seq "$seq" --dtype "$DTYPE" \
                --activation-checkpointing "$ac" --runs "$RUNS" --warmup "$WARMUP" --json
            flag=()
            [[ $ac == layer ]] && flag=(--gradient-checkpointing)
            measured "\"impl\": \"torch-eager\", $what" \
                "$PY" bench/model_step_torch.py --model-dir "$MODEL_DIR" --attn eager --dtype "$DTYPE" \
                --batch 1 --seq "$seq" --runs "$RUNS" --warmup "$WARMUP" --threads "$THREADS" --memory "${flag[@]}"
        done
    done
done

# The longest row that fits, up to the model's context: double until it does
# not, then halve the gap (to 256 tokens).
CONTEXT=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["max_position_embeddings"])' "$MODEL_DIR/config.json")
fits() {
    local line
    line=$("$GRPO" bench model-step --model "$MODEL" --batch 1 --seq "$1" --dtype "$DTYPE" \
        --activation-checkpointing "$2" --compile-only --json | grep '^{')
    printf '%s\n' "$line" >>"$OUT"
    "$PY" -c 'import json, sys; l = json.loads(sys.argv[1]); sys.exit(l["temp_bytes"] + l["argument_bytes"] + l["output_bytes"] > int(sys.argv[2]))' "$line" "$LIMIT"
}
for ac in none layer; do
    low=256 high=512
    while fits "$high" "$ac"; do
        low=$high
        ((high < CONTEXT)) || break
        high=$((high * 2 < CONTEXT ? high * 2 : CONTEXT))
    done
    while ((high > low && high - low > 256)); do
        mid=$(((low + high) / 2))
        if fits "$mid" "$ac"; then low=$mid; else high=$mid; fi
    done
    echo "{\"longest_row\": $low, \"context\": $CONTEXT, \"activation_checkpointing\": \"$ac\", \"limit_bytes\": $LIMIT, \"dtype\": \"$DTYPE\"}" | tee -a "$OUT"
done

"$PY" - "$OUT" <<'PYTHON'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for l in lines:
    if "impl" in l and ("median_ms" in l or "failed" in l):
        runs.setdefault((l["impl"], l["seq"], l["activation_checkpointing"]), []).append(l)


def median(group, key):
    values = [l[key] for l in group if key in l]
    return statistics.median(values) if values else None


def gib(value):
    return "—" if value is None else f"{value / 2**30:.2f}"


print("| impl | row | checkpointing | median ms | XLA temporaries GiB | peak RSS GiB | time × | temporaries ÷ |")
print("|---|---|---|---|---|---|---|---|")
for (impl, seq, ac), group in sorted(runs.items()):
    ms = median(group, "median_ms")
    if ms is None:
        print(f"| {impl} | {seq} | {ac} | did not run ({group[0]['failed']}) | | | | |")
        continue
    temp, rss = median(group, "temp_bytes"), median(group, "peak_rss_bytes") or median(group, "max_rss_bytes")
    base = runs.get((impl, seq, "none"), [])
    base_ms, base_temp = median(base, "median_ms"), median(base, "temp_bytes")
    slower = f"{ms / base_ms:.2f}" if base_ms else "—"
    smaller = f"{base_temp / temp:.1f}" if base_temp and temp else "—"
    print(f"| {impl} | {seq} | {ac} | {ms:.0f} | {gib(temp)} | {gib(rss)} | {slower} | {smaller} |")
for l in lines:
    if "longest_row" in l:
        whole = " (the model's whole context)" if l["longest_row"] >= l["context"] else ""
        print(f"grpo, {l['activation_checkpointing']}: the longest {l['dtype']} row within {l['limit_bytes'] / 2**30:.0f} GiB is {l['longest_row']} tokens{whole}")
PYTHON
