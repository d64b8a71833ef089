#!/usr/bin/env bash
# Reward throughput: samples/s of `grpo reward` (end to end: read JSONL, score
# in batches through the reward pool, write JSONL) through the built-in `math`
# reward, the `command` plug-in (examples/rewards/my_reward.py through the
# Python helper) and the `http` plug-in (bench/reward_server.py on loopback).
#
#   bench/reward.sh [--samples N] [--batch-size B] [--runs R]
#
# Samples are GSM8K-style rows (an `answer` ending in `#### n`, completions in
# several answer formats, half right), generated here. Prints one JSON line
# per reward: {"reward", "samples", "batch_size", "median_s", "samples_per_s"}.
# Defaults: 10,000 samples, batches of 64, 3 runs. Builds with cargo --release.
set -euo pipefail
cd "$(dirname "$0")/.."

SAMPLES=10000
BATCH=64
RUNS=3
while (($#)); do
    case $1 in
    --samples) SAMPLES=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
    esac
done

cargo build --release --quiet
GRPO=${CARGO_TARGET_DIR:-$PWD/target}/release/grpo
WORK=$(mktemp -d)
SERVER=
cleanup() {
    [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

python3 - "$SAMPLES" >"$WORK/samples.jsonl" <<'PY'
import json, sys
formats = ["\\boxed{{{n}}}", "step one\n#### {n}", "So the answer is ${n}.", "She ends with {n} dollars."]
for i in range(int(sys.argv[1])):
    n = 1000 + i
    given = n if i % 2 == 0 else n + 1
    row = {"prompt": f"Question {i}?", "completion": "Reasoning... " + formats[i % 4].format(n=given),
           "answer": f"{n - 1} + 1 = {n}\n#### {n}"}
    print(json.dumps(row))
PY

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 bench/reward_server.py "$PORT" &
SERVER=$!
for _ in $(seq 50); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT))" 2>/dev/null && break
    sleep 0.1
done

cat >"$WORK/math.toml" <<TOML
[[reward]]
type = "math"
TOML
cat >"$WORK/command.toml" <<TOML
[[reward]]
type = "command"
script = "examples/rewards/my_reward.py"
TOML
cat >"$WORK/http.toml" <<TOML
[[reward]]
type = "http"
url = "http://127.0.0.1:$PORT/"
TOML

for reward in math command http; do
    times=()
    for _ in $(seq "$RUNS"); do
        start=$EPOCHREALTIME
        RUST_LOG=warn "$GRPO" reward --config "$WORK/$reward.toml" --input "$WORK/samples.jsonl" \
            --batch-size "$BATCH" >"$WORK/out.jsonl"
        times+=("$start:$EPOCHREALTIME")
        lines=$(wc -l <"$WORK/out.jsonl")
        ((lines == SAMPLES)) || { echo "$reward: $lines lines for $SAMPLES samples" >&2; exit 1; }
    done
    python3 - "$reward" "$SAMPLES" "$BATCH" "$WORK/out.jsonl" "${times[@]}" <<'PY'
import json, statistics, sys
reward, n, batch, out, *times = sys.argv[1:]
right = sum(json.loads(l)["reward"] == 1.0 for l in open(out))
median = statistics.median(float(b) - float(a) for a, b in (t.split(":") for t in times))
print(json.dumps({"reward": reward, "samples": int(n), "batch_size": int(batch), "median_s": round(median, 3),
                  "samples_per_s": round(int(n) / median), "scored_right": right}))
PY
done
