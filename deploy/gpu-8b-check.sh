#!/usr/bin/env bash
# A model that cannot be resident (issue #6): llama-8b streamed on one GPU of
# a machine with >= 256 GiB of host memory, its model FLOPs utilisation
# against the bf16 matmul rate measured in the same call; plus the time to
# allocate and register a 100 GiB pinned host buffer. Output under $OUT.
#   deploy/gpu-8b-check.sh        # MICRO_BATCH (8) SEQ_LEN (2048) STEPS (3) WARMUP (2)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"
MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
peak=$(python3 deploy/matmul-peak.py)
echo "bf16 matmul 8192^3: $peak TFLOP/s" | tee -a "$OUT/device.txt"
build-gpu/engine/megatrain-bench --pinned_gib=${PINNED_GIB:-100} | tee "$OUT/pinned.json"
build-gpu/engine/megatrain-bench --model=llama-8b --device=cuda --compute_dtype=bf16 \
  --micro_batch="${MICRO_BATCH:-8}" --seq_len="${SEQ_LEN:-2048}" --steps="${STEPS:-3}" \
  --warmup="${WARMUP:-2}" --max_grad_norm=0 --data=random --peak_tflops="$peak" --json \
  2> "$OUT/bench-8b.log" | tee "$OUT/bench-8b.json"
tail -n 4 "$OUT/bench-8b.log"
