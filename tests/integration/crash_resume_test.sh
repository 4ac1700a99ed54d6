#!/usr/bin/env bash
# Integration: kill -9 of megatraind in the middle of a job, then a restart
# on the same --state_dir: nothing submitted is lost, and the job that was
# running is re-queued, resumes from its last checkpoint and finishes.
source "$(dirname "$0")/lib.sh"

state="$WORK/state"
start_daemon "$state"

job=$(cli --json submit "$TINY_JOB" | jq -r .id)
queued=$(cli --json submit "$(write_job queued-behind 10)" | jq -r .id)
log "submitted $job and $queued; waiting for $job's first checkpoint"
wait_for_event "$job" '.kind == "checkpoint"' || fail "no checkpoint from $job"
step_at_kill=$(cli get "$job" --json | jq -r .progress.step)

log "kill -9 at step $step_at_kill"
stop_daemon KILL || true

start_daemon "$state"
json=$(cli get "$job" --json)
state_now=$(json_field "$json" .state)
[[ "$state_now" == QUEUED || "$state_now" == RUNNING ]] || fail "after restart: $json"
[[ $(cli get "$queued" --json | jq -r .state) != "" ]] || fail "$queued was lost"

log "waiting for $job to finish after the restart"
cli watch "$job" >"$WORK/watch.txt" || fail "$job did not succeed: $(cat "$WORK/watch.txt")"
grep -q "re-queued after a daemon restart; resumes from" "$WORK/watch.txt" ||
  fail "no re-queue event: $(cat "$WORK/watch.txt")"
grep -q "resuming on cpu from" "$WORK/watch.txt" || fail "did not resume from a checkpoint"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .state) == SUCCEEDED ]] || fail "final: $json"
[[ $(json_field "$json" .progress.step) == 60 ]] || fail "final step: $json"
[[ $(json_field "$json" .resume_from) == */step-20* || $(json_field "$json" .resume_from) == */step-* ]] ||
  fail "resume_from: $json"

log "the queued job also runs"
cli watch "$queued" >/dev/null || fail "$queued did not succeed"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
