#!/usr/bin/env bash
# Side-by-side: the whole GRPO loop (generate, score, train, sync weights) of
# TRL 1.16's GRPOTrainer (bench/grpo_loop_trl.py) against `grpo run`, the
# issue's reference setup: SmolLM2-135M-Instruct on CPU, the arithmetic
# example (examples/arithmetic), 8 prompts x 8 samples = 64 sequences a step,
# at most 32 new tokens, lr 1e-5, beta 0, loss "dapo", temperature 1.0.
#
#   bench/grpo_loop.sh [--steps S] [--rounds R] [--threads T] [--out FILE]
#                      [--trl-only | --grpo-only] [--eval] [--no-build] [--grpo-dtypes f32,bf16]
#                      [--prompts P] [--samples G] [--max-tokens N] [--eval-size E]
#
# 1. creates or reuses the tools venv (tools/venv.sh with TOOLS_TRL=1: torch
#    as bench/train_step.sh pins it, transformers, and trl==1.16.0 with what it
#    imports) and checks <grpo cache>/models/smollm2-135m-instruct
#    (`cargo run --release -- setup` makes it); cargo build --release;
# 2. R rounds (default 1) of TRL then grpo, S steps each (default 4), grpo once
#    per --grpo-dtypes entry (default f32,bf16: system "grpo" pins f32 compute
#    and engine as TRL runs, "grpo-bf16" bf16 compute on f32 master weights and
#    a bf16 engine, what the example config uses): TRL's
#    steps timed by a TrainerCallback (on_step_begin .. on_step_end), grpo's
#    read from <fresh temp folder>/metrics.jsonl (step_time and its split:
#    time_generation, time_reward, time_train, time_weight_sync);
# 3. bench/report.py prints the table: per system the median step time over
#    steps 2..S (step 1 holds compilation and warm-up), trl / grpo, grpo's
#    median split and both systems' mean reward per step. Every JSON line is
#    kept in FILE (default <grpo cache>/bench-results/grpo-loop-<UTC>.jsonl).
# TRL runs in f32 (its bf16 on CPU is not measured here).
# --threads sets torch's threads (grpo's XLA uses all cores; default: nproc).
# --eval adds a greedy accuracy on the E (default 200) held-out rows before and
# after training on both sides (outside the timed steps). --prompts, --samples,
# --max-tokens, --eval-size are for smoke tests only (they leave the reference
# setup); --no-build uses target/release/grpo as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

STEPS=4
ROUNDS=1
THREADS=$(nproc)
OUT=
TRL_ONLY=0
GRPO_ONLY=0
EVAL=0
NO_BUILD=0
PROMPTS=8
SAMPLES=8
MAX_TOKENS=32
EVAL_SIZE=200
MODEL=smollm2-135m-instruct
CONFIG=examples/arithmetic/config.toml
GRPO_DTYPES=f32,bf16
while (($#)); do
    case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --trl-only) TRL_ONLY=1; shift ;;
    --grpo-only) GRPO_ONLY=1; shift ;;
    --eval) EVAL=1; shift ;;
    --no-build) NO_BUILD=1; shift ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --eval-size) EVAL_SIZE=$2; shift 2 ;;
    --grpo-dtypes) GRPO_DTYPES=$2; shift 2 ;;
    -h | --help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "grpo_loop.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$STEPS" "$ROUNDS" "$THREADS" "$PROMPTS" "$SAMPLES" "$MAX_TOKENS" "$EVAL_SIZE"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "grpo_loop.sh: '$n' is not a count" >&2; exit 2; }
done
((STEPS >= 1 && ROUNDS >= 1 && THREADS >= 1 && PROMPTS >= 1 && MAX_TOKENS >= 1 && EVAL_SIZE >= 1)) || {
    echo "grpo_loop.sh: steps, rounds, threads, prompts, max tokens and eval size must be >= 1" >&2
    exit 2
}
((SAMPLES >= 2)) || { echo "grpo_loop.sh: --samples must be >= 2 (GRPO needs a group)" >&2; exit 2; }
((!(TRL_ONLY && GRPO_ONLY))) || { echo "grpo_loop.sh: --trl-only and --grpo-only exclude each other" >&2; exit 2; }
IFS=, read -r -a grpo_dtypes <<<"$GRPO_DTYPES"
for dtype in "${grpo_dtypes[@]}"; do
    [[ $dtype == f32 || $dtype == bf16 ]] || { echo "grpo_loop.sh: --grpo-dtypes takes f32 and/or bf16, not '$dtype'" >&2; exit 2; }
