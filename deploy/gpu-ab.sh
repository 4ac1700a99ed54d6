#!/usr/bin/env bash
# Speed A/B in one call on a GPU machine: builds megatrain-bench from this
# tree (B) and from another tree (A, a `git archive` tarball with prefix
# before/, e.g. made with
#   git archive <commit> --prefix=before/ -- . ':!tests/testdata' | gzip > shared/before.tar.gz
# ), then runs each configuration A, B, A, B, ... REPEATS times, and resident
# PyTorch once per configuration (eager, and compiled unless COMPILED=0), all
# in the same call (docs/performance.md, "How the numbers are made"). Prints
# deploy/bench-compare.py's table per build.
#
#   deploy/gpu-ab.sh shared/before.tar.gz "llama-1b:8:1:0 llama-1b:8:1:1"
#
# Configurations as in deploy/gpu-speed.sh (PRESET:MICRO_BATCH:ACCUM:CLIP);
# the baseline as there (deploy/family_baseline.py for non-Llama presets).
# Environment: SEQ_LEN (2048), STEPS (4), WARMUP (2), REPEATS (2), COMPILED (1).
# Results: $OUT/ab-A.jsonl, $OUT/ab-B.jsonl, $OUT/ab.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
tarball=$1
configs=$2
SEQ_LEN=${SEQ_LEN:-2048}
REPEATS=${REPEATS:-2}
start=$(date +%s)
rm -rf /tmp/ab && mkdir -p /tmp/ab && tar xzf "$tarball" -C /tmp/ab || exit 1
cp -r .deps /tmp/ab/before/ 2>/dev/null || true
(cd /tmp/ab/before && MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench \
  > "$OUT/build-A.log" 2>&1) &
MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench > "$OUT/build-B.log" 2>&1
wait
for b in /tmp/ab/before/build-gpu build-gpu; do
  [ -x "$b/engine/megatrain-bench" ] || { echo "build failed: $b"; tail -20 "$OUT"/build-*.log; exit 1; }
done
echo "builds: $(( $(date +%s) - start )) s"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bench() {  # bench BINARY PRESET MB ACCUM CLIP >> jsonl
  local norm=0; [ "$5" = 1 ] && norm=1.0
  "$1" --model="$2" --device=cuda --compute_dtype=bf16 --micro_batch="$3" --seq_len="$SEQ_LEN" \
    --gradient_accumulation_steps="$4" --max_grad_norm="$norm" --steps="${STEPS:-4}" \
    --warmup="${WARMUP:-2}" --data=random --json 2>/dev/null
}
for c in $configs; do
  IFS=: read -r preset mb accum clip <<<"$c"
  for r in $(seq "$REPEATS"); do
    bench /tmp/ab/before/build-gpu/engine/megatrain-bench "$preset" "$mb" "$accum" "$clip" | tee -a "$OUT/ab-A.jsonl"
    bench build-gpu/engine/megatrain-bench "$preset" "$mb" "$accum" "$clip" | tee -a "$OUT/ab-B.jsonl"
  done
  cflag=""; [ "$clip" = 1 ] && cflag=--clip
  bmb=$mb; [ "$accum" != 1 ] && bmb=8
  case "$preset" in  # as deploy/gpu-speed.sh: transformers for the other families
    llama-*) base=$(python3 deploy/torch_baselines.py --mode resident --preset "$preset" \
      --micro-batch "$bmb" --seq "$SEQ_LEN" --ckpt $cflag 2>&1 | tail -n 1)
      if [ "${COMPILED:-1}" = 1 ]; then  # the compiled baseline too (bench-compare prints both)
        base="$base
$(python3 deploy/torch_baselines.py --mode resident --preset "$preset" \
          --micro-batch "$bmb" --seq "$SEQ_LEN" --ckpt $cflag --compile 2>&1 | tail -n 1)"
      fi ;;
    *) base=$(python3 deploy/family_baseline.py --preset "$preset" --micro-batch "$bmb" \
      --seq "$SEQ_LEN" $cflag 2>&1 | tail -n 1) ;;
  esac
  echo "$base" | tee -a "$OUT/ab-A.jsonl" >> "$OUT/ab-B.jsonl"
done
{ echo "A (before):"; python3 deploy/bench-compare.py "$OUT/ab-A.jsonl"
  echo "B (this tree):"; python3 deploy/bench-compare.py "$OUT/ab-B.jsonl"; } | tee "$OUT/ab.txt"
echo "total: $(( $(date +%s) - start )) s"
