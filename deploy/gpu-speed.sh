#!/usr/bin/env bash
# One call on a GPU machine: builds megatrain-bench (deploy/gpu-build.sh) and
# measures a matrix of configurations, each beside resident PyTorch
# (deploy/torch_baselines.py for Llama presets, eager and, with COMPILED=1,
# each decoder layer compiled; deploy/family_baseline.py, eager, for the other
# families) at the same clipping, in the same call. Prints
# deploy/bench-compare.py's table with the ratio to each baseline.
#
#   deploy/gpu-speed.sh "llama-1b:8:1:0 llama-1b:8:1:1 llama-3b:8:4:1:layer-major" [bench args...]
#
# Each configuration is PRESET:MICRO_BATCH:ACCUMULATION:CLIP[:SCHEDULE[:WAVE]]
# (CLIP 1 clips at 1.0 as a default job does, 0 does not; SCHEDULE auto
# (default), micro-batch-major or layer-major, passed as --schedule; WAVE the
# layer-major --wave, 0 = auto). The baseline runs once per preset,
# micro-batch and clipping, at micro-batch 8 for accumulation runs.
# Environment: SEQ_LEN (2048), STEPS (4), WARMUP (2), BUILD_DIR (build-gpu),
# SKIP_BUILD (0), BASELINE_ACCUM (0; 1: deploy/family_baseline.py accumulates
# the configuration's micro-batches per optimizer step too, --accum), COMPILED
# (1: also the compiled Llama baseline, `torch_baselines.py --compile`; 0 skips it).
# Results: $OUT/speed.jsonl, $OUT/speed.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
configs=${1:-"llama-1b:8:1:0 llama-1b:8:1:1"}
shift || true
SEQ_LEN=${SEQ_LEN:-2048}
BUILD_DIR=${BUILD_DIR:-build-gpu}
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    > "$OUT/build-$(basename "$BUILD_DIR").log" 2>&1 || { tail -30 "$OUT/build-$(basename "$BUILD_DIR").log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
declare -A baseline_done
for c in $configs; do
  IFS=: read -r preset mb accum clip schedule wave <<<"$c"
  schedule=${schedule:-auto}; wave=${wave:-0}
  case "$clip" in 1|1.0) clip=1 ;; esac  # "preset:8:4:1.0" reads as clip 1
  norm=0; [ "$clip" = 1 ] && norm=1.0
  "$BUILD_DIR"/engine/megatrain-bench --model="$preset" --device=cuda --compute_dtype=bf16 \
    --micro_batch="$mb" --seq_len="$SEQ_LEN" --gradient_accumulation_steps="$accum" \
    --max_grad_norm="$norm" --steps="${STEPS:-4}" --warmup="${WARMUP:-2}" --data=random --json \
    --schedule="$schedule" --wave="$wave" "$@" \
    2> "$OUT/bench-$preset-$mb-$accum-$clip-$schedule-$wave.log" | tee -a "$OUT/speed.jsonl"
  bmb=$mb; [ "$accum" != 1 ] && bmb=8
  key="$preset:$bmb:$clip"
  if [ -z "${baseline_done[$key]:-}" ]; then
    baseline_done[$key]=1
    cflag=""; [ "$clip" = 1 ] && cflag=--clip
    case "$preset" in
      llama-*)
        kinds=eager; [ "${COMPILED:-1}" = 1 ] && kinds="eager compiled"
        for kind in $kinds; do
          kflag=""; [ "$kind" = compiled ] && kflag=--compile
          python3 deploy/torch_baselines.py --mode resident --preset "$preset" \
            --micro-batch "$bmb" --seq "$SEQ_LEN" --ckpt $cflag $kflag 2>&1 | tail -n 1 | tee -a "$OUT/speed.jsonl"
        done ;;
      *)  # the other families' presets: transformers of the same shape
        aflag=""; [ "${BASELINE_ACCUM:-0}" = 1 ] && aflag="--accum $accum"
        python3 deploy/family_baseline.py --preset "$preset" --micro-batch "$bmb" --seq "$SEQ_LEN" \
          $cflag $aflag 2>&1 | tail -n 1 | tee -a "$OUT/speed.jsonl" ;;
    esac
  fi
done
python3 deploy/bench-compare.py "$OUT/speed.jsonl" | tee "$OUT/speed.txt"
echo "total: $(( $(date +%s) - start )) s"
