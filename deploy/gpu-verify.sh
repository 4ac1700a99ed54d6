#!/usr/bin/env bash
# One call on a GPU machine after a change to the engine: builds the engine's
# GPU-facing targets (deploy/gpu-build.sh, no server), runs the CUDA parity
# and trainer suites and the golden-file suites, then the checks against
# transformers (deploy/gpu-hf-check.sh). Logs go to one tarball,
# $OUT/verify-logs.tgz (the device tool returns at most 8 files); the summary
# is printed.
#
#   deploy/gpu-verify.sh
# Environment: TESTS (the test binaries to run), HF_CHECK (1: run
# gpu-hf-check.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
logs=$(mktemp -d /tmp/megatrain-verify.XXXXXX)
mkdir -p "$OUT"
TESTS=${TESTS:-"executor_parity_cuda_test executor_parity_test trainer_test training_job_test moe_cuda_test hf_parity_test moe_test step_plan_test"}
start=$(date +%s)
# shellcheck disable=SC2086
MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench megatrain-logits $TESTS \
  > "$logs/build.log" 2>&1
rc=$?
echo "build: rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "error|Error" "$logs/build.log" | head -30; tar czf "$OUT/verify-logs.tgz" -C "$logs" .; exit 1; fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
status=0
for t in $TESTS; do
  timeout 300 "build-gpu/tests/$t" --gtest_brief=1 > "$logs/$t.log" 2>&1
  trc=$?
  [ $trc -ne 0 ] && status=1
  echo "$t: rc=$trc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$logs/$t.log" | head -10
done
if [ "${HF_CHECK:-1}" = 1 ]; then
  OUT="$logs" bash deploy/gpu-hf-check.sh > "$logs/hf-check.log" 2>&1
  hrc=$?
  [ $hrc -ne 0 ] && status=1
  echo "gpu-hf-check: rc=$hrc"
  grep '"check"' "$logs/hf-check.log" | cut -c1-220
fi
tar czf "$OUT/verify-logs.tgz" -C "$logs" .
echo "total: $(( $(date +%s) - start )) s"
exit $status
