#!/usr/bin/env bash
# megatraind on a GPU: builds the daemon and CLI (deploy/gpu-build.sh), starts
# megatraind on cuda:0 (measuring the link at start-up), trains the tiny
# example in bf16 through it, and prints the server status and the PCIe /
# NVML / throughput metric families. Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
start=$(date +%s)
MEGATRAIN_BUILD_SERVER=ON bash deploy/gpu-build.sh build-gpu megatraind megatrain megatrain-tokenize \
  megatrain_sentencepiece > "$OUT/server-build.log" 2>&1 || { tail -30 "$OUT/server-build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
state=$(mktemp -d /tmp/megatraind-gpu.XXXXXX)
mkfifo "$state/ready"
build-gpu/server/megatraind --state_dir="$state" --device=cuda:0 --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 >"$state/ready" 2>"$OUT/megatraind.log" &
pid=$!
IFS= read -r -t 120 line <"$state/ready" || { echo "daemon did not start"; tail "$OUT/megatraind.log"; exit 1; }
echo "$line"
[[ "$line" =~ grpc=([^ ]+)\ metrics=([^ ]+) ]] || exit 1
grpc=${BASH_REMATCH[1]}; metrics=${BASH_REMATCH[2]}
cli() { build-gpu/client/megatrain --server "$grpc" "$@"; }
sed 's/compute_dtype: fp32 /compute_dtype: bf16 /; s/max_steps: 60/max_steps: 200/' examples/jobs/tiny.yaml \
  > examples/jobs/tiny-gpu.yaml
cli status --json > "$OUT/status.json"; cat "$OUT/status.json" | head -40
cli submit examples/jobs/tiny-gpu.yaml --wait 2>&1 | tail -5
job=$(cli list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
cli get "$job"
env -u LD_LIBRARY_PATH curl -s "http://$metrics/metrics" > "$OUT/metrics.txt"
grep -E '^megatrain_(pcie|nvml|tokens_total|mfu|step_seconds_count|gpu_memory|phase)' "$OUT/metrics.txt" | head -30
[ "${DAEMON_FAULTS:-1}" = 1 ] && source deploy/gpu-daemon-faults.sh
kill -TERM $pid; wait $pid; echo "megatraind exit $?"
