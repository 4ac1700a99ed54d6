#!/usr/bin/env bash
# memory.weight_stream host_cast against fp32 on one GPU, in one call:
# llama-8b, bf16, clipping at 1.0, each shape run with --weight_stream=fp32
# then --weight_stream=host_cast (Note [Host cast] in
# engine/step/host_cast.h). Prints per run tokens/s, the step's weight H2D
# bytes (h2d_weight_bytes: host_cast should be half of fp32's), the H2D
# busy time, the optimizer's exposed time and the GPU idle time, then the
# tokens/s ratio host_cast / fp32 per shape. JSON lines go to
# $OUT/host-cast.jsonl.
#
#   deploy/gpu-host-cast-check.sh [extra megatrain-bench flags...]
# Environment: BUILD_DIR (build-gpu), SKIP_BUILD (0), STEPS (4), WARMUP (2), MODEL (llama-8b),
# SHAPES (one shape per line of megatrain-bench flags; default: 8 x 2048 x
# accumulation 4 with the auto resident layers, and the transfer-bound
# 1 x 2048 x accumulation 8 with every block streamed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-host-cast.log" 2>&1 || { tail -30 "$OUT/build-host-cast.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
DEFAULT_SHAPES="--micro_batch=8 --gradient_accumulation_steps=4
--micro_batch=1 --gradient_accumulation_steps=8 --resident_layers=0 --resident_embedding=0"
SHAPES=${SHAPES:-$DEFAULT_SHAPES}
: > "$OUT/host-cast.jsonl"
i=0
while IFS= read -r shape; do
  for stream in fp32 host_cast; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    line=$("$BUILD_DIR/engine/megatrain-bench" --model="${MODEL:-llama-8b}" --device=cuda --compute_dtype=bf16 \
      --seq_len=2048 --max_grad_norm=1.0 --steps="${STEPS:-4}" --warmup="${WARMUP:-2}" \
      --data=random --json $shape --weight_stream="$stream" "$@" 2> "$OUT/host-cast-$i.err" | tail -1)
    echo "$line" >> "$OUT/host-cast.jsonl"
    python3 - "$shape" "$line" <<'PY' || tail -5 "$OUT/host-cast-$i.err"
import json, sys
shape, j = sys.argv[1], json.loads(sys.argv[2])
print(f"[{shape}] {j['weight_stream']}: {j['tokens_per_s']:,.0f} tokens/s, step "
      f"{j['step_seconds']:.2f} s, weight H2D {j['h2d_weight_bytes'] / 1e9:.2f} GB of "
      f"{j['h2d_bytes'] / 1e9:.2f} GB, H2D busy {j['h2d_seconds']:.2f} s, optimizer exposed "
      f"{j['optimizer_exposed_seconds']:.2f} s, gates {j['gate_wait_seconds']:.2f} s, GPU idle "
      f"{j['gpu_idle_seconds']:.2f} s, host {j['host_bytes_per_param']:.2f} B/param, "
      f"resident layers {j['resident_layers']}")
PY
  done
done <<< "$SHAPES"
python3 - "$OUT/host-cast.jsonl" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
for fp32, cast in zip(runs[0::2], runs[1::2]):
    print(f"host_cast / fp32: tokens/s {cast['tokens_per_s'] / fp32['tokens_per_s']:.3f}x, "
          f"weight H2D bytes {cast['h2d_weight_bytes'] / max(fp32['h2d_weight_bytes'], 1):.3f}x")
PY
