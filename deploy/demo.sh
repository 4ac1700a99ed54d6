#!/usr/bin/env bash
# The main job, end to end, on this machine: installs and builds what is
# missing, starts megatraind with defaults (loopback, state under the user's
# state directory, --device=auto: the CPU with Debian's LibTorch, which has
# no CUDA), submits the built-in tiny
# job (examples/jobs/tiny.yaml: the tiny preset on a small English corpus
# shipped in examples/data), shows its progress, lists its checkpoints,
# exports the last one as a Hugging Face model directory, and stops the
# daemon. The training itself takes about a minute on 2 CPU cores; the first
# run also builds the project (~10-15 minutes on 2 cores).
#
#   deploy/demo.sh
# Environment: MEGATRAIN_STATE_DIR (default ${XDG_STATE_HOME:-~/.local/state}/megatrain),
# MEGATRAIN_LISTEN (127.0.0.1:50051), MEGATRAIN_METRICS_LISTEN (127.0.0.1:9400),
# MEGATRAIN_DEVICE (auto).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

state_dir=${MEGATRAIN_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/megatrain}
listen=${MEGATRAIN_LISTEN:-127.0.0.1:50051}
metrics_listen=${MEGATRAIN_METRICS_LISTEN:-127.0.0.1:9400}
device=${MEGATRAIN_DEVICE:-auto}
say() { echo "== demo: $*"; }

say "dependencies"
bash deploy/install-deps.sh
say "build (only what the demo needs: megatraind, megatrain, megatrain-tokenize)"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGATRAIN_BUILD_SERVER=ON -DMEGATRAIN_ALLOW_MISSING_SOURCES=OFF >/dev/null
cmake --build build -j "$(nproc)" --target megatraind megatrain megatrain-tokenize megatrain_sentencepiece
daemon=$root/build/server/megatraind
cli=$root/build/client/megatrain

mkdir -p "$state_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/megatrain-demo.XXXXXX")
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say "start megatraind (state in $state_dir, gRPC $listen, metrics http://$metrics_listen/metrics)"
mkfifo "$work/ready"
"$daemon" --listen="$listen" --metrics_listen="$metrics_listen" --state_dir="$state_dir" \
  --device="$device" >"$work/ready" 2>>"$state_dir/megatraind.log" &
daemon_pid=$!
if ! IFS= read -r -t 120 ready <"$work/ready"; then
  echo "megatraind did not start; see $state_dir/megatraind.log" >&2
  tail -n 20 "$state_dir/megatraind.log" >&2
  exit 1
fi
echo "$ready"
export MEGATRAIN_SERVER=$listen

say "status"
"$cli" status

say "submit examples/jobs/tiny.yaml and follow it"
"$cli" submit examples/jobs/tiny.yaml --wait
job=$("$cli" list --json | jq -r '.jobs[0].id')
"$cli" get "$job"

say "checkpoints of $job"
"$cli" checkpoints "$job"
last=$("$cli" checkpoints "$job" --json | jq -r '.checkpoints[-1].id')

out="$state_dir/exports/${job}-hf"
rm -rf "$out"
say "export $last as a Hugging Face model directory"
"$cli" export "$last" --out "$out" --dtype bf16
ls -l "$out"

say "metrics (a few families)"
curl -s "http://$metrics_listen/metrics" | grep -E '^megatrain_(tokens_total|steps_total|training_loss|eval_loss|h2d_bytes_total)' | head -n 8 || true

say "stop megatraind"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""
say "done: job $job trained; HF export in $out"
