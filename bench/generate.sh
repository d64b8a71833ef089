#!/usr/bin/env bash
# Side-by-side: generation throughput of SmolLM2-135M-Instruct on CPU, grpo's
# rollout engine (`grpo bench generate`) against transformers' `generate`
# (bench/generate_torch.py) on the same prompt ids, dtype and batch sizes:
# greedy (or sampled, --temperature), EOS ignored, prefill tokens/s and decode
# tokens/s per batch.
#
#   bench/generate.sh [--rounds R] [--runs N] [--warmup W] [--batch 1,16,64]
#                     [--prompt-tokens P] [--new-tokens T] [--dtypes f32,bf16]
#                     [--threads T] [--loras N] [--lora-rank R]
#                     [--temperature T] [--out FILE]
#
# 1. creates or reuses the tools venv (tools/venv.sh: torch as bench/train_step.sh
#    pins it, plus transformers==5.24.0 safetensors==0.8.0);
# 2. checks the model folder <grpo cache>/models/smollm2-135m-instruct
#    (`cargo run --release -- setup` makes it) and runs cargo build --release;
# 3. per dtype, R rounds of grpo then transformers (interleaved, so both see
#    the same machine noise), each printing one JSON line per batch; grpo
#    writes the prompt ids and its greedy tokens to a file that transformers
#    reads, so both run the same ids and the report says whether their greedy
#    tokens agree; grpo also measures the copy bandwidth (the batch-1 limit);
# 4. bench/report.py prints the table. Every JSON line is kept in FILE
#    (default <grpo cache>/bench-results/generate-<UTC time>.jsonl).
# Defaults: 2 rounds, 2 runs after 1 warm-up, batches 1,16,64, a 64-token
# prompt, 64 new tokens, f32; --threads sets torch's (grpo's XLA uses all cores).
# --loras N: both serve N random LoRA adapters of rank R (default 16) on every
# linear layer, row i of a batch using adapter i mod N (PEFT's adapter_names on
# the transformers side); run it beside --loras 0 for the adapters' cost.
# --temperature T > 0: both sample from the whole vocabulary at T (no top-k,
# top-p or min-p), as GRPO's rollouts do; tokens are then not compared.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=2
RUNS=2
WARMUP=1
BATCH=1,16,64
PROMPT_TOKENS=64
NEW_TOKENS=64
DTYPES=f32
THREADS=$(nproc)
OUT=
TORCH_ONLY=0 # read by bench/common.sh; grpo always runs (it writes the prompt ids)
MODEL=smollm2-135m-instruct
LORAS=0
LORA_RANK=16
TEMPERATURE=0
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --new-tokens) NEW_TOKENS=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --loras) LORAS=$2; shift 2 ;;
    --lora-rank) LORA_RANK=$2; shift 2 ;;
    --temperature) TEMPERATURE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "generate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$RUNS" "$WARMUP" "$THREADS" "$PROMPT_TOKENS" "$NEW_TOKENS" "$LORAS" "$LORA_RANK"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "generate.sh: '$n' is not a count" >&2; exit 2; }
done
((ROUNDS >= 1 && RUNS >= 1 && THREADS >= 1 && PROMPT_TOKENS >= 1 && NEW_TOKENS >= 1)) || {
    echo "generate.sh: rounds, runs, threads, prompt and new tokens must be >= 1" >&2
    exit 2
}
[[ $TEMPERATURE =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "generate.sh: --temperature '$TEMPERATURE' is not a number >= 0" >&2; exit 2; }
[[ $BATCH =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "generate.sh: --batch '$BATCH' is not a list like 1,16,64" >&2; exit 2; }
IFS=, read -r -a DTYPE_LIST <<<"$DTYPES"
for d in "${DTYPE_LIST[@]}"; do
    [[ $d == f32 || $d == bf16 ]] || { echo "generate.sh: dtype '$d' is not f32 or bf16" >&2; exit 2; }
done

# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
# shellcheck source=bench/common.sh
source bench/common.sh
model_tools "$MODEL" # 1. torch + transformers (PY), 2. the model (MODEL_DIR)
build_grpo
open_results generate
write_meta generate
TOKENS_DIR=$(mktemp -d)
trap 'rm -rf "$TOKENS_DIR"' EXIT

# --- 3. interleaved rounds ------------------------------------------------------
for dtype in "${DTYPE_LIST[@]}"; do
    tokens=$TOKENS_DIR/tokens-$dtype.json
    for ((round = 1; round <= ROUNDS; round++)); do
        echo "== $dtype, round $round/$ROUNDS" >&2
        json_lines "grpo bench generate" \
            "$GRPO" bench generate --model "$MODEL" --batch "$BATCH" --prompt-tokens "$PROMPT_TOKENS" \
            --new-tokens "$NEW_TOKENS" --dtype "$dtype" --runs "$RUNS" --warmup "$WARMUP" \
            --tokens-out "$tokens" --loras "$LORAS" --lora-rank "$LORA_RANK" --temperature "$TEMPERATURE" --json
        json_lines "generate_torch.py" \
            "$PY" bench/generate_torch.py --tokens "$tokens" --model-dir "$MODEL_DIR" --batch "$BATCH" \
            --new-tokens "$NEW_TOKENS" --dtype "$dtype" --runs "$RUNS" --warmup "$WARMUP" --threads "$THREADS" \
            --loras "$LORAS" --lora-rank "$LORA_RANK"
    done
done

# --- 4. table -------------------------------------------------------------------
echo >&2
echo "results: $OUT" >&2
"$PY" bench/report.py "$OUT"
