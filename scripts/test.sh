#!/usr/bin/env bash
# Runs every test of the workspace on real XLA. On a fresh machine it first
# installs what the tests need: the pinned CPU PJRT plugin (`grpo setup`) and
# the venv of the official `openai` Python client (tools/test-venv.sh; the
# serving test openai_client.rs runs it through GRPO_TEST_PYTHON, and so
# does deploy/test_deploy.py, which needs PyYAML and kubernetes-validate).
# The benchmark report's unit tests need only python3.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -- setup
GRPO_TEST_PYTHON=$(tools/test-venv.sh)
export GRPO_TEST_PYTHON
cargo test --workspace
python3 -m unittest discover -s bench -p 'test_*.py'
# deploy/: manifests against the Kubernetes schemas, grpo flags against the
# binary cargo test built.
GRPO_BIN=${CARGO_TARGET_DIR:-target}/debug/grpo "$GRPO_TEST_PYTHON" -m unittest discover -s deploy -p 'test_*.py'
