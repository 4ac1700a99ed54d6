#!/usr/bin/env bash
# Integration: kill -9 of megatraind while a checkpoint is being written.
# A job checkpoints after every step; the test polls its checkpoints
# directory and kills the daemon the moment a `.tmp-step-*` directory (a
# write in progress, Note [Checkpoint publication] in engine/checkpoint/checkpoint.cc)
# exists, restarting and retrying until a kill leaves one behind (the write
# was really cut). Then: every `step-*` checkpoint on disk verifies against
# its manifest (sizes and XXH64, fault_verify_checkpoint.py), the restarted
# daemon resumes the job from the newest of them, the leftover temporary
# directory is cleaned up, the job finishes, and every checkpoint it lists
# verifies.
source "$(dirname "$0")/lib.sh"

verify() { python3 "$SOURCE_DIR/tests/integration/fault_verify_checkpoint.py" "$@"; }
max_steps=60
state="$WORK/state"
start_daemon "$state"
job_file=$(write_job kill-in-checkpoint "$max_steps" "")
# Every step checkpoints (keep the newest 3) so that writes are frequent.
sed -i -e 's/every_steps: 20/every_steps: 1/' -e 's/keep_last: 2/keep_last: 3/' "$job_file"
job=$(cli --json submit "$job_file" | jq -r .id)
root="$(cli get "$job" --json | jq -r .spec.output_dir)/checkpoints"
log "$job checkpoints every step under $root"

# poll_for_write SECONDS: returns 0 as soon as a `.tmp-step-*` entry exists
# in $root (compgen is a builtin: no process per poll), 1 after SECONDS.
# Polling is the only way to see the window: the daemon announces a
# checkpoint only once it is complete.
poll_for_write() {
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    if compgen -G "$root/.tmp-step-*" >/dev/null; then return 0; fi
  done
  return 1
}

hit=""
for attempt in $(seq 1 20); do
  wait_for_event "$job" '.kind == "checkpoint"' || fail "no checkpoint from $job"
  poll_for_write 60 || fail "attempt $attempt: no checkpoint write seen within 60 s"
  kill -KILL "$DAEMON_PID"
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
  if compgen -G "$root/.tmp-step-*" >/dev/null; then
    hit=$(compgen -G "$root/.tmp-step-*" | head -n 1)
    log "attempt $attempt: killed during the write of $(basename "$hit")"
    break
  fi
  log "attempt $attempt: the write finished before the kill; again"
  start_daemon "$state"
  [[ $(cli get "$job" --json | jq -r .state) != SUCCEEDED ]] || fail "$job finished before a hit"
done
[[ -n "$hit" ]] || fail "20 kills, none during a checkpoint write"

log "every complete checkpoint left on disk verifies"
mapfile -t complete < <(compgen -G "$root/step-*" | sort)
((${#complete[@]} > 0)) || fail "no complete checkpoint survived: $(ls -a "$root")"
verify "${complete[@]}" >&2 || fail "a checkpoint left by the kill does not verify"
newest=${complete[-1]}

log "restart: the job resumes from $(basename "$newest") and finishes"
start_daemon "$state"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .resume_from) == "$newest" || $(json_field "$json" .state) == RUNNING ]] ||
  fail "after restart: $json"
cli watch "$job" >"$WORK/watch.txt" || fail "$job did not succeed: $(tail -n 5 "$WORK/watch.txt")"
grep -q "resuming on cpu from $newest" "$WORK/watch.txt" ||
  fail "did not resume from $newest: $(grep -i resum "$WORK/watch.txt")"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .progress.step) == "$max_steps" ]] || fail "final: $json"
[[ ! -e "$hit" ]] || fail "the interrupted write $hit was not cleaned up"
! compgen -G "$root/.tmp-*" >/dev/null || fail "leftovers: $(ls -a "$root")"

log "every checkpoint the daemon lists verifies"
mapfile -t listed < <(cli checkpoints "$job" --json | jq -r '.checkpoints[].dir')
((${#listed[@]} == 3)) || fail "keep_last 3: ${listed[*]}"
[[ "${listed[-1]}" == */step-$(printf '%08d' "$max_steps") ]] || fail "newest: ${listed[-1]}"
verify "${listed[@]}" >&2 || fail "a listed checkpoint does not verify"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
