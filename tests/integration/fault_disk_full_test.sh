#!/usr/bin/env bash
# Integration: the disk fills up while the daemon writes a checkpoint. The
# job's output_dir is a 16 MiB tmpfs (a real ENOSPC), room for one tiny
# checkpoint (~11 MB) but not two: step 2's checkpoint is written, step 4's
# runs out of space. The job ends FAILED with RESOURCE_EXHAUSTED and a
# message naming the file and ENOSPC; the partial checkpoint is removed;
# step 2's checkpoint is still listed and verifies (fault_verify_checkpoint.py);
# the daemon goes on running other jobs, and its job store (on another file
# system) survives a restart with every job and event.
#
# Mounting needs root (CAP_SYS_ADMIN); elsewhere the test prints SKIP and
# exits 0 (the engine-level tests in checkpoint_test and training_job_test
# skip the same way; checkpoint_test's RLIMIT_FSIZE case needs no root).
source "$(dirname "$0")/lib.sh"

disk="$WORK/disk"
mkdir -p "$disk"
if [[ $(id -u) != 0 ]]; then
  log "SKIP: needs root to mount a tmpfs (running as uid $(id -u))"
  exit 0
fi
if ! mount -t tmpfs -o size=16m,mode=0755 tmpfs "$disk" 2>"$WORK/mount.err"; then
  log "SKIP: mount -t tmpfs failed: $(cat "$WORK/mount.err")"
  exit 0
fi
trap 'umount -l "$disk" 2>/dev/null || true; cleanup' EXIT

state="$WORK/state"
start_daemon "$state"
job_file=$(write_job disk-full 10 "output_dir: $disk/out")
sed -i -e 's/every_steps: 20/every_steps: 2/' -e 's/keep_last: 2/keep_last: 1/' "$job_file"
job=$(cli --json submit "$job_file" | jq -r .id)
root="$disk/out/checkpoints"
log "$job checkpoints every 2 steps into a 16 MiB tmpfs"

rc=0
cli watch "$job" >"$WORK/watch.txt" || rc=$?
[[ $rc != 0 ]] || fail "$job should fail: $(cat "$WORK/watch.txt")"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .state) == FAILED ]] || fail "state: $json"
[[ $(json_field "$json" .error_code) == RESOURCE_EXHAUSTED ]] || fail "code: $json"
message=$(json_field "$json" .error_message)
log "error: $message"
[[ "$message" == *"writing checkpoint step-00000004: $root/.tmp-step-00000004."* ]] ||
  fail "message does not name the file: $message"
[[ "$message" == *"No space left on device (ENOSPC)"* ]] || fail "no ENOSPC: $message"
[[ "$message" == *"earlier checkpoints are intact (newest: $root/step-00000002)"* ]] ||
  fail "message does not name the intact checkpoint: $message"
[[ $(json_field "$json" .progress.step) == 4 ]] || fail "progress: $json"

log "the partial checkpoint is gone; step 2's is listed and verifies"
[[ $(ls -A "$root" | grep -vx .ledger.json) == step-00000002 ]] || fail "checkpoints dir: $(ls -A "$root")"  # the ledger: Note [Checkpoint ledger]
listed=$(cli checkpoints "$job" --json | jq -r '.checkpoints[].dir')
[[ "$listed" == "$root/step-00000002" ]] || fail "listed: $listed"
python3 "$SOURCE_DIR/tests/integration/fault_verify_checkpoint.py" "$listed" >&2 ||
  fail "step 2's checkpoint does not verify"

log "the daemon runs the next job"
next=$(cli --json submit "$(write_job after-disk-full 6)" | jq -r .id)
cli watch "$next" >/dev/null || fail "$next did not succeed: $(cli get "$next" --json)"

log "the job store survives a restart"
# `watch` of a FAILED job exits non-zero by design.
count_events() { { cli --json watch "$job" 2>/dev/null || true; } | jq -s length; }
events_before=$(count_events)
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
start_daemon "$state"
[[ $(cli get "$job" --json | jq -r .state) == FAILED ]] || fail "$job after restart"
[[ $(cli get "$next" --json | jq -r .state) == SUCCEEDED ]] || fail "$next after restart"
[[ $(count_events) == "$events_before" ]] || fail "events changed"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
