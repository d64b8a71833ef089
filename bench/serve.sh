#!/usr/bin/env bash
# Serving benchmark: TTFT, TPOT and output tokens/s of `grpo serve` on
# SmolLM2-135M-Instruct at several concurrency levels, measured by
# bench/serve_load.py (the official `openai` client, streaming completions
# with include_usage, ignore_eos so every request makes MAX_TOKENS tokens).
#
#   bench/serve.sh                       # concurrency 1, 8, 32; 64 tokens
#   CONCURRENCY=1,8 REQUESTS=8 MAX_TOKENS=32 bench/serve.sh
#   LOAD=hostile SECONDS_PER_PHASE=30 bench/serve.sh
#
# LOAD=hostile runs bench/serve_hostile.py instead: 32 well-behaved clients
# and /health probes, alone and then beside one abusive client (requests at
# and over the server's limits); p50/p99 latencies of both, per phase.
#
# Builds the release binary (unless NO_BUILD=1), starts it on a free
# loopback port with --max-num-seqs MAX_NUM_SEQS (32), waits for /health,
# runs the load, prints one JSON line per level (stdout) and a table
# (stderr), and stops the server. DEVICE (cpu) picks grpo's device.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CONCURRENCY=${CONCURRENCY:-1,8,32}
REQUESTS=${REQUESTS:-0} # per level; 0 = 2 x concurrency, at least 4
MAX_TOKENS=${MAX_TOKENS:-64}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-32}
DEVICE=${DEVICE:-cpu}
MODEL=smollm2-135m-instruct

PY=$(tools/test-venv.sh)
GRPO=${CARGO_TARGET_DIR:-$ROOT/target}/release/grpo
if [[ ${NO_BUILD:-0} != 1 ]]; then
    echo "== grpo: cargo build --release" >&2
    cargo build --release --quiet
fi

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE=http://127.0.0.1:$PORT
LOG=$(mktemp)
echo "== grpo serve on $BASE (log $LOG)" >&2
"$GRPO" serve --model "$MODEL" --port "$PORT" --max-num-seqs "$MAX_NUM_SEQS" --device "$DEVICE" >"$LOG" 2>&1 &
SERVER=$!
stop() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
}
trap stop EXIT

HEALTHY=0
for _ in $(seq 600); do
    if "$PY" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$BASE/health" 2>/dev/null; then
        HEALTHY=1
        break
    fi
    kill -0 "$SERVER" 2>/dev/null || { echo "serve.sh: the server exited:" >&2; cat "$LOG" >&2; exit 1; }
    sleep 0.5
done
((HEALTHY)) || { echo "serve.sh: no /health from $BASE after 300 s" >&2; exit 1; }

if [[ ${LOAD:-} == hostile ]]; then
    "$PY" bench/serve_hostile.py --base-url "$BASE" --model "$MODEL" --seconds "${SECONDS_PER_PHASE:-30}"
else
    "$PY" bench/serve_load.py --base-url "$BASE" --model "$MODEL" --concurrency "$CONCURRENCY" \
        --requests-per-level "$REQUESTS" --max-tokens "$MAX_TOKENS"
fi
