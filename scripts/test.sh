#!/usr/bin/env bash
# Runs every test of the workspace on real XLA. On a fresh machine it first
# installs what the tests need: the pinned CPU PJRT plugin (`grpo setup`).
# The benchmark report's unit tests need only python3.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -- setup
cargo test --workspace
python3 -m unittest discover -s bench -p 'test_*.py'
