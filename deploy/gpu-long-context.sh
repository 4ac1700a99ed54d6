#!/usr/bin/env bash
# Long-context sweep on a GPU machine (docs/performance.md, "Long context"):
# megatrain-bench at micro-batch 1 with growing sequence lengths, saved
# layer inputs offloaded to pinned host memory (--offload_activations,
# Note [Activation offload] in engine/step/executor.h), until a length fails
# (device or host out of memory) or the time budget is spent. The first
# length also runs without offload, to show what offload saves.
#
#   deploy/gpu-long-context.sh            # after deploy/gpu-build.sh build-gpu megatrain-bench
# Environment: PRESET (llama-1b), DEVICE (cuda; cpu for a smoke test), SEQS ("32768 65536 131072 262144"),
# BUDGET_S (seconds after which no new length starts; 300), COMPARE (1: the
# first length also without offload; 0: skip that), OFFLOAD (1: every
# length with --offload_activations; 0: every length with the saved inputs
# on the device, --activations=device, and no comparison run), EXTRA
# (more megatrain-bench flags for every run, e.g. the memory modes),
# BUILD_DIR (build-gpu), OUT (./gpu-out). Writes $OUT/long-context.jsonl
# (one bench JSON line per run that finished) and $OUT/long-context.log.
# deploy/gpu-long-context-8b.sh runs llama-8b through it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PRESET=${PRESET:-llama-1b}
DEVICE=${DEVICE:-cuda}
SEQS=${SEQS:-32768 65536 131072 262144}
BUDGET_S=${BUDGET_S:-300}
BUILD_DIR=${BUILD_DIR:-build-gpu}
bench="$BUILD_DIR/engine/megatrain-bench"
[ -x "$bench" ] || { echo "gpu-long-context: $bench missing; run deploy/gpu-build.sh first" >&2; exit 2; }
start=$(date +%s)

run() {  # run <seq> <steps> <warmup> [extra flags...]
  local seq=$1 steps=$2 warmup=$3
  shift 3
  local t0=$(date +%s)
  "$bench" --model="$PRESET" --device="$DEVICE" --compute_dtype=bf16 --micro_batch=1 --seq_len="$seq" \
    --steps="$steps" --warmup="$warmup" --data=random --max_grad_norm=0 --json ${EXTRA:-} "$@" \
    > "$OUT/lc-run.json" 2>> "$OUT/long-context.log"
  local rc=$?
  if [ $rc -eq 0 ]; then cat "$OUT/lc-run.json" >> "$OUT/long-context.jsonl"; fi
  echo "seq_len $seq $*: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || tail -n 3 "$OUT/long-context.log"
  return $rc
}

first=1
for seq in $SEQS; do
  if [ $(( $(date +%s) - start )) -gt "$BUDGET_S" ]; then
    echo "seq_len $seq: not started (time budget of $BUDGET_S s spent)"
    break
  fi
  # Short lengths: 2 measured steps after a warm-up; long ones: 1 step.
  if [ "$seq" -le 65536 ]; then steps=2; warmup=1; else steps=1; warmup=0; fi
  if [ "${OFFLOAD:-1}" = 0 ]; then
    run "$seq" "$steps" "$warmup" --activations=device || break
    continue
  fi
  if [ $first = 1 ] && [ "${COMPARE:-1}" = 1 ]; then
    run "$seq" "$steps" "$warmup" || true   # without offload, for comparison
    first=0
  fi
  run "$seq" "$steps" "$warmup" --offload_activations || break
done

python3 - "$OUT/long-context.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except FileNotFoundError:
    rows = []
print("| seq_len | offload | tokens/s | step s | model TFLOP/s | peak GPU GiB | peak RSS GiB | H2D GB/step | D2H GB/step |")
print("|---|---|---|---|---|---|---|---|---|")
def offloaded(r):
    return r.get('activations') == 'host' or bool(r.get('offload_activations'))
for r in rows:
    print(f"| {r['seq_len']} | {'yes' if offloaded(r) else 'no'} | "
          f"{r['tokens_per_s']:,.0f} | {r['step_seconds']:.2f} | {r['model_tflops']:.0f} | "
          f"{r['peak_gpu_bytes'] / 2**30:.1f} | {r.get('rss_peak_bytes', 0) / 2**30:.1f} | "
          f"{r['h2d_bytes'] / 1e9:.2f} | {r['d2h_bytes'] / 1e9:.2f} |")
done = [r['seq_len'] for r in rows if offloaded(r)]
print(f"longest sequence trained with offload: {max(done) if done else 'none'}")
done = [r['seq_len'] for r in rows if not offloaded(r)]
print(f"longest sequence trained without offload: {max(done) if done else 'none'}")
PY
