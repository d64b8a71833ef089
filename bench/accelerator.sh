#!/usr/bin/env bash
# The prepared accelerator check: one command for a machine with a GPU and no
# network. It uses a grpo binary built elsewhere (--grpo, default
# target/release/grpo), the PJRT plugin of --platform (default cuda: found in
# python3's site-packages, e.g. jax-cuda13-pjrt, or given by GRPO_PJRT_PLUGIN)
# and, for the side-by-side figures, python3's torch and transformers when it
# has them. Random models stand in for pretrained ones (same shapes, same
# speed), so nothing is downloaded.
#
#   bench/accelerator.sh [--grpo BIN] [--platform cuda|cpu|tpu] [--out DIR]
#                        [--tokenizer FILE] [--quick] [--budget S] [--stage-timeout S]
#                        [--stages LIST]
#
# Stages, each under its own time limit (default 150 s, and never past the
# whole run's --budget, default 360 s: a stage with under 10 s left is skipped)
# so that one that hangs or fails leaves the others to run; after each,
# DIR/accelerator.json is rewritten whole with the stage's JSON lines and what
# follows from them (bench/accelerator_report.py), so a run cut off still
# reports:
#   env         nvidia-smi, grpo's devices, torch's copy bandwidth and bf16 matmul
#   smoke       a tiny random Llama: grpo's log-probs on the platform against
#               transformers' (f32), then `grpo run` for 2 GRPO steps
#   matmul      grpo bench matmul (f32, bf16) at 2048, 4096, 8192
#   step-135m   fwd + bwd of SmolLM2-135M's shape (bf16, f32), 16 x 1024 tokens:
#               grpo bench model-step beside transformers (sdpa); FLOPs and MFU
#   gen-135m    generation (bf16, 128 + 128 tokens, batches 1, 64, 256): grpo's
#               engine beside transformers' generate
#   run-135m    `grpo run` with the arithmetic example's settings (8 x 8 samples,
#               32 new tokens, bf16) for 4 steps: the phases of a GRPO step
#   step-1b     fwd + bwd of Llama 3.2 1B's shape (bf16), 8 x 1024 tokens
#   gen-1b      generation at that shape (bf16, batches 1, 64)
# --stages runs only the named ones (comma-separated; default all).
# --quick shrinks every shape (the tiny model throughout) for a CPU dry run: CI
# runs `--platform cpu --quick` (tests/accelerator.rs).
# The random models take the tokenizer of --tokenizer (a tokenizer.json, its
# tokenizer_config.json beside it), else the bundled model's (`grpo setup`).
# DIR defaults to $OUT when set (the device tool's folder), else
# <grpo cache>/bench-results/accelerator-<UTC time>. It gets two files:
# accelerator.json (the report) and accelerator.log (everything printed).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

GRPO=$ROOT/target/release/grpo
PLATFORM=cuda
DIR=${OUT:-}
QUICK=0
TOKENIZER=
STAGE_TIMEOUT=150
BUDGET=360
STAGES=,env,smoke,matmul,step-135m,gen-135m,run-135m,step-1b,gen-1b,
while (($#)); do
    case $1 in
    --grpo) GRPO=$2; shift 2 ;;
    --platform) PLATFORM=$2; shift 2 ;;
    --out) DIR=$2; shift 2 ;;
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --stage-timeout) STAGE_TIMEOUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --stages) STAGES=",$2,"; shift 2 ;;
    -h | --help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "accelerator.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$STAGE_TIMEOUT" "$BUDGET"; do
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || {
        echo "accelerator.sh: '$n' is not a positive count of seconds" >&2
        exit 2
    }
