#!/usr/bin/env bash
# Streamed models on one call (issues 19 and 33): each RUNS entry
# MODEL:ACCUM[:DEVICES[:CLIP[:FLAGS]]] trains 8 x 2048 micro-batches,
# clipping at CLIP (default 1.0; FLAGS: further bench flags joined by '+'),
# `--weight_stream=fp32` (the mode that fits the host beside the model at
# 16 bytes/param), and prints tokens/s, MFU against both the H100/H200 spec
# peak (989 TFLOP/s dense bf16, megatrain-bench's default) and the bf16
# 8192^3 matmul rate measured in the same call, where the step's time
# went (optimizer exposed, GPU idle) and the host and device memory.
# MODEL is a preset or a public shape of deploy/public-shapes.sh
# (qwen2.5-14b, qwen3-32b-24l, mistral-small-24b, qwen3-30b-a3b-12l /
# -24l). JSON lines go
# to $OUT/streamed.jsonl.
#
#   RUNS="qwen2.5-14b:4 qwen2.5-14b:1" deploy/gpu-streamed-check.sh [extra bench flags...]
#   RUNS="qwen3-30b-a3b-12l:4:1:0:--gradient_landing=ring" deploy/gpu-streamed-check.sh
# Environment: RUNS (default llama-8b:4), BUILD_DIR (build-gpu), SKIP_BUILD
# (0), STEPS (2), WARMUP (1), LIMIT (seconds one run may take,
# default 400; a run still going is a hang: its stacks are printed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source deploy/gpu-bounded.sh
source deploy/public-shapes.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-streamed.log" 2>&1 || { tail -30 "$OUT/build-streamed.log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
peak=$(python3 deploy/matmul-peak.py)
echo "bf16 matmul 8192^3: $peak TFLOP/s" | tee -a "$OUT/device.txt"
write_public_shapes
# Never more than the host has (the bench refuses before allocating).
budget=$(awk '/MemAvailable/ {printf "%d", ($2 - 6 * 1048576) * 1024}' /proc/meminfo)
: > "$OUT/streamed.jsonl"
i=0
for run in ${RUNS:-llama-8b:4}; do
  i=$((i + 1))
  IFS=: read -r model accum devices clip flags <<< "$run"
  IFS=+ read -r -a run_flags <<< "${flags:-}"
  "$BUILD_DIR/engine/megatrain-bench" --model="$(public_shape_dir "$model")" --device=cuda \
    --devices="${devices:-1}" --compute_dtype=bf16 --micro_batch=8 --seq_len=2048 \
    --gradient_accumulation_steps="$accum" --max_grad_norm="${clip:-1.0}" --weight_stream=fp32 \
    --steps="${STEPS:-2}" --warmup="${WARMUP:-1}" --data=random --json \
    --host_memory_budget="$budget" "${run_flags[@]}" "$@" > "$OUT/streamed-$i.json" 2> "$OUT/streamed-$i.err" &
  wait_bounded $! "${LIMIT:-400}" "$run"
  status=$?
  line=$(tail -1 "$OUT/streamed-$i.json")
  echo "$line" >> "$OUT/streamed.jsonl"
  echo "[$(( $(date +%s) - start )) s] $run: exit $status"
  python3 - "$peak" "$model${flags:+ $flags}" "$line" <<'PY' || tail -5 "$OUT/streamed-$i.err"
import json, sys
peak, model, j = float(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
f = j["footprint"]
alloc = j["rss_allocated_peak_bytes"]
step = j["step_seconds"]
print(f"{model} x{j.get('devices', 1)} clip {j['max_grad_norm']} acc {j['gradient_accumulation_steps']}: "
      f"{j['tokens_per_s']:,.0f} tokens/s, step {step:.2f} s, {j['model_tflops']:.1f} "
      f"TFLOP/s = {100 * j['mfu']:.1f}% MFU of {j['peak_tflops']:.0f} spec, "
      f"{100 * j['model_tflops'] / peak:.1f}% of the measured {peak:.0f}; optimizer exposed "
      f"{j['optimizer_exposed_seconds']:.2f} s, GPU idle {j['gpu_idle_seconds']:.2f} s "
      f"({100 * j['gpu_idle_seconds'] / step:.1f}%), grad wait {j['grad_wait_seconds']:.2f} s, "
      f"compute {j['compute_seconds']:.2f} s, optimizer {j['optimizer_seconds']:.2f} s")
print(f"  {j['schedule_choice']}; resident layers {j['resident_layers']}"
      + (f"; {j['params_active'] / 1e9:.2f} B active parameters (MFU on {j.get('mfu_params')})" if j.get('params_active') else ""))
print(f"  host: held {j['host_bytes_per_param']:.2f} B/param, footprint {f['bytes_per_param']:.2f}, "
      f"peak RSS {j['rss_peak_bytes_per_param']:.2f} ({100 * (j['rss_peak_bytes'] / f['total'] - 1):+.1f}%), "
      f"allocated (anon+shmem) peak {alloc / 1e9:.1f} GB ({100 * (alloc / f['total'] - 1):+.1f}%); "
      f"peak GPU {j['peak_gpu_bytes'] / 1e9:.1f} GB; H2D {j.get('h2d_bytes', 0) / 1e9:.1f} GB/step")
PY
done
echo "total: $(( $(date +%s) - start )) s"