done

# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
export TOOLS_TRL=1 # tools/venv.sh adds TRL_PACKAGES
# shellcheck source=bench/common.sh
source bench/common.sh
model_tools "$MODEL" # 1. torch + transformers + trl (PY), the model (MODEL_DIR)
TORCH_ONLY=$((TRL_ONLY || NO_BUILD)) # build_grpo skips cargo when set
build_grpo
if ((!TRL_ONLY)) && [[ ! -x $GRPO ]]; then
    echo "grpo_loop.sh: no $GRPO; build it with \`cargo build --release\`" >&2
    exit 1
fi
RUNS=$STEPS WARMUP=1 # write_meta's counts: steps per round, the first is warm-up
open_results grpo-loop
write_meta grpo-loop
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# One round of grpo in DTYPE (f32 | bf16): a fresh out folder (`grpo run`
# refuses one that holds a run), its progress on stderr, then its
# metrics.jsonl as this benchmark's lines. The reference setup is pinned
# whatever the example config tunes: lr 1e-5, DAPO loss, one pass per batch,
# no dynamic sampling (as TRL runs), the dtype of the train step and engine.
grpo_round() {
    local round=$1 dtype=$2 out=$WORK/grpo-$1-$2 eval_every=0 system=grpo
    [[ $dtype == bf16 ]] && system=grpo-bf16
    ((EVAL)) && eval_every=$STEPS # evaluates before step 1 and after step S
    "$GRPO" run "$CONFIG" --out "$out" --max-steps "$STEPS" \
        --set trainer.eval_every="$eval_every" --set checkpoint.every=0 \
        --set rollout.prompts_per_step="$PROMPTS" --set rollout.group_size="$SAMPLES" \
        --set rollout.max_completion_tokens="$MAX_TOKENS" --set data.eval_size="$EVAL_SIZE" \
        --set optimizer.lr=1e-5 --set optimizer.warmup_steps=0 --set algorithm.loss_type='"dapo"' \
        --set algorithm.num_iterations=1 \
        --set algorithm.dynamic_sampling=false --set rollout.temperature=1.0 \
        --set trainer.compute_dtype="\"$dtype\"" --set rollout.dtype="\"$dtype\"" >&2
    "$PY" - "$out/metrics.jsonl" "$round" "$system" <<'PYTHON'
import json, sys
path, round_, system = sys.argv[1], int(sys.argv[2]), sys.argv[3]
KEPT = ("time_generation", "time_reward", "time_train", "time_weight_sync", "peak_rss_bytes")
with open(path, encoding="utf-8") as f:
    for line in f:
        m = json.loads(line)
        base = {"bench": "grpo_loop", "system": system, "round": round_}
        if "step_time" in m:
            print(json.dumps({**base, "step": m["step"], "step_time": m["step_time"], "reward": m["reward"],
                              **{k: m[k] for k in KEPT if k in m}}))
        if "eval_accuracy" in m:
            print(json.dumps({**base, "eval_step": m["step"], "eval_accuracy": m["eval_accuracy"],
                              "eval_time": m.get("eval_runtime")}))
PYTHON
    rm -rf "$out" # its final policy alone is ~540 MB
}

# --- 2. rounds: TRL, then grpo ------------------------------------------------------
trl_args=(--model-dir "$MODEL_DIR" --steps "$STEPS" --prompts "$PROMPTS" --samples "$SAMPLES"
    --max-tokens "$MAX_TOKENS" --eval-size "$EVAL_SIZE" --threads "$THREADS")
((EVAL)) && trl_args+=(--eval)
for ((round = 1; round <= ROUNDS; round++)); do
    if ((!GRPO_ONLY)); then
        echo "== trl, round $round/$ROUNDS" >&2
        json_lines "grpo_loop_trl.py" "$PY" bench/grpo_loop_trl.py "${trl_args[@]}" --round "$round"
    fi
    if ((!TRL_ONLY)); then
        for dtype in "${grpo_dtypes[@]}"; do
            echo "== grpo $dtype, round $round/$ROUNDS" >&2
            json_lines "grpo run" grpo_round "$round" "$dtype"
        done
    fi
done

# --- 3. table -----------------------------------------------------------------------
echo >&2
echo "results: $OUT" >&2
"$PY" bench/report.py "$OUT"
