#!/usr/bin/env bash
# One call on a GPU machine: build (deploy/gpu-build.sh), run the GPU tests,
# then measure megatrain-bench beside the PyTorch baselines in the same run
# (deploy/torch_baselines.py: resident, eager and each decoder layer compiled).
# Results go to $OUT (default ./gpu-out): build.log, tests.log, bench.jsonl,
# compare.txt (deploy/bench-compare.py: ratios vs eager and vs compiled).
#
#   deploy/gpu-check.sh [presets...]      # default: llama-1b
# Environment: MICRO_BATCH (8), SEQ_LEN (2048), STEPS (4), WARMUP (2),
# BASELINE (1: also run the resident PyTorch baseline), COMPILED (1: also the
# compiled baseline, `--compile`; 0 skips it), SKIP_TESTS (0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(llama-1b)
MICRO_BATCH=${MICRO_BATCH:-8}
SEQ_LEN=${SEQ_LEN:-2048}
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-2}

nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
  --format=csv | tee "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"
free -g | tee -a "$OUT/device.txt"
{ lscpu | grep -E "Model name|Socket|NUMA|Thread|L3"; cat /sys/kernel/mm/transparent_hugepage/enabled; } \
  | tee -a "$OUT/device.txt"
# Host memory bandwidth as the CPU optimizer sees it: an fp32 triad over
# 3 x 1 GiB with all cores (torch's CPU kernels), GB/s counting 12 B/element.
python3 - <<'PY' 2>&1 | tee -a "$OUT/device.txt"
import time, torch
torch.set_num_threads(torch.get_num_threads())
n = 1 << 28
a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
best = 0
for _ in range(5):
    t = time.perf_counter(); torch.add(a, b, alpha=2.0, out=c); dt = time.perf_counter() - t
    best = max(best, 12 * n / dt / 1e9)
print(f"host triad bandwidth: {best:.1f} GB/s ({torch.get_num_threads()} threads)")
PY

start=$(date +%s)
MEGATRAIN_BUILD_SERVER=${MEGATRAIN_BUILD_SERVER:-OFF} bash deploy/gpu-build.sh build-gpu \
  megatrain-bench megatrain-logits executor_parity_cuda_test executor_parity_test adamw_test trainer_test \
  > "$OUT/build.log" 2>&1
rc=$?
echo "build: rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit $rc; fi
export LD_LIBRARY_PATH=/opt/megatrain-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  build-gpu/tests/executor_parity_cuda_test > "$OUT/tests.log" 2>&1
  echo "executor_parity_cuda_test: rc=$?"; grep -E "PASSED|FAILED|Failure|Expected|actual" "$OUT/tests.log" | head -20
  build-gpu/tests/executor_parity_test >> "$OUT/tests.log" 2>&1; echo "executor_parity_test: rc=$?"
  build-gpu/tests/trainer_test >> "$OUT/tests.log" 2>&1; echo "trainer_test: rc=$?"
fi

if [ "${OPTIMIZER_BENCH:-1}" = 1 ]; then
  echo "== CPU AdamW, 500M parameters"
  build-gpu/engine/megatrain-bench --optimizer_only --params=500000000 2>&1 | tail -n 3 | tee -a "$OUT/optimizer.txt"
fi

for preset in "${presets[@]}"; do
  echo "== megatrain-bench $preset bf16 ${MICRO_BATCH}x${SEQ_LEN}"
  build-gpu/engine/megatrain-bench --model="$preset" --device=cuda --compute_dtype=bf16 \
    --micro_batch="$MICRO_BATCH" --seq_len="$SEQ_LEN" --steps="$STEPS" --warmup="$WARMUP" \
    --data=random --json ${BENCH_ARGS:-} 2> "$OUT/bench-$preset.log" | tee -a "$OUT/bench.jsonl"
  tail -n 4 "$OUT/bench-$preset.log"
  if [ "${BASELINE:-1}" = 1 ]; then
    # The same clipping as the bench run (BENCH_ARGS may set --max_grad_norm).
    cflag=--clip
    case " ${BENCH_ARGS:-} " in *" --max_grad_norm=0 "*|*" --max_grad_norm=0.0 "*) cflag="" ;; esac
    kinds=eager; [ "${COMPILED:-1}" = 1 ] && kinds="eager compiled"
    for kind in $kinds; do
      kflag=""; [ "$kind" = compiled ] && kflag=--compile
      echo "== torch resident $preset $kind"
      python3 deploy/torch_baselines.py --mode resident --preset "$preset" \
        --micro-batch "$MICRO_BATCH" --seq "$SEQ_LEN" --ckpt $cflag $kflag 2>&1 | tail -n 1 | tee -a "$OUT/bench.jsonl"
    done
  fi
done
python3 deploy/bench-compare.py "$OUT/bench.jsonl" | tee "$OUT/compare.txt"
echo "total: $(( $(date +%s) - start )) s"
