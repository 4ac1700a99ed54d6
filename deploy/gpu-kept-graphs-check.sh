#!/usr/bin/env bash
# Kept layer graphs on a GPU machine in one call (Note [Kept layer graphs]
# in engine/step/executor.h; docs/performance.md, "Kept layer graphs"):
# builds megatrain-bench (and, with TEST=1, executor_parity_cuda_test, whose
# kept-graph modes it runs against the fp32 reference), then for each
# CONFIG of each preset an interleaved A/B of
# `megatrain-bench --activation_checkpointing=all` (A: every layer
# recomputed) and `=auto` (B: the resident layers whose graphs fit keep
# them), REPEATS times, and resident PyTorch once per preset at micro-batch
# 8 in the same call: eager and `layer.compile()`d, both with activation
# checkpointing, and compiled without it (deploy/torch_baselines.py).
# Prints each run's tokens/s, the kept layers, the planned and the measured
# peak device memory, and the baselines.
#
#   deploy/gpu-kept-graphs-check.sh "llama-1b llama-3b"
#
# Environment: CONFIGS (MICRO_BATCH:ACCUM[:SCHEDULE] entries, default
# "8:1 8:4"), SEQ_LEN (2048), STEPS (4), WARMUP (2), REPEATS (1), TEST (1),
# SKIP_BUILD (0), BASELINES (1). Every program runs under a time limit
# (wait_bounded, deploy/gpu-bounded.sh). Results: $OUT/kept.jsonl,
# $OUT/kept-baselines.jsonl, $OUT/kept-test.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source deploy/gpu-bounded.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
presets=${1:-"llama-1b"}
SEQ_LEN=${SEQ_LEN:-2048}
start=$(date +%s)
targets="megatrain-bench"
[ "${TEST:-1}" = 1 ] && targets="$targets executor_parity_cuda_test"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck disable=SC2086  # the targets are words
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu $targets > "$OUT/build.log" 2>&1 &
  wait_bounded $! 420 build || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [ "${TEST:-1}" = 1 ]; then
  build-gpu/tests/executor_parity_cuda_test --gtest_filter='*KeptGraphs*' > "$OUT/kept-test.log" 2>&1 &
  wait_bounded $! 200 executor_parity_cuda_test
  echo "GPU parity of the kept-graph modes: exit $?"
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|Failure|Expected|Which is' "$OUT/kept-test.log" | head -20
fi

bench() {  # preset mb accum schedule checkpointing
  build-gpu/engine/megatrain-bench --model="$1" --device=cuda --compute_dtype=bf16 \
    --micro_batch="$2" --seq_len="$SEQ_LEN" --gradient_accumulation_steps="$3" \
    --max_grad_norm=1.0 --steps="${STEPS:-4}" --warmup="${WARMUP:-2}" --data=random --json \
    --schedule="$4" --activation_checkpointing="$5" > "$OUT/run.json" 2> "$OUT/run.err" &
  wait_bounded $! 240 "$1 $2x$3 $4 $5"
  tail -1 "$OUT/run.json" >> "$OUT/kept.jsonl"
  python3 - "$5" "$(tail -1 "$OUT/run.json")" <<'PY' || tail -5 "$OUT/run.err"
import json, sys
ckpt, j = sys.argv[1], json.loads(sys.argv[2])
p = j["device_plan"]
print(f"  {j['model']} {j['micro_batch']}x{j['seq_len']} acc {j['gradient_accumulation_steps']} "
      f"{j['schedule']} checkpointing {ckpt}: {j['tokens_per_s']:,.0f} tokens/s "
      f"({100 * j['mfu']:.1f}% MFU), kept graphs {j['kept_graph_layers']} "
      f"({j['kept_graph_bytes'] / 1e9:.1f} GB), planned {p['planned'] / 1e9:.1f} GB, "
      f"peak {j['peak_gpu_bytes'] / 1e9:.1f} GB of {p['total'] / 1e9:.1f}")
PY
}

: > "$OUT/kept.jsonl"
: > "$OUT/kept-baselines.jsonl"
for preset in $presets; do
  for config in ${CONFIGS:-8:1 8:4}; do
    IFS=: read -r mb accum schedule <<< "$config"
    for _ in $(seq "${REPEATS:-1}"); do
      bench "$preset" "$mb" "$accum" "${schedule:-auto}" all
      bench "$preset" "$mb" "$accum" "${schedule:-auto}" auto
    done
  done
  [ "${BASELINES:-1}" = 1 ] || continue
  for flags in "--ckpt" "--ckpt --compile" "--compile"; do
    # shellcheck disable=SC2086  # the flags are words
    python3 deploy/torch_baselines.py --mode resident --preset "$preset" --micro-batch 8 \
      --seq "$SEQ_LEN" --clip $flags > "$OUT/baseline.json" 2> "$OUT/baseline.err" &
    wait_bounded $! 240 "PyTorch $preset $flags"
    line=$(tail -1 "$OUT/baseline.json")
    echo "$line" >> "$OUT/kept-baselines.jsonl"
    echo "  PyTorch $preset 8x$SEQ_LEN $flags: $line"
  done
done
echo "total: $(( $(date +%s) - start )) s"