done
DEADLINE=$(($(date +%s) + BUDGET))
[[ -z $TOKENIZER || -f $TOKENIZER ]] || { echo "accelerator.sh: no tokenizer file $TOKENIZER" >&2; exit 2; }
[[ -z $TOKENIZER ]] || TOKENIZER=$(realpath "$TOKENIZER")
GRPO=$(realpath "$GRPO")
[[ -x $GRPO ]] || {
    echo "accelerator.sh: no grpo binary at $GRPO: build it with \`cargo build --release\` or pass --grpo" >&2
    exit 2
}
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
DIR=${DIR:-$CACHE/bench-results/accelerator-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$DIR" || exit 2
DIR=$(realpath "$DIR")
cd "$ROOT"
REPORT=$DIR/accelerator.json
LOG=$DIR/accelerator.log
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY=python3
TORCH=0
"$PY" -c 'import torch, transformers' 2>/dev/null && TORCH=1
TORCH_DEVICE=cpu
if ((TORCH)) && [[ $PLATFORM == cuda ]] && "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    TORCH_DEVICE=cuda
fi
report() { "$PY" bench/accelerator_report.py "$REPORT" "$@"; }
report start --platform "$PLATFORM" --quick "$QUICK" --torch "$TORCH" --torch-device "$TORCH_DEVICE"

# stage NAME FUNCTION: runs FUNCTION under the stage limit, its diagnostics in
# the log, then records the stage with its JSON lines.
stage() {
    local name=$1 fn=$2 start rc limit
    [[ $STAGES == *",$name,"* ]] || return 0
    start=$(date +%s%N)
    limit=$((DEADLINE - $(date +%s)))
    ((limit > STAGE_TIMEOUT)) && limit=$STAGE_TIMEOUT
    if ((limit < 10)); then
        echo "== $name: skipped, the budget is spent" | tee -a "$LOG" >&2
        return
    fi
    echo "== $name (at most $limit s)" | tee -a "$LOG" >&2
    timeout --kill-after=5 "$limit" bash -c "$fn" >"$WORK/$name.out" 2>>"$LOG"
    rc=$?
    cat "$WORK/$name.out" >>"$LOG"
    grep '^{' "$WORK/$name.out" >"$WORK/$name.jsonl"
    report stage "$name" --rc "$rc" --seconds "$((($(date +%s%N) - start) / 1000000))e-3" --lines "$WORK/$name.jsonl" >&2
}

# jl TAG CMD…: CMD's JSON lines, each tagged {"tag": TAG}; CMD's failure is the stage's.
jl() {
    local tag=$1
    shift
    "$@" | "$PY" -c '
import json, sys
tag = sys.argv[1]
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        record = json.loads(line)
        record["tag"] = tag
        print(json.dumps(record), flush=True)
    else:
        print(line, file=sys.stderr, flush=True)
' "$tag"
}

# A random model of PRESET at $WORK/PRESET (once), with the tiny model's tokenizer.
model() {
    local preset=$1
    if [[ ! -f $WORK/$preset/config.json ]]; then
        "$GRPO" init-model --family llama --preset "$preset" ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
            --out "$WORK/$preset" >&2 || return 1
    fi
    echo "$WORK/$preset"
}

env_stage() {
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >&2
    "$GRPO" devices --platform "$PLATFORM" >&2 || return 1
    if ((TORCH)) && [[ $TORCH_DEVICE == cuda ]]; then
        jl torch-ceilings "$PY" - <<'PYTHON'
import json, torch
d = "cuda"
x = torch.empty(2 << 30, dtype=torch.uint8, device=d)
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    y.copy_(x)
end.record(); torch.cuda.synchronize()
copy_gbps = 2 * x.numel() * 10 / (start.elapsed_time(end) / 1e3) / 1e9
del x, y
a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    a @ b
start.record()
for _ in range(10):
    a @ b
end.record(); torch.cuda.synchronize()
tflops = 2 * 8192**3 * 10 / (start.elapsed_time(end) / 1e3) / 1e12
print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "copy_gbps": copy_gbps, "bf16_matmul_tflops": tflops}))
PYTHON
    fi
}

smoke_stage() {
    local tiny
    tiny=$(model tiny) || return 1
    printf '%s\n' '{"prompt": "The capital of France is", "completion": " Paris, a city of bridges."}' \
        '{"prompt": "1 + 1 =", "completion": " 2, and 2 + 2 = 4."}' >"$WORK/smoke.jsonl"
    "$GRPO" logprobs --platform "$PLATFORM" --model "$tiny" --input "$WORK/smoke.jsonl" >"$WORK/grpo-logprobs.jsonl" || return 1
    if ((TORCH)); then
        jl logprob-parity "$PY" bench/accelerator_parity.py --model-dir "$tiny" --input "$WORK/smoke.jsonl" \
            --logprobs "$WORK/grpo-logprobs.jsonl" --device "$TORCH_DEVICE" \
            --tolerance "$([[ $PLATFORM == cpu ]] && echo 1e-4 || echo 1e-2)" || return 1
    fi
    grpo_run tiny 2 f32 smoke-run || return 1
}

