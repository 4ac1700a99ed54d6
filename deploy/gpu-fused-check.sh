#!/usr/bin/env bash
# The fused kernels on a GPU machine in one call (Note [Fused kernels] in
# engine/model/fused_math.h; docs/performance.md, issue 33): builds
# megatrain-bench and fused_kernels_cuda_test, runs the kernels' GPU tests
# against the ATen path, then an interleaved speed A/B of
# `megatrain-bench --fused_kernels=off` (A) and `=on` (B), each
# configuration A, B, A, B, ... REPEATS times, and prints a table of the
# median tokens/s of each and their ratio.
#
#   deploy/gpu-fused-check.sh ["llama-1b llama-3b"]
#
# Environment: SEQ_LEN (2048), MICRO_BATCH (8), STEPS (4), WARMUP (2),
# REPEATS (2), CLIP (1.0). Every program runs under a time limit
# (wait_bounded, deploy/gpu-bounded.sh: a hang prints its stacks).
# Results: $OUT/fused-test.log, $OUT/fused-ab.jsonl, $OUT/fused-ab.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source deploy/gpu-bounded.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
presets=${1:-"llama-1b llama-3b"}
SEQ_LEN=${SEQ_LEN:-2048}
MICRO_BATCH=${MICRO_BATCH:-8}
REPEATS=${REPEATS:-2}
CLIP=${CLIP:-1.0}
start=$(date +%s)

# The kernels are built by default in CUDA builds; the option is named in
# case a cached build directory turned it off.
MEGATRAIN_CMAKE_ARGS="-DMEGATRAIN_FUSED_KERNELS=ON ${MEGATRAIN_CMAKE_ARGS:-}" \
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench \
  fused_kernels_cuda_test > "$OUT/build.log" 2>&1 &
wait_bounded $! 400 build || { echo "build failed"; grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

build-gpu/tests/fused_kernels_cuda_test > "$OUT/fused-test.log" 2>&1 &
wait_bounded $! 180 fused_kernels_cuda_test
test_rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|Expected|Which is' \
  "$OUT/fused-test.log" | head -40
echo "fused_kernels_cuda_test: exit $test_rc"

bench() {  # bench PRESET FUSED >> jsonl
  build-gpu/engine/megatrain-bench --model="$1" --device=cuda --compute_dtype=bf16 \
    --micro_batch="$MICRO_BATCH" --seq_len="$SEQ_LEN" --max_grad_norm="$CLIP" \
    --steps="${STEPS:-4}" --warmup="${WARMUP:-2}" --data=random --fused_kernels="$2" \
    --json 2> "$OUT/bench-$1-$2.err" >> "$OUT/fused-ab.jsonl" &
  wait_bounded $! 240 "bench $1 fused=$2" || echo "bench $1 fused=$2 failed: $(tail -3 "$OUT/bench-$1-$2.err")"
}
: > "$OUT/fused-ab.jsonl"
for preset in $presets; do
  for _ in $(seq "$REPEATS"); do
    bench "$preset" off
    bench "$preset" on
  done
done
python3 - "$OUT/fused-ab.jsonl" <<'PY' | tee "$OUT/fused-ab.txt"
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        j = json.loads(line)
        runs.setdefault((j["model"], bool(j.get("fused_kernels"))), []).append(j["tokens_per_s"])
print("| model | fused off tokens/s | fused on tokens/s | on / off | runs |")
print("|---|---|---|---|---|")
for model in sorted({m for m, _ in runs}):
    off, on = runs.get((model, False), []), runs.get((model, True), [])
    if not off or not on:
        print(f"| {model} | {off} | {on} | - | incomplete |")
        continue
    a, b = statistics.median(off), statistics.median(on)
    print(f"| {model} | {a:,.0f} | {b:,.0f} | {b / a:.3f}x | {len(off)} + {len(on)} |")
PY
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
echo "total: $(( $(date +%s) - start )) s"
