#!/usr/bin/env bash
# The grouped expert product, side by side: forward + backward of one sparse
# (mixture-of-experts) MLP layer — router, top-k, the experts' SwiGLU, the
# weighted sum — on N tokens: grpo's grouped product and grpo computing every
# expert for every token (`grpo bench moe`, both in one process), against
# transformers' Qwen3MoeSparseMoeBlock with its eager per-expert loop and with
# torch's grouped_mm (`bench/moe_torch.py`), at equal precision.
#
#   bench/moe.sh [--tokens 512,2048,8192] [--hidden 576] [--inner 768] [--experts 8]
#                [--top-k 2] [--dtype f32|bf16] [--rounds R] [--runs N] [--warmup W]
#                [--threads T] [--out FILE]
#
# Every line goes to FILE (default <grpo cache>/bench-results/moe-<UTC>.jsonl);
# the table at the end gives each median (over rounds) and its ratio to grpo's grouped product.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TOKENS=512,2048,8192
HIDDEN=576
INNER=768
EXPERTS=8
TOP_K=2
DTYPE=f32
ROUNDS=2
RUNS=5
WARMUP=1
THREADS=$(nproc)
OUT=
TORCH_ONLY=0
while (($#)); do
    case $1 in
    --tokens) TOKENS=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --inner) INNER=$2; shift 2 ;;
    --experts) EXPERTS=$2; shift 2 ;;
    --top-k) TOP_K=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "moe.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$HIDDEN" "$INNER" "$EXPERTS" "$TOP_K" "$ROUNDS" "$RUNS" "$WARMUP" "$THREADS"; do
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || { echo "moe.sh: '$n' is not a count of at least 1" >&2; exit 2; }
done
[[ $DTYPE == f32 || $DTYPE == bf16 ]] || { echo "moe.sh: dtype '$DTYPE' is not f32 or bf16" >&2; exit 2; }
IFS=, read -r -a TOKEN_LIST <<<"$TOKENS"
for n in "${TOKEN_LIST[@]}"; do
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || { echo "moe.sh: '$n' is not a token count" >&2; exit 2; }
done

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
# shellcheck source=bench/common.sh
source bench/common.sh
PY=$(tools/venv.sh)
build_grpo
open_results moe
write_meta moe

SHAPE=(--hidden "$HIDDEN" --inner "$INNER" --experts "$EXPERTS" --top-k "$TOP_K" --dtype "$DTYPE")
for n in "${TOKEN_LIST[@]}"; do
    for ((round = 1; round <= ROUNDS; round++)); do
        echo "== $n tokens, round $round/$ROUNDS" >&2
        json_lines "grpo bench moe" "$GRPO" bench moe --tokens "$n" "${SHAPE[@]}" --runs "$RUNS" --warmup "$WARMUP" --json
        for implementation in eager grouped_mm; do
            json_lines "transformers $implementation" "$PY" bench/moe_torch.py --tokens "$n" "${SHAPE[@]}" \
                --experts-implementation "$implementation" --runs "$RUNS" --warmup "$WARMUP" --threads "$THREADS"
        done
    done
done

"$PY" - "$OUT" <<'PYTHON'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
times = {}
for l in lines:
    if "grouped_ms" in l:
        times.setdefault((l["tokens"], "grpo grouped"), []).append(l["grouped_ms"])
        times.setdefault((l["tokens"], "grpo dense (every expert)"), []).append(l["dense_ms"])
    elif "median_ms" in l:
        times.setdefault((l["tokens"], l["impl"]), []).append(l["median_ms"])
    elif "failed" in l:
        times.setdefault((l["tokens"], l["impl"]), [])
print("| tokens | implementation | median ms | × grpo grouped |")
print("|---|---|---|---|")
for tokens in sorted({t for t, _ in times}):
    base = statistics.median(times[(tokens, "grpo grouped")])
    for (t, impl), values in sorted(times.items()):
        if t != tokens:
            continue
        if not values:
            print(f"| {tokens} | {impl} | did not run | |")
            continue
        ms = statistics.median(values)
        print(f"| {tokens} | {impl} | {ms:.1f} | {ms / base:.2f} |")
PYTHON
