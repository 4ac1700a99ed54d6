#!/usr/bin/env bash
# Shared helpers of the integration tests: start the real megatraind on free
# loopback ports with a temporary state directory, drive it with the real
# `megatrain` CLI, and wait on its event stream (WatchJob) instead of
# sleeping.
#
# Scripts source this file and are called by ctest (integration_tests.cmake)
# with: <megatraind> <megatrain> <source dir>.
set -euo pipefail

DAEMON_BIN=${1:?usage: $0 MEGATRAIND MEGATRAIN SOURCE_DIR}
CLI_BIN=${2:?usage: $0 MEGATRAIND MEGATRAIN SOURCE_DIR}
SOURCE_DIR=${3:?usage: $0 MEGATRAIND MEGATRAIN SOURCE_DIR}
TINY_JOB="$SOURCE_DIR/examples/jobs/tiny.yaml"
TINY_DATA="$SOURCE_DIR/examples/jobs/data/tiny"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/megatrain-it.XXXXXX")
DAEMON_PID=""
GRPC_ADDR=""
METRICS_ADDR=""
CLEANUP_PIDS=()

cleanup() {
  local pid
  for pid in "${CLEANUP_PIDS[@]}" $DAEMON_PID; do
    { kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true
  done
  if [[ "${KEEP_WORK:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

log() { echo "[$(date +%T)] $*" >&2; }

# write_tokens FILE NAME:ROLE...: a tokens file (docs/api.md, --auth_tokens)
# giving each user the token "<name>-secret", readable by its owner only
# (the daemon refuses a tokens file others may read).
write_tokens() {
  local file=$1 spec
  shift
  {
    echo "users:"
    for spec in "$@"; do
      echo "  - {name: ${spec%%:*}, role: ${spec#*:}, token_sha256: $(printf '%s-secret' "${spec%%:*}" | "$CLI_BIN" hash-token)}"
    done
  } >"$file"
  chmod 600 "$file"
}

fail() {
  echo "FAIL: $*" >&2
  if [[ -f "$WORK/daemon.log" ]]; then
    echo "--- daemon log (last 40 lines) ---" >&2
    tail -n 40 "$WORK/daemon.log" >&2
  fi
  exit 1
}

# start_daemon STATE_DIR [flags...]: starts megatraind (on --device
# $DAEMON_DEVICE, default cpu), waits for its ready line (read from a FIFO,
# bounded by 120 s) and sets DAEMON_PID, GRPC_ADDR, METRICS_ADDR.
start_daemon() {
  local state_dir=$1
  shift
  local fifo="$WORK/ready.fifo"
  rm -f "$fifo"
  mkfifo "$fifo"
  "$DAEMON_BIN" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state_dir" \
    --device="${DAEMON_DEVICE:-cpu}" "$@" >"$fifo" 2>>"$WORK/daemon.log" &
  DAEMON_PID=$!
  local line=""
  if ! IFS= read -r -t 120 line <"$fifo"; then
    fail "megatraind did not report ready within 120 s"
  fi
  [[ "$line" =~ grpc=([^ ]+)\ metrics=([^ ]+) ]] || fail "unexpected ready line: $line"
  GRPC_ADDR=${BASH_REMATCH[1]}
  METRICS_ADDR=${BASH_REMATCH[2]}
  log "megatraind pid $DAEMON_PID grpc $GRPC_ADDR metrics $METRICS_ADDR"
}

# stop_daemon [SIGNAL]: signals the daemon (TERM by default) and returns its
# exit status.
stop_daemon() {
  local signal=${1:-TERM}
  local rc=0
  kill "-$signal" "$DAEMON_PID"
  wait "$DAEMON_PID" 2>/dev/null || rc=$?
  DAEMON_PID=""
  return "$rc"
}

# cli ARGS...: the CLI against the running daemon.
cli() { "$CLI_BIN" --server "$GRPC_ADDR" "$@"; }

# expect_cli_error CODE SUBSTRING ARGS...: the command must fail with the
# given status code name and a message containing SUBSTRING.
expect_cli_error() {
  local code=$1 substring=$2
  shift 2
  local err rc=0
  err=$(cli "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -ne 0 ]] || fail "expected '$*' to fail with $code"
  [[ "$err" == *"$code"* ]] || fail "expected $code from '$*', got: $err"
  [[ "$err" == *"$substring"* ]] || fail "expected '$substring' from '$*', got: $err"
}

# wait_for_event JOB JQ_FILTER [SECONDS]: follows `megatrain --json watch JOB`
# (history first, then live events) until an event satisfies JQ_FILTER.
# Event-driven: returns as soon as the daemon streams the event.
wait_for_event() {
  local job=$1 filter=$2 seconds=${3:-600}
  local fd line pid
  exec {fd}< <(exec timeout "$seconds" "$CLI_BIN" --server "$GRPC_ADDR" --json watch "$job" 2>/dev/null)
  pid=$!
  while IFS= read -r -u "$fd" line; do
    if jq -e "$filter" >/dev/null 2>&1 <<<"$line"; then
      kill "$pid" 2>/dev/null || true
      exec {fd}<&-
      return 0
    fi
  done
  exec {fd}<&-
  return 1
}

# write_job NAME MAX_STEPS [EXTRA_YAML]: a job file using the tiny data, in
# $WORK; prints its path.
write_job() {
  local name=$1 max_steps=$2 extra=${3:-}
  local path="$WORK/$name.yaml"
  cat >"$path" <<YAML
name: $name
model:
  preset: tiny
data:
  tokens: $TINY_DATA
train:
  micro_batch: 8
  seq_len: 128
  max_steps: $max_steps
optimizer:
  lr: 3.0e-3
  warmup_steps: 5
checkpoint:
  every_steps: 20
  keep_last: 2
$extra
YAML
  echo "$path"
}

# start_prometheus [SED_ARGS...]: starts Debian's `prometheus` on a free
# loopback port with deploy/'s scrape config and rules (in $WORK), the target
# rewritten to $METRICS_ADDR and the scrape interval and timeout shortened to
# 1 s; SED_ARGS (e.g. -e EXPR) rewrite the config further. Checks the config
# with promtool, sets PROM_PORT and logs to $WORK/prometheus.log. Call after
# start_daemon.
start_prometheus() {
  # A free port for Prometheus' web listener (it cannot report a port 0 pick).
  PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local config="$WORK/prometheus.yml"
  sed -e "s/127\.0\.0\.1:9400/$METRICS_ADDR/" \
      -e 's/scrape_interval: [0-9]*s/scrape_interval: 1s/' \
      -e 's/scrape_timeout: [0-9]*s/scrape_timeout: 1s/' \
      "$@" "$SOURCE_DIR/deploy/prometheus.yml" >"$config"
  cp "$SOURCE_DIR/deploy/prometheus-rules.yml" "$WORK/"
  promtool check config "$config" >/dev/null || fail "promtool rejects $config"
  prometheus --config.file="$config" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
  CLEANUP_PIDS+=($!)
}

# json_field JSON_TEXT JQ_PATH
json_field() { jq -r "$2" <<<"$1"; }

[[ -x "$DAEMON_BIN" ]] || fail "megatraind not built: $DAEMON_BIN"
[[ -x "$CLI_BIN" ]] || fail "megatrain not built: $CLI_BIN"
command -v jq >/dev/null || fail "jq is required (apt-get install jq)"
[[ -e "$TINY_DATA" ]] || fail "tiny data missing: $TINY_DATA"
