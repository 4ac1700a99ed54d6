#!/usr/bin/env bash
# Issue 19's single-GPU 8B target on one call: llama-8b at micro-batch
# 8 x 2048, accumulation 4, clipping at 1.0, `--weight_stream=fp32` (the
# mode that fits a 125 GiB host), its MFU against both the H100/H200 spec
# peak (989 TFLOP/s dense bf16, megatrain-bench's default) and the bf16
# 8192^3 matmul rate measured in the same call (issue 6's convention,
# deploy/gpu-8b-check.sh). Prints one summary line per run; JSON lines go
# to $OUT/8b-clip.jsonl.
#
#   deploy/gpu-8b-clip-check.sh [extra megatrain-bench flags...]
# Environment: BUILD_DIR (build-gpu), SKIP_BUILD (0), STEPS (2), WARMUP (1),
# ACCUM (4), VARIANTS (one run per line of extra flags; default one run
# with none).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-8b-clip.log" 2>&1 || { tail -30 "$OUT/build-8b-clip.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
peak=$(python3 deploy/matmul-peak.py)
echo "bf16 matmul 8192^3: $peak TFLOP/s" | tee -a "$OUT/device.txt"
: > "$OUT/8b-clip.jsonl"
VARIANTS=${VARIANTS:-" "}
i=0
while IFS= read -r variant; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  line=$("$BUILD_DIR/engine/megatrain-bench" --model=llama-8b --device=cuda --compute_dtype=bf16 \
    --micro_batch=8 --seq_len=2048 --gradient_accumulation_steps="${ACCUM:-4}" \
    --max_grad_norm=1.0 --weight_stream=fp32 --steps="${STEPS:-2}" --warmup="${WARMUP:-1}" \
    --data=random --json $variant "$@" 2> "$OUT/8b-clip-$i.err" | tail -1)
  echo "$line" >> "$OUT/8b-clip.jsonl"
  python3 - "$peak" "$variant" "$line" <<'PY' || tail -5 "$OUT/8b-clip-$i.err"
import json, sys
peak, variant, j = float(sys.argv[1]), sys.argv[2].strip(), json.loads(sys.argv[3])
f = j["footprint"]
alloc = j["rss_allocated_peak_bytes"]
print(f"llama-8b clip 1 acc {j['gradient_accumulation_steps']} [{variant or 'defaults'}]: "
      f"{j['tokens_per_s']:,.0f} tokens/s, step {j['step_seconds']:.2f} s, {j['model_tflops']:.1f} "
      f"TFLOP/s = {100 * j['mfu']:.1f}% MFU of {j['peak_tflops']:.0f} spec, "
      f"{100 * j['model_tflops'] / peak:.1f}% of the measured {peak:.0f}; optimizer exposed "
      f"{j['optimizer_exposed_seconds']:.2f} s, GPU idle {j['gpu_idle_seconds']:.2f} s, grad wait "
      f"{j['grad_wait_seconds']:.2f} s, compute {j['compute_seconds']:.2f} s, optimizer "
      f"{j['optimizer_seconds']:.2f} s; {j['schedule_choice']}")
print(f"  host: held {j['host_bytes_per_param']:.2f} B/param, footprint {f['bytes_per_param']:.2f}, "
      f"peak RSS {j['rss_peak_bytes_per_param']:.2f} ({100 * (j['rss_peak_bytes'] / f['total'] - 1):+.1f}%), "
      f"allocated (anon+shmem) peak {alloc / 1e9:.1f} GB ({100 * (alloc / f['total'] - 1):+.1f}%), file "
      f"{j['rss_file_bytes'] / 1e9:.2f} GB; peak GPU {j['peak_gpu_bytes'] / 1e9:.1f} GB")
PY
done <<< "$VARIANTS"
