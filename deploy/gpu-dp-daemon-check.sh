#!/usr/bin/env bash
# A data-parallel job through megatraind on 2 GPUs (issue 21), run by
# deploy/gpu-dp-check.sh after its build (megatraind, megatrain):
#   * megatraind on cuda:0,cuda:1; the tiny example (bf16) with
#     train.devices 2 and gradient_accumulation_steps 2 runs to SUCCEEDED
#     (DP_JOB PASS), its progress lines showing "tok/s (2 devices, N each)";
#   * /metrics: megatrain_tokens_per_second on both GPUs and
#     megatrain_job_tokens_per_second under cuda:0 (DP_METRICS PASS);
#   * a job asking for 3 devices is refused at submission with
#     RESOURCE_EXHAUSTED naming train.devices (DP_REFUSAL PASS).
#
#   deploy/gpu-dp-daemon-check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
state=$(mktemp -d /tmp/megatraind-dp.XXXXXX)
mkfifo "$state/ready"
"$BUILD_DIR"/server/megatraind --state_dir="$state" --device=cuda:0,cuda:1 \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 >"$state/ready" 2>"$OUT/dp-daemon.log" &
pid=$!
IFS= read -r -t 120 line <"$state/ready" || { echo "daemon did not start"; tail "$OUT/dp-daemon.log"; exit 1; }
[[ "$line" =~ grpc=([^ ]+)\ metrics=([^ ]+) ]] || { kill -TERM $pid; exit 1; }
grpc=${BASH_REMATCH[1]}; metrics=${BASH_REMATCH[2]}
cli() { "$BUILD_DIR"/client/megatrain --server "$grpc" "$@"; }
data_abs=$PWD/examples/jobs/data/tiny
job_file() {  # name devices
  cat > "$state/$1.yaml" <<YAML
name: $1
model: {preset: tiny}
data: {tokens: $data_abs}
train: {micro_batch: 8, seq_len: 128, gradient_accumulation_steps: 2, devices: $2,
        max_steps: 40, compute_dtype: bf16, max_grad_norm: 1.0}
optimizer: {lr: 3.0e-3, warmup_steps: 5}
checkpoint: {every_steps: 20, keep_last: 2}
YAML
}
job_file dp2 2
cli submit "$state/dp2.yaml" --wait > "$OUT/dp-submit.log" 2>&1
rc=$?
tail -3 "$OUT/dp-submit.log"
if [ $rc = 0 ] && grep -q "(2 devices, " "$OUT/dp-submit.log"; then
  echo "DP_JOB PASS"
else
  echo "DP_JOB FAIL (submit --wait exit $rc)"
fi
env -u LD_LIBRARY_PATH curl -s "http://$metrics/metrics" > "$OUT/dp-metrics.txt"
grep -E '^megatrain_(job_)?tokens_per_second' "$OUT/dp-metrics.txt"
if grep -q '^megatrain_tokens_per_second{device="cuda:1"}' "$OUT/dp-metrics.txt" &&
   grep -q '^megatrain_job_tokens_per_second{device="cuda:0"}' "$OUT/dp-metrics.txt"; then
  echo "DP_METRICS PASS"
else
  echo "DP_METRICS FAIL"
fi
job_file dp3 3
refusal=$(cli submit "$state/dp3.yaml" 2>&1)
echo "$refusal" | tail -2
if echo "$refusal" | grep -q "RESOURCE_EXHAUSTED" && echo "$refusal" | grep -q "train.devices: 3"; then
  echo "DP_REFUSAL PASS"
else
  echo "DP_REFUSAL FAIL"
fi
kill -TERM $pid; wait $pid; echo "megatraind exit $?"
