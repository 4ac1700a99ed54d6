#!/usr/bin/env bash
# One call on a GPU machine: builds megatrain-bench and records, for each
# configuration, a Kineto trace of one measured step of megatrain-bench
# (--kernel_trace) and of resident PyTorch (deploy/torch-trace.py, the
# baseline's workload with activation checkpointing), eager and with each
# decoder layer compiled, then sums their kernels by kind with
# deploy/kernel-summary.py.
#
#   deploy/gpu-profile.sh "llama-1b:8:1:1 llama-1b:1:8:1:layer-major:8"
#
# Configurations as deploy/gpu-speed.sh's: PRESET:MICRO_BATCH:ACCUMULATION:CLIP[:SCHEDULE[:WAVE]]
# (Llama presets only: the baseline is deploy/torch_baselines.py's).
# Environment: SEQ_LEN (2048), STEPS (2), WARMUP (2), BUILD_DIR (build-gpu),
# SKIP_BUILD (0), COMPILED (1: also trace the compiled baseline), KEEP_TRACES (0; 1 adds the gzipped traces to the tarball:
# tens of MB, too large for the device tool to bring back). Results: the
# summaries on stdout; $OUT/profile.tgz (summaries and logs).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-$PWD/gpu-out}
OUT=$(mktemp -d)
configs=${1:-"llama-1b:8:1:1"}
shift || true
SEQ_LEN=${SEQ_LEN:-2048}
BUILD_DIR=${BUILD_DIR:-build-gpu}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-profile.log" 2>&1 || { tail -30 "$OUT/build-profile.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
tmp=$(mktemp -d)
for c in $configs; do
  IFS=: read -r preset mb accum clip schedule wave <<<"$c"
  schedule=${schedule:-auto}; wave=${wave:-0}
  norm=0; cflag=""
  if [ "$clip" = 1 ]; then norm=1.0; cflag=--clip; fi
  tag="$preset-$mb-$accum-$clip-$schedule-$wave"
  tokens=$((mb * SEQ_LEN * accum))
  "$BUILD_DIR"/engine/megatrain-bench --model="$preset" --device=cuda --compute_dtype=bf16 \
    --micro_batch="$mb" --seq_len="$SEQ_LEN" --gradient_accumulation_steps="$accum" \
    --max_grad_norm="$norm" --steps="${STEPS:-2}" --warmup="${WARMUP:-2}" --data=random --json \
    --schedule="$schedule" --wave="$wave" --kernel_trace="$tmp/mt-$tag.json" "$@" \
    2> "$OUT/bench-$tag.log" | tee -a "$OUT/profile.jsonl"
  python3 deploy/torch-trace.py --preset "$preset" --micro-batch "$mb" --accum "$accum" \
    --seq "$SEQ_LEN" --ckpt $cflag --out "$tmp/pt-$tag.json" > "$OUT/torch-$tag.log" 2>&1 ||
    tail -5 "$OUT/torch-$tag.log"
  traces=("megatrain=$tmp/mt-$tag.json:$tokens" "pytorch=$tmp/pt-$tag.json:$tokens")
  if [ "${COMPILED:-1}" = 1 ]; then
    python3 deploy/torch-trace.py --preset "$preset" --micro-batch "$mb" --accum "$accum" \
      --seq "$SEQ_LEN" --ckpt $cflag --compile --out "$tmp/pc-$tag.json" \
      > "$OUT/torch-compiled-$tag.log" 2>&1 || tail -5 "$OUT/torch-compiled-$tag.log"
    traces+=("compiled=$tmp/pc-$tag.json:$tokens")
  fi
  python3 deploy/kernel-summary.py "${traces[@]}" --top 25 --by_op 25 | tee "$OUT/profile-$tag.txt"
  if [ "${KEEP_TRACES:-0}" = 1 ]; then
    gzip -c "$tmp/mt-$tag.json" > "$OUT/mt-$tag.json.gz" 2>/dev/null
    gzip -c "$tmp/pt-$tag.json" > "$OUT/pt-$tag.json.gz" 2>/dev/null
  fi
done
rm -rf "$tmp"
mkdir -p "$RESULTS"
tar czf "$RESULTS/profile.tgz" -C "$OUT" .
