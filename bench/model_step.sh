#!/usr/bin/env bash
# Side-by-side: training forward + backward (loss = -mean next-token log-prob,
# gradients of every parameter, no optimizer) of SmolLM2-135M-Instruct at
# batch 8 x seq 256: grpo (one XLA program) against transformers on CPU,
# attn_implementation "eager" and "sdpa", per dtype.
#
#   bench/model_step.sh [--rounds R] [--runs N] [--warmup W] [--dtypes f32,bf16]
#                       [--attns eager,sdpa] [--threads T] [--out FILE] [--torch-only]
#
# 1. creates or reuses the tools venv (tools/venv.sh: torch exactly as
#    bench/train_step.sh pins it, plus transformers==5.24.0 safetensors==0.8.0);
# 2. checks the model folder <grpo cache>/models/smollm2-135m-instruct
#    (`cargo run --release -- setup` makes it) and runs cargo build --release;
# 3. per dtype, R rounds of grpo, then torch per attention (interleaved, so all
#    see the same machine noise), each printing one JSON line;
# 4. grpo bench matmul --sizes 2048 --dtypes <the dtypes> once (the ceilings);
# 5. bench/report.py prints the table. Every JSON line is kept in FILE
#    (default <grpo cache>/bench-results/model-step-<UTC time>.jsonl).
# --torch-only skips grpo's build, its rounds and the ceiling.
# One f32 step is ~1.76 TFLOP: ~15-30 s on 2 cores, so the defaults (3 rounds,
# 3 runs after 1 warm-up, 2 dtypes, 3 impls) take ~20-30 minutes there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=3
RUNS=3
WARMUP=1
DTYPES=f32,bf16
ATTNS=eager,sdpa
THREADS=$(nproc)
OUT=
TORCH_ONLY=0
BATCH=8
SEQ=256
MODEL=smollm2-135m-instruct
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    --attns) ATTNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --torch-only) TORCH_ONLY=1; shift ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "model_step.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$RUNS" "$WARMUP" "$THREADS"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "model_step.sh: '$n' is not a count" >&2; exit 2; }
done
((ROUNDS >= 1 && RUNS >= 1 && THREADS >= 1)) || { echo "model_step.sh: rounds, runs and threads must be >= 1" >&2; exit 2; }
IFS=, read -r -a DTYPE_LIST <<<"$DTYPES"
IFS=, read -r -a ATTN_LIST <<<"$ATTNS"
for d in "${DTYPE_LIST[@]}"; do
    [[ $d == f32 || $d == bf16 ]] || { echo "model_step.sh: dtype '$d' is not f32 or bf16" >&2; exit 2; }
done
for a in "${ATTN_LIST[@]}"; do
    [[ $a == eager || $a == sdpa ]] || { echo "model_step.sh: attention '$a' is not eager or sdpa" >&2; exit 2; }
done

# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
# shellcheck source=bench/common.sh
source bench/common.sh
model_tools "$MODEL" # 1. torch + transformers (PY), 2. the model (MODEL_DIR)
build_grpo
open_results model-step
write_meta model-step

# --- 3. interleaved rounds ------------------------------------------------------
for dtype in "${DTYPE_LIST[@]}"; do
    for ((round = 1; round <= ROUNDS; round++)); do
        echo "== $dtype, round $round/$ROUNDS" >&2
        if ((!TORCH_ONLY)); then
            json_lines "grpo bench model-step" \
                "$GRPO" bench model-step --model "$MODEL" --batch "$BATCH" --seq "$SEQ" \
                --dtype "$dtype" --runs "$RUNS" --warmup "$WARMUP" --json
        fi
        for attn in "${ATTN_LIST[@]}"; do
            json_lines "model_step_torch.py --attn $attn" \
                "$PY" bench/model_step_torch.py --model-dir "$MODEL_DIR" --attn "$attn" \
                --dtype "$dtype" --batch "$BATCH" --seq "$SEQ" --runs "$RUNS" \
                --warmup "$WARMUP" --threads "$THREADS"
        done
    done
done

# --- 4. the matmul ceilings -----------------------------------------------------
if ((!TORCH_ONLY)); then
    echo "== matmul ceiling" >&2
    json_lines "grpo bench matmul" "$GRPO" bench matmul --sizes 2048 --dtypes "$DTYPES" --json
fi

# --- 5. table -------------------------------------------------------------------
echo >&2
echo "results: $OUT" >&2
"$PY" bench/report.py "$OUT"
