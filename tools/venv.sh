#!/usr/bin/env bash
# Creates or extends the Python environment of the tools in tools/ and prints
# its interpreter's path on stdout (all progress goes to stderr):
#
#   PY=$(tools/venv.sh)
#
# The venv is <grpo cache>/tools-venv, <grpo cache> being
# ${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo} as in grpo itself.
# It is shared with other tools: this script never deletes it, it only adds
#   - torch, installed exactly as bench/train_step.sh installs it (`--no-deps`,
#     torch plus only the NVIDIA wheels it loads at import; the package list is
#     read from bench/train_step.sh, so the two never disagree; see the comment
#     there for why),
#   - the pinned TOOLS_PACKAGES below (transformers pulls its own pure-Python
#     dependencies; torch is already satisfied, so nothing CUDA is added), and
#   - PEFT_PACKAGES below (PEFT and accelerate, which it imports), `--no-deps`
#     for the same reason as TRL (the LoRA fixtures need PEFT), and
#   - with TOOLS_TRL=1 in the environment (bench/grpo_loop.sh sets it), TRL and
#     what it imports, TRL_PACKAGES below, `--no-deps` like torch: pip's
#     resolver would otherwise walk torch's own metadata again and add the
#     CUDA wheels train_step.sh leaves out (triton, cusolver, cuda-toolkit, …).
# Stamp files in the venv make a second run a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_PACKAGES=(transformers==5.24.0 safetensors==0.8.0)
PEFT_PACKAGES=(peft==0.21.2 accelerate==1.15.0)
# trl 1.16.0 and the packages it (and datasets, accelerate, pandas) imports
# that TOOLS_PACKAGES does not already bring; the rest (numpy, pyyaml, psutil,
# huggingface-hub, fsspec, tqdm, packaging, jinja2) comes with transformers.
TRL_PACKAGES=(
    trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 pyarrow==26.0.1 pandas==3.1.1
    python-dateutil==4.0.0 tzdata==2026.6 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
)

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
VENV=$CACHE/tools-venv
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3} # makes the venv

mapfile -t TORCH_PACKAGES < <(
    sed -n '/^PACKAGES=(/,/^)/p' bench/train_step.sh | sed '1d;$d' | tr -s ' \t' '\n' | sed '/^$/d'
)
((${#TORCH_PACKAGES[@]} > 0)) || { echo "venv.sh: no PACKAGES=( ... ) in bench/train_step.sh" >&2; exit 1; }

PIP=("$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off -q)

if [[ ! -x $PY ]]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "venv.sh: torch needs Python >= 3.11; set PYTHON to one" >&2
        exit 1
    }
    echo "== tools venv: creating $VENV" >&2
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV"
fi

TORCH_STAMP=$VENV/.grpo-tools-torch
if [[ ! -f $TORCH_STAMP || "$(cat "$TORCH_STAMP")" != "${TORCH_PACKAGES[*]}" ]]; then
    echo "== tools venv: installing torch into $VENV (~2.5 GB download on first use)" >&2
    "${PIP[@]}" --no-deps "${TORCH_PACKAGES[@]}" >&2
    "$PY" -c 'import torch; torch.ones(2, 2, requires_grad=True).sum().backward()' >&2
    printf '%s' "${TORCH_PACKAGES[*]}" >"$TORCH_STAMP"
fi

TOOLS_STAMP=$VENV/.grpo-tools-packages
if [[ ! -f $TOOLS_STAMP || "$(cat "$TOOLS_STAMP")" != "${TOOLS_PACKAGES[*]}" ]]; then
    echo "== tools venv: installing ${TOOLS_PACKAGES[*]}" >&2
    "${PIP[@]}" "${TOOLS_PACKAGES[@]}" >&2
    "$PY" -c 'import transformers, safetensors' >&2
    printf '%s' "${TOOLS_PACKAGES[*]}" >"$TOOLS_STAMP"
fi

PEFT_STAMP=$VENV/.grpo-tools-peft
if [[ ! -f $PEFT_STAMP || "$(cat "$PEFT_STAMP")" != "${PEFT_PACKAGES[*]}" ]]; then
    echo "== tools venv: installing ${PEFT_PACKAGES[*]}" >&2
    "${PIP[@]}" --no-deps "${PEFT_PACKAGES[@]}" >&2
    "$PY" -c 'import peft; from peft import LoraConfig, PeftModel, get_peft_model' >&2
    printf '%s' "${PEFT_PACKAGES[*]}" >"$PEFT_STAMP"
fi

TRL_STAMP=$VENV/.grpo-tools-trl
if [[ ${TOOLS_TRL:-0} == 1 && (! -f $TRL_STAMP || "$(cat "$TRL_STAMP")" != "${TRL_PACKAGES[*]}") ]]; then
    echo "== tools venv: installing ${TRL_PACKAGES[*]}" >&2
    "${PIP[@]}" --no-deps "${TRL_PACKAGES[@]}" >&2
    "$PY" -c 'import trl, accelerate, datasets; from trl import GRPOConfig, GRPOTrainer' >&2
    printf '%s' "${TRL_PACKAGES[*]}" >"$TRL_STAMP"
fi

echo "$PY"
