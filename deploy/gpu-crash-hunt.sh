#!/usr/bin/env bash
# Runs one megatrain-bench configuration RUNS_N times (default 3) and prints,
# for each run, its exit code and, after a crash, the stack that absl's
# failure signal handler wrote (or gdb's, where gdb is installed). For
# crashes seen once in a table of deploy/gpu-dp-scale.sh. A run still going
# after RUN_LIMIT seconds (default 150) gets its threads' stacks from gdb
# (where installed) and is stopped.
#   PHASES=build deploy/gpu-crash-hunt.sh --model=llama-3b --devices=4 ...
# PHASES=first-use (with build: builds it too) first runs first_use_cuda_test
# (Note [Serial first use] in engine/dist/first_use.h) on every GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
source deploy/gpu-bounded.sh
BUILD_DIR=${BUILD_DIR:-build-gpu}
work=${WORK:-/tmp/crash-hunt}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ " ${PHASES:-} " == *" build "* ]]; then
  targets=(megatrain-bench)
  [[ " ${PHASES:-} " == *" first-use "* ]] && targets+=(first_use_cuda_test)
  bash deploy/gpu-build.sh "$BUILD_DIR" "${targets[@]}" > "$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# Whether this LibTorch guards its cuBLAS workspace maps (std::maps that
# every rank thread inserts into on its first GEMM on a new stream).
torch_include=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)/include
echo "torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null): cuBLAS workspace maps:" \
  "$(grep -hoE 'WorkspaceMapWithMutex|thread_local[^;]*Workspace[^;]*' \
    "$torch_include/ATen/cuda/CUDAContextLight.h" 2>/dev/null | sort -u | tr '\n' ' ')"
echo "built; each run bounded by RUN_LIMIT=${RUN_LIMIT:-150} s"
if [[ " ${PHASES:-} " == *" first-use "* ]]; then
  "$BUILD_DIR/tests/first_use_cuda_test" > "$work/first-use.log" 2>&1 &
  wait_bounded $! "${RUN_LIMIT:-150}" "first_use_cuda_test"
  echo "first_use_cuda_test: exit $? $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) ' "$work/first-use.log" | tr '\n' ' ')"
fi
for i in $(seq "${RUNS_N:-3}"); do
  start=$(date +%s)
  "$BUILD_DIR/engine/megatrain-bench" --json "$@" > "$work/run-$i.json" 2> "$work/run-$i.log" &
  wait_bounded $! "${RUN_LIMIT:-150}" "run $i"
  rc=$?
  echo "run $i: exit $rc in $(( $(date +%s) - start )) s $(grep -oE '"tokens_per_s":[0-9.]*' "$work/run-$i.json")"
  if [ "$rc" -ne 0 ]; then
    grep -E '^\*\*\*|^PC:|error' "$work/run-$i.log" | head -8
    # glibc's frames; the bench's own as file:line (addr2line).
    sed -n '/stack by glibc/,$p' "$work/run-$i.log" | head -45 | while read -r line; do
      if [[ "$line" =~ megatrain-bench\(\+(0x[0-9a-f]+)\) ]]; then
        echo "  $(addr2line -Cfpe "$BUILD_DIR/engine/megatrain-bench" "${BASH_REMATCH[1]}" 2>/dev/null |
          sed 's|.*/megatrain/||' | cut -c1-150)"
      else
        echo "  ${line##*/}" | cut -c1-150
      fi
    done
    break
  fi
done
