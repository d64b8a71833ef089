#!/usr/bin/env bash
# Side-by-side: one full training step (forward, loss, backward, grad-norm
# clipping, AdamW) of grpo (one XLA program) against PyTorch eager on CPU, f32.
#
#   bench/train_step.sh [--rounds R] [--runs N] [--warmup W] [--models mlp,block]
#                       [--threads T] [--out FILE] [--torch-only]
#
# 1. creates or reuses a venv with torch at <grpo cache>/bench-venv;
# 2. cargo build --release;
# 3. per model, R rounds of grpo then torch (interleaved, so both see the same
#    machine noise), each printing one JSON line;
# 4. grpo bench matmul --sizes 2048 --dtypes f32 once (the ceiling);
# 5. bench/report.py prints the table. Every JSON line is kept in FILE
#    (default <grpo cache>/bench-results/train-step-<UTC time>.jsonl).
# --torch-only skips 2-4 (for when grpo's side is not built yet).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=3
RUNS=7
WARMUP=2
MODELS=mlp,block
THREADS=$(nproc)
OUT=
TORCH_ONLY=0
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --torch-only) TORCH_ONLY=1; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_step.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$RUNS" "$WARMUP" "$THREADS"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "train_step.sh: '$n' is not a count" >&2; exit 2; }
done
((ROUNDS >= 1 && RUNS >= 1 && THREADS >= 1)) || { echo "train_step.sh: rounds, runs and threads must be >= 1" >&2; exit 2; }
IFS=, read -r -a MODEL_LIST <<<"$MODELS"

# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
VENV=$CACHE/bench-venv
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3} # makes the venv

# --- 1. torch ---------------------------------------------------------------
# PyPI's torch 2.15.0 for Linux x86_64 is the CUDA 13.2 build: its metadata
# pulls ~2.5 GB of wheels (cuda-toolkit, cuDNN, NCCL, cuSPARSELt, NVSHMEM,
# cuSOLVER, triton, cuda-bindings), and PyTorch's CPU-only wheels live on
# another index that this project cannot use. `pip install --no-deps torch`
# plus only the pure-Python packages it imports (filelock, typing-extensions,
# sympy+mpmath, networkx, jinja2+markupsafe, fsspec; numpy to silence its
# warning) does NOT import: libtorch_cpu.so, libtorch_cuda.so and
# libtorch_python.so name the CUDA libraries as DT_NEEDED, so `import torch`
# fails with "libcublasLt.so.*[0-9] not found" even on a machine without GPU.
# The smallest install that imports and trains on CPU therefore adds, still
# --no-deps, exactly the NVIDIA wheels whose libraries are linked at load time
# (all of them are mapped after `import torch`): cudart, cupti, nvrtc, cublas,
# cufft, cufile, cusparse (+ nvjitlink, which it needs), cusparselt, nccl,
# cudnn and nvshmem. Left out, never loaded on CPU: triton (~290 MB, only for
# torch.compile), cusolver (~230 MB, dlopened only by CUDA linalg),
# cuda-bindings, cuda-pathfinder, cuda-cccl, nvtx and the cuda-toolkit
# meta-package. That is ~2.5 GB downloaded (torch itself 540 MB), ~4 GB on
# disk, against ~3 GB / ~5 GB for the default install. Versions are the ones
# torch 2.15.0's metadata resolves to.
PACKAGES=(
    torch==2.15.0
    filelock typing-extensions sympy mpmath networkx jinja2 markupsafe fsspec numpy
    nvidia-cuda-runtime==13.2.86 nvidia-cuda-cupti==13.2.86 nvidia-cuda-nvrtc==13.2.86
    nvidia-cublas==13.4.1.3 nvidia-cufft==12.2.0.57 nvidia-cufile==1.17.1.22
    nvidia-cusparse==12.7.10.12 nvidia-nvjitlink==13.5.37
    nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7
    nvidia-cudnn-cu13==9.26.0.51 nvidia-nvshmem-cu13==3.7.2
)
STAMP=$VENV/.grpo-bench-packages
if [[ -x $PY && -f $STAMP && "$(cat "$STAMP")" == "${PACKAGES[*]}" ]]; then
    echo "== torch: reusing $VENV" >&2
else
    echo "== torch: installing into $VENV (~2.5 GB download on first use)" >&2
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "train_step.sh: torch 2.15.0 needs Python >= 3.11; set PYTHON to one" >&2
        exit 1
    }
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off -q \
        --no-deps "${PACKAGES[@]}"
    "$PY" -c 'import torch; torch.ones(2, 2, requires_grad=True).sum().backward()'
    printf '%s' "${PACKAGES[*]}" >"$STAMP"
fi

# --- 2. grpo ----------------------------------------------------------------
# shellcheck source=bench/common.sh
source bench/common.sh
build_grpo
open_results train-step
write_meta train-step

# --- 3. interleaved rounds ----------------------------------------------------
for model in "${MODEL_LIST[@]}"; do
    for ((round = 1; round <= ROUNDS; round++)); do
        echo "== $model, round $round/$ROUNDS" >&2
        if ((!TORCH_ONLY)); then
            json_lines "grpo bench train-step" \
                "$GRPO" bench train-step --model "$model" --runs "$RUNS" --warmup "$WARMUP" --json
        fi
        json_lines "train_step_torch.py" \
            "$PY" bench/train_step_torch.py --model "$model" --runs "$RUNS" \
            --warmup "$WARMUP" --threads "$THREADS"
    done
done

# --- 4. the matmul ceiling ----------------------------------------------------
if ((!TORCH_ONLY)); then
    echo "== matmul ceiling" >&2
    json_lines "grpo bench matmul" "$GRPO" bench matmul --sizes 2048 --dtypes f32 --json
fi

# --- 5. table -----------------------------------------------------------------
echo >&2
echo "results: $OUT" >&2
"$PY" bench/report.py "$OUT"
