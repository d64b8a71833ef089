# Shared steps of the side-by-side runners (sourced, not run):
#   model_tools MODEL     — the tools venv (sets PY) and grpo's folder of MODEL (sets MODEL_DIR),
#                           which `cargo run --release -- setup` makes; exits if it is missing
#   build_grpo            — cargo build --release unless TORCH_ONLY=1; sets GRPO
#   open_results NAME     — sets OUT (default <cache>/bench-results/NAME-<UTC>.jsonl) and empties it
#   json_lines WHAT CMD…  — runs CMD, keeps its JSON lines in $OUT (and shows them)
#   write_meta BENCH      — one {"meta": …} line: commit, CPUs, counts, torch (and transformers) versions
#   grpo_bench BENCH [JSON] — for runners without a torch side: build_grpo, open_results BENCH and
#                           one {"meta": …} line (commit, CPU model, cores, and JSON's extra "key": value pairs)
# Expects ROOT, CACHE, PY, OUT, TORCH_ONLY, THREADS, ROUNDS, RUNS, WARMUP from the runner.

model_tools() {
    MODEL_DIR=$CACHE/models/$1
    # tools/venv.sh reads torch's package list from bench/train_step.sh (the
    # comment there says why it is what it is) and adds the pinned transformers
    # and safetensors: the same pins as tools/ without a second copy of them.
    PY=$(tools/venv.sh)
    if [[ ! -f $MODEL_DIR/config.json ]]; then
        echo "$(basename "$0"): no model at $MODEL_DIR; create it with \`cargo run --release -- setup\`" >&2
        exit 1
    fi
}

build_grpo() {
    GRPO=${CARGO_TARGET_DIR:-$ROOT/target}/release/grpo
    if ((!TORCH_ONLY)); then
        echo "== grpo: cargo build --release" >&2
        cargo build --release --quiet
    fi
}

open_results() {
    if [[ -z $OUT ]]; then
        mkdir -p "$CACHE/bench-results"
        OUT=$CACHE/bench-results/$1-$(date -u +%Y%m%dT%H%M%SZ).jsonl
    fi
    : >"$OUT"
}

json_lines() {
    local what=$1 lines
    shift
    if ! lines=$("$@"); then
        echo "$(basename "$0"): $what failed: $*" >&2
        exit 1
    fi
    lines=$(grep '^{' <<<"$lines" || true)
    if [[ -z $lines ]]; then
        echo "$(basename "$0"): $what printed no JSON line: $*" >&2
        exit 1
    fi
    printf '%s\n' "$lines" | tee -a "$OUT"
}

write_meta() {
    "$PY" - "$1" "$THREADS" "$ROUNDS" "$RUNS" "$WARMUP" >>"$OUT" <<'PYTHON'
import importlib.util, json, os, platform, subprocess, sys
import torch
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
bench = sys.argv[1]
threads, rounds, runs, warmup = map(int, sys.argv[2:])
meta = {"bench": bench, "commit": commit, "cpus": os.cpu_count(), "threads": threads, "rounds": rounds,
        "runs": runs, "warmup": warmup, "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
if importlib.util.find_spec("transformers"):
    import transformers
    meta["transformers"] = transformers.__version__
print(json.dumps({"meta": meta}))
PYTHON
}

grpo_bench() {
    build_grpo
    open_results "$1"
    local cpu commit
    cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    echo "{\"meta\": {\"bench\": \"$1\", \"commit\": \"$commit\", \"cpu\": \"$cpu\", \"cores\": $(nproc)${2:+, $2}}}" >>"$OUT"
}
