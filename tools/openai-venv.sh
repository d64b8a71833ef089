#!/usr/bin/env bash
# Creates the Python environment of the `openai` client tests and the serving
# benchmark, and prints its interpreter's path on stdout (progress goes to
# stderr):
#
#   PY=$(tools/openai-venv.sh)
#
# The venv is <grpo cache>/openai-venv, <grpo cache> being
# ${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo} as in grpo itself.
# It holds only the pinned official `openai` client and its pure-Python
# dependencies (httpx, pydantic, ...; no torch). A stamp file in the venv
# makes a second run a no-op; a failed install exits non-zero.
set -euo pipefail

OPENAI_PACKAGES=(openai==3.57.0)

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
VENV=$CACHE/openai-venv
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3} # makes the venv

if [[ ! -x $PY ]]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
        echo "openai-venv.sh: the openai client needs Python >= 3.9; set PYTHON to one" >&2
        exit 1
    }
    echo "== openai venv: creating $VENV" >&2
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV"
fi

STAMP=$VENV/.grpo-openai-packages
if [[ ! -f $STAMP || "$(cat "$STAMP")" != "${OPENAI_PACKAGES[*]}" ]]; then
    echo "== openai venv: installing ${OPENAI_PACKAGES[*]}" >&2
    "$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off -q "${OPENAI_PACKAGES[@]}" >&2
    "$PY" -c 'import openai; print("openai", openai.__version__)' >&2
    printf '%s' "${OPENAI_PACKAGES[*]}" >"$STAMP"
fi

echo "$PY"
