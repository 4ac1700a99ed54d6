#!/usr/bin/env bash
# Control-plane load benchmark (docs/performance.md, "Control-plane load"):
# starts megatraind on the CPU with a private state directory, submits the
# tiny example with a very large max_steps, waits until it trains, runs
# megatrain-loadtest against it (N concurrent ListJobs/GetJob/WatchJob
# clients on loopback, the daemon's RSS from /proc, tokens/s before and
# during the load), then cancels the job and stops the daemon.
#
#   deploy/loadtest.sh                      # 64 clients, 60 s, 25% watchers
#   CLIENTS=16 SECONDS_LOAD=20 deploy/loadtest.sh --json
#
# Environment: BUILD_DIR (default build/; needs megatraind, megatrain,
# megatrain-loadtest: `cmake --build build --target megatraind megatrain
# megatrain-loadtest`), CLIENTS (64), SECONDS_LOAD (60), WATCH_FRACTION
# (0.25), BASELINE_SECONDS (15), DEVICE (cpu; e.g. cuda:0 on a GPU machine),
# and the training job's shape: JOB_PRESET (tiny), JOB_MICRO_BATCH (8),
# JOB_SEQ_LEN (128), JOB_DTYPE (fp32), DAEMON_FLAGS (extra megatraind flags,
# e.g. --rpc_nice=0). Extra arguments go to megatrain-loadtest (e.g.
# --client_nice=0).
# The report is printed on stdout; the daemon's log stays in the work
# directory printed at the start (removed unless KEEP_WORK=1).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
CLIENTS=${CLIENTS:-64}
SECONDS_LOAD=${SECONDS_LOAD:-60}
WATCH_FRACTION=${WATCH_FRACTION:-0.25}
BASELINE_SECONDS=${BASELINE_SECONDS:-15}

DAEMON="$BUILD_DIR/server/megatraind"
CLI="$BUILD_DIR/client/megatrain"
LOADTEST="$BUILD_DIR/client/megatrain-loadtest"
for bin in "$DAEMON" "$CLI" "$LOADTEST"; do
  [[ -x "$bin" ]] || { echo "loadtest: $bin not built (BUILD_DIR=$BUILD_DIR)" >&2; exit 1; }
done
command -v jq >/dev/null || { echo "loadtest: jq is required" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/megatrain-loadtest.XXXXXX")
DAEMON_PID=""
cleanup() {
  if [[ -n "$DAEMON_PID" ]]; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  if [[ "${KEEP_WORK:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
echo "loadtest: work directory $WORK" >&2

# The daemon, on free loopback ports; its ready line names them.
mkfifo "$WORK/ready.fifo"
"$DAEMON" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$WORK/state" \
  --device="${DEVICE:-cpu}" ${DAEMON_FLAGS:-} >"$WORK/ready.fifo" 2>"$WORK/daemon.log" &
DAEMON_PID=$!
IFS= read -r -t 120 line <"$WORK/ready.fifo" || { echo "loadtest: daemon not ready" >&2; exit 1; }
[[ "$line" =~ grpc=([^ ]+) ]] || { echo "loadtest: unexpected: $line" >&2; exit 1; }
ADDR=${BASH_REMATCH[1]}
echo "loadtest: megatraind pid $DAEMON_PID at $ADDR" >&2

# The tiny example, long enough to outlast the benchmark; no periodic
# checkpoints or evals, so that throughput is steady.
cat >"$WORK/job.yaml" <<YAML
name: loadtest-${JOB_PRESET:-tiny}
model:
  preset: ${JOB_PRESET:-tiny}
data:
  tokens: $ROOT/examples/jobs/data/tiny
train:
  micro_batch: ${JOB_MICRO_BATCH:-8}
  seq_len: ${JOB_SEQ_LEN:-128}
  compute_dtype: ${JOB_DTYPE:-fp32}
  max_grad_norm: 0
  max_steps: 10000000
optimizer:
  lr: 3.0e-3
  warmup_steps: 5
checkpoint:
  every_steps: 0
YAML
JOB=$("$CLI" --server "$ADDR" --json submit "$WORK/job.yaml" | jq -r .id)
echo "loadtest: submitted $JOB; waiting for 20 steps" >&2
# Follow the job's events until step 20 (event-driven, bounded by 300 s).
exec {fd}< <(exec timeout 300 "$CLI" --server "$ADDR" --json watch "$JOB" 2>/dev/null)
watch_pid=$!
reached=0
while IFS= read -r -u "$fd" event; do
  if jq -e '.kind == "step" and .step >= 20' >/dev/null 2>&1 <<<"$event"; then reached=1; break; fi
done
kill "$watch_pid" 2>/dev/null || true
exec {fd}<&-
[[ $reached == 1 ]] || { echo "loadtest: $JOB did not reach step 20" >&2; exit 1; }

echo "loadtest: machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$LOADTEST" --server "$ADDR" --job "$JOB" --daemon_pid "$DAEMON_PID" --clients "$CLIENTS" \
  --seconds "$SECONDS_LOAD" --watch_fraction "$WATCH_FRACTION" \
  --baseline_seconds "$BASELINE_SECONDS" "$@"
echo "loadtest: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$CLI" --server "$ADDR" cancel "$JOB" >/dev/null
kill -TERM "$DAEMON_PID"
rc=0
wait "$DAEMON_PID" || rc=$?
DAEMON_PID=""
[[ $rc == 0 ]] || { echo "loadtest: megatraind exited $rc" >&2; exit 1; }
