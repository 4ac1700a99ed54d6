#!/usr/bin/env bash
# One call on a GPU machine for issue 19's changes of 2026-11-24: builds
# megatrain-bench (deploy/gpu-build.sh, no server), then
#   1. the NVMe-tier teardown: a tiny model with --nvme_tier moments on
#      CUDA; it must exit 0, print the teardown markers and leave nothing
#      in the tier directory (it crashed at a null call after its last
#      step before: std::filesystem::remove_all from pip's libtorch.so);
#   2. host bytes per parameter without clipping (gradient ring, fp32
#      weight stream): llama-3b and llama-8b at 8 x 2048, accumulation 1,
#      beside admission's footprint (the JSON's footprint by kind) and the
#      process's peak RSS.
# Prints one line per run; the JSON lines go to $OUT/tier-check.jsonl.
#
#   deploy/gpu-tier-check.sh [NVME_DIR]   (default: a directory under /tmp)
# Environment: BUILD_DIR (build-gpu), SKIP_BUILD (0), MODELS ("llama-3b
# llama-8b"), CLIPS ("0"; "0 1" also runs each model with clipping,
# max_grad_norm 1 and the gradient arena), SKIP_TEARDOWN (0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
NVME_DIR=${1:-$(mktemp -d /tmp/megatrain-tier.XXXXXX)}
mkdir -p "$NVME_DIR"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-tier-check.log" 2>&1 || { tail -30 "$OUT/build-tier-check.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
BENCH="$BUILD_DIR/engine/megatrain-bench"
: > "$OUT/tier-check.jsonl"
status=0

# 1. Teardown of a tiered run on CUDA.
if [ "${SKIP_TEARDOWN:-0}" != 1 ]; then
"$BENCH" --model=tiny --device=cuda --steps=3 --warmup=1 --nvme_tier=moments \
  --nvme_dir="$NVME_DIR" --json > "$OUT/tier-teardown.json" 2> "$OUT/tier-teardown.err"
rc=$?
left=$(find "$NVME_DIR" -mindepth 1 | wc -l)
echo "teardown: rc=$rc, $(grep -c 'teardown' "$OUT/tier-teardown.err") teardown lines, last:" \
  "'$(tail -1 "$OUT/tier-teardown.err")', $left entries left in $NVME_DIR"
[ "$rc" = 0 ] && [ "$left" = 0 ] || status=1
tail -1 "$OUT/tier-teardown.json" >> "$OUT/tier-check.jsonl"
fi

# 2. Bytes per parameter, clipping off (ring) and, with CLIPS="0 1", on
# (arena).
for clip in ${CLIPS:-0}; do
for model in ${MODELS:-llama-3b llama-8b}; do
  landing=ring
  [ "$clip" = 0 ] || landing=arena
  line=$("$BENCH" --model="$model" --device=cuda --compute_dtype=bf16 --micro_batch=8 \
    --seq_len=2048 --gradient_accumulation_steps=1 --max_grad_norm="$clip" --weight_stream=fp32 \
    --gradient_landing=$landing --steps=2 --warmup=1 --data=random --json \
    2> "$OUT/bpp-$model-clip$clip.err" | tail -1)
  echo "$line" >> "$OUT/tier-check.jsonl"
  python3 - "$model clip $clip" "$line" <<'PY' || status=1
import json, sys
model, j = sys.argv[1], json.loads(sys.argv[2])
f = j["footprint"]
print(f"{model}: held {j['host_bytes_per_param']:.2f} B/param (store + staging), footprint "
      f"{f['bytes_per_param']:.2f} (grad {f['grad'] / j['params']:.2f}, staging "
      f"{f['staging'] / j['params']:.2f}, ring {f['gradient_ring'] / j['params']:.2f}), peak RSS "
      f"{j['rss_peak_bytes_per_param']:.2f} ({100 * (j['rss_peak_bytes'] / f['total'] - 1):+.1f}% "
      f"of the footprint; allocated (anon+shmem) peak "
      f"{100 * (j['rss_allocated_peak_bytes'] / f['total'] - 1):+.1f}%, file "
      f"{j['rss_file_bytes'] / 1e9:.2f} GB); {j['tokens_per_s']:,.0f} tokens/s, resident layers "
      f"{j['resident_layers']}, embedding {j['resident_embedding']}")
PY
done
done
exit $status
