#!/usr/bin/env bash
# Runs one megatrain-bench configuration RUNS_N times (default 3) and prints,
# for each run, its exit code and, after a crash, the stack that absl's
# failure signal handler wrote (or gdb's, where gdb is installed). For
# crashes seen once in a table of deploy/gpu-dp-scale.sh.
#   PHASES=build deploy/gpu-crash-hunt.sh --model=llama-3b --devices=4 ...
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
work=${WORK:-/tmp/crash-hunt}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ " ${PHASES:-} " == *" build "* ]]; then
  bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench > "$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; exit 1; }
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
for i in $(seq "${RUNS_N:-3}"); do
  start=$(date +%s)
  "$BUILD_DIR/engine/megatrain-bench" --json "$@" > "$work/run-$i.json" 2> "$work/run-$i.log"
  rc=$?
  echo "run $i: exit $rc in $(( $(date +%s) - start )) s $(grep -oE '"tokens_per_s":[0-9.]*' "$work/run-$i.json")"
  if [ "$rc" -ne 0 ]; then
    grep -vE '^megatrain-bench: (footprint|schedule|[0-9]+ devices)' "$work/run-$i.log" |
      grep -E '\*\*\*|@ |SIG|error|Error' | head -60
  fi
done