# grpo_run PRESET STEPS DTYPE TAG: the arithmetic example's settings on a random model.
grpo_run() {
    local dir completion=32 prompts=8 group=8
    dir=$(model "$1") || return 1
    ((QUICK)) && { completion=4; prompts=2; group=2; }
    rm -rf "$WORK/run-$1"
    mkdir -p "$WORK/run-$1"
    cp examples/arithmetic/data.jsonl "$WORK/run-$1/data.jsonl"
    cat >"$WORK/run-$1/config.toml" <<TOML
[model]
name = "$dir"
[data]
path = "data.jsonl"
as_chat = true
[rollout]
group_size = $group
prompts_per_step = $prompts
max_completion_tokens = $completion
max_model_len = 256
dtype = "$3"
[optimizer]
lr = 1e-5
[trainer]
compute_dtype = "$3"
[logging]
out = "out"
[[reward]]
type = "regex"
pattern = "[0-9]"
TOML
    "$GRPO" run "$WORK/run-$1/config.toml" --platform "$PLATFORM" --max-steps "$2" >&2 || return 1
    jl "$4" cat "$WORK/run-$1/out/metrics.jsonl"
}

matmul_stage() {
    local sizes=2048,4096,8192
    ((QUICK)) && sizes=128
    jl matmul "$GRPO" bench matmul --platform "$PLATFORM" --sizes "$sizes" --dtypes f32,bf16 --runs 5 --json
}

# model_step PRESET DTYPES BATCH SEQ
model_step() {
    local dir dtype batch=$3 seq=$4
    dir=$(model "$1") || return 1
    ((QUICK)) && { batch=2; seq=16; }
    jl "flops-$1" "$PY" bench/model_step_torch.py --flops --model-dir "$dir" --batch "$batch" --seq "$seq"
    for dtype in ${2//,/ }; do
        jl "grpo-$1-$dtype" "$GRPO" bench model-step --platform "$PLATFORM" --model "$dir" --dtype "$dtype" \
            --batch "$batch" --seq "$seq" --runs 5 --warmup 2 --json || return 1
        if ((TORCH)); then
            jl "torch-$1-$dtype" "$PY" bench/model_step_torch.py --model-dir "$dir" --attn sdpa --dtype "$dtype" \
                --batch "$batch" --seq "$seq" --runs 5 --warmup 2 --device "$TORCH_DEVICE" || return 1
        fi
        # XLA runs f32 products in TF32 on GPUs: torch so too, for equal precision.
        if ((TORCH)) && [[ $dtype == f32 && $TORCH_DEVICE == cuda ]]; then
            jl "torch-$1-$dtype-tf32" "$PY" bench/model_step_torch.py --model-dir "$dir" --attn sdpa --dtype f32 \
                --tf32 --batch "$batch" --seq "$seq" --runs 5 --warmup 2 --device cuda || return 1
        fi
    done
}

# generate PRESET BATCHES
generate() {
    local dir batches=$2 tokens=128
    dir=$(model "$1") || return 1
    ((QUICK)) && { batches=1,4; tokens=8; }
    jl "grpo-$1" "$GRPO" bench generate --platform "$PLATFORM" --model "$dir" --dtype bf16 --batch "$batches" \
        --prompt-tokens "$tokens" --new-tokens "$tokens" --runs 3 --warmup 1 --json \
        --tokens-out "$WORK/tokens-$1.json" || return 1
    if ((TORCH)); then
        jl "torch-$1" "$PY" bench/generate_torch.py --tokens "$WORK/tokens-$1.json" --model-dir "$dir" --dtype bf16 \
            --batch "$batches" --new-tokens "$tokens" --runs 3 --warmup 1 --device "$TORCH_DEVICE" || return 1
    fi
}

big() { if ((QUICK)); then echo tiny; else echo "$1"; fi; }
step_135m() { model_step "$(big smollm2-135m)" bf16,f32 16 1024; }
gen_135m() { generate "$(big smollm2-135m)" 1,64,256; }
run_135m() { grpo_run "$(big smollm2-135m)" 4 bf16 run; }
step_1b() { model_step "$(big llama-1b)" bf16 8 1024; }
gen_1b() { generate "$(big llama-1b)" 1,64; }
export GRPO PLATFORM QUICK TORCH TORCH_DEVICE PY WORK TOKENIZER
export -f jl model env_stage smoke_stage grpo_run matmul_stage model_step generate big \
    step_135m gen_135m run_135m step_1b gen_1b

stage env env_stage
stage smoke smoke_stage
stage matmul matmul_stage
stage step-135m step_135m
stage gen-135m gen_135m
stage run-135m run_135m
stage step-1b step_1b
stage gen-1b gen_1b
report finish
