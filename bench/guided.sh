#!/usr/bin/env bash
# The cost of structured outputs: generation throughput of SmolLM2-135M-Instruct
# with and without a JSON schema guiding every request (`grpo bench generate`,
# greedy, the same prompt, batch sizes and token counts), and the share of the
# decode time the guide's masks take on the host.
#
#   bench/guided.sh [--rounds R] [--runs N] [--warmup W] [--batch 1,16]
#                   [--new-tokens T] [--dtype f32|bf16] [--out FILE]
#
# The schema (bench/guided_schema.json: an object with at least 64 readings)
# makes every guided answer longer than --new-tokens, so guided and plain runs
# decode the same number of tokens in the same batch shapes and differ only by
# the guide's work. R rounds alternate plain and guided runs (both see the same
# machine noise); every JSON line is kept in FILE (default
# <grpo cache>/bench-results/guided-<UTC time>.jsonl) and a table of medians
# over the rounds is printed. Defaults: 3 rounds, 3 runs after 1 warm-up,
# batches 1,16, 64 new tokens, f32. Needs `cargo run --release -- setup` first.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
RUNS=3
WARMUP=1
BATCH=1,16
NEW_TOKENS=64
DTYPE=f32
OUT=
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --new-tokens) NEW_TOKENS=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "guided.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$RUNS" "$WARMUP" "$NEW_TOKENS"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "guided.sh: '$n' is not a count" >&2; exit 2; }
done
((ROUNDS >= 1 && RUNS >= 1 && NEW_TOKENS >= 1 && NEW_TOKENS < 256)) || {
    echo "guided.sh: rounds and runs must be >= 1, new tokens 1 to 255 (the schema's answers are longer)" >&2
    exit 2
}
# The same cache folder as grpo's (xla/src/pjrt/locate.rs).
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}
ROOT=$PWD
TORCH_ONLY=0 # read by bench/common.sh: there is no torch side here
# shellcheck source=bench/common.sh
source bench/common.sh
grpo_bench guided

run() {
    "$GRPO" bench generate --batch "$BATCH" --new-tokens "$NEW_TOKENS" --dtype "$DTYPE" \
        --runs "$RUNS" --warmup "$WARMUP" --json "$@" 2>/dev/null | grep '^{' | tee -a "$OUT"
}
for ((round = 1; round <= ROUNDS; round++)); do
    echo "== round $round/$ROUNDS: plain, then guided" >&2
    run
    run --json-schema bench/guided_schema.json
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"bench": "generate"' in line]
cases = {}
for r in rows:
    cases.setdefault((r["batch"], r["guide"]), []).append(r)
print(f"{'batch':>5}  {'plain tok/s':>11}  {'guided tok/s':>12}  {'guided/plain':>12}  {'mask share':>10}")
for batch in sorted({b for b, _ in cases}):
    plain = statistics.median(r["decode_tokens_per_s"] for r in cases.get((batch, "none"), []))
    guided_rows = cases.get((batch, "json_schema"), [])
    guided = statistics.median(r["decode_tokens_per_s"] for r in guided_rows)
    share = statistics.median(r["mask_share"] for r in guided_rows)
    print(f"{batch:>5}  {plain:>11.1f}  {guided:>12.1f}  {guided / plain:>12.3f}  {100 * share:>9.2f}%")
print(f"(medians over the rounds; lines in {sys.argv[1]})")
PY
