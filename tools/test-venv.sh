#!/usr/bin/env bash
# Creates the Python environment of the tests' independent readers — the
# official `openai` client (serving tests, the serving benchmark),
# pandas + pyarrow (the rollout log is read as a Parquet dataset), and
# PyYAML + kubernetes-validate (deploy/test_deploy.py checks the Kubernetes
# manifests against the official schemas, offline), jsonschema (structured
# outputs are validated against their schemas), tensorboard (a run's event
# files are read with TensorBoard's own reader), prometheus-client (every
# /metrics page is parsed with Prometheus' own Python parser) — and prints its
# interpreter's path on stdout (progress goes to stderr):
#
#   PY=$(tools/test-venv.sh)
#
# The venv is <grpo cache>/test-venv, <grpo cache> being
# ${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo} as in grpo itself.
# It holds only those pinned packages and their dependencies (no torch). A stamp file in the venv
# makes a second run a no-op; a failed install exits non-zero.
set -euo pipefail

TEST_PACKAGES=(openai==3.57.0 pyarrow==26.0.1 pandas==3.1.1 pyyaml==6.0.3 kubernetes-validate==1.37.0 jsonschema==4.26.0 tensorboard==2.21.0 prometheus-client==0.26.0)

CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
VENV=$CACHE/test-venv
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3} # makes the venv

if [[ ! -x $PY ]]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "test-venv.sh: the pinned pandas and pyarrow need Python >= 3.11 ($("$PYTHON" --version 2>&1) found); set PYTHON to a newer one" >&2
        exit 1
    }
    echo "== test venv: creating $VENV" >&2
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV" || {
        rm -rf "$VENV"
        echo "test-venv.sh: $PYTHON cannot make a venv; on Debian or Ubuntu: apt-get install python3-venv" >&2
        exit 1
    }
fi

STAMP=$VENV/.grpo-test-packages
if [[ ! -f $STAMP || "$(cat "$STAMP")" != "${TEST_PACKAGES[*]}" ]]; then
    echo "== test venv: installing ${TEST_PACKAGES[*]}" >&2
    "$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off -q "${TEST_PACKAGES[@]}" >&2
    "$PY" -c 'import openai, pyarrow, pandas, yaml, kubernetes_validate, tensorboard, prometheus_client; print("openai", openai.__version__, "pyarrow", pyarrow.__version__)' >&2
    printf '%s' "${TEST_PACKAGES[*]}" >"$STAMP"
fi

echo "$PY"
