#!/usr/bin/env bash
# Launch gaps of one measured step (deploy/trace-gaps.py) for MegaTrain and
# for resident PyTorch at the same configuration, one call on a GPU
# machine; megatrain-bench must be built (deploy/gpu-build.sh).
#
#   deploy/gpu-trace-gaps.sh "llama-1b:1:8:1:layer-major:8" [extra megatrain-bench flags...]
# Configuration as deploy/gpu-speed.sh's. Environment: BUILD_DIR
# (build-gpu), SEQ_LEN (2048). Output on stdout and under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
IFS=: read -r preset mb accum clip schedule wave <<<"$1"
shift
schedule=${schedule:-auto}; wave=${wave:-0}
norm=0; cflag=""
if [ "$clip" = 1 ]; then norm=1.0; cflag=--clip; fi
tag="$preset-$mb-$accum-$clip-$schedule-$wave"
tmp=$(mktemp -d)
"$BUILD_DIR"/engine/megatrain-bench --model="$preset" --device=cuda --compute_dtype=bf16 \
  --micro_batch="$mb" --seq_len="${SEQ_LEN:-2048}" --gradient_accumulation_steps="$accum" \
  --max_grad_norm="$norm" --steps=2 --warmup=2 --data=random --json --schedule="$schedule" \
  --wave="$wave" --kernel_trace="$tmp/mt.json" "$@" 2> "$OUT/gaps-bench-$tag.log" |
  tail -1 > "$OUT/gaps-bench-$tag.json"
echo "== megatrain $tag: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(f"{j[\"tokens_per_s\"]:,.0f} tokens/s, step {j[\"step_seconds\"]:.3f} s")' "$OUT/gaps-bench-$tag.json")"
python3 deploy/trace-gaps.py "$tmp/mt.json" | tee "$OUT/gaps-mt-$tag.txt"
python3 deploy/torch-trace.py --preset "$preset" --micro-batch "$mb" --accum "$accum" \
  --seq "${SEQ_LEN:-2048}" --ckpt $cflag --out "$tmp/pt.json" > "$OUT/gaps-torch-$tag.log" 2>&1 ||
  tail -5 "$OUT/gaps-torch-$tag.log"
echo "== pytorch $tag"
python3 deploy/trace-gaps.py "$tmp/pt.json" | tee "$OUT/gaps-pt-$tag.txt"
rm -rf "$tmp"
