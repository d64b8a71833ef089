#!/usr/bin/env bash
# Runs every test of the workspace on real XLA. On a fresh machine it first
# installs what the tests need: the pinned CPU PJRT plugin (`grpo setup`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -- setup
cargo test --workspace
