#!/usr/bin/env bash
# Integration: SIGTERM to megatraind while a job is in the middle of its
# steps (not at a checkpoint step). The daemon asks the job to stop at the
# next step boundary, the job writes a checkpoint of that step, the daemon
# exits 0, and the job is QUEUED again with that checkpoint as resume_from.
# After a restart on the same --state_dir it resumes from exactly that step
# (the first step it reports is the next one) and finishes; its checkpoints
# verify (fault_verify_checkpoint.py). crash_resume_test.sh covers kill -9;
# cli_flow_test.sh sends SIGTERM only to an idle daemon.
source "$(dirname "$0")/lib.sh"

max_steps=40
state="$WORK/state"
start_daemon "$state"
# Periodic checkpoints only every 30 steps: the one SIGTERM writes is its own.
job_file=$(write_job sigterm-mid-step "$max_steps" "")
sed -i -e 's/every_steps: 20/every_steps: 30/' "$job_file"
job=$(cli --json submit "$job_file" | jq -r .id)
root="$(cli get "$job" --json | jq -r .spec.output_dir)/checkpoints"
wait_for_event "$job" '.kind == "step" and .step >= 3' || fail "no step 3 from $job"

log "SIGTERM while $job trains"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM (want 0)"
mapfile -t on_disk < <(compgen -G "$root/step-*" | sort)
((${#on_disk[@]} == 1)) || fail "expected the shutdown checkpoint alone: $(ls -a "$root" 2>&1)"
checkpoint=${on_disk[0]}
step=$((10#${checkpoint##*step-}))
((step >= 3 && step < 30)) || fail "shutdown checkpoint at step $step"
! compgen -G "$root/.tmp-*" >/dev/null || fail "leftovers: $(ls -a "$root")"
python3 "$SOURCE_DIR/tests/integration/fault_verify_checkpoint.py" "$checkpoint" >&2 ||
  fail "the shutdown checkpoint does not verify"

log "restart: $job resumes from step $step"
start_daemon "$state"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .state) == QUEUED || $(json_field "$json" .state) == RUNNING ]] ||
  fail "after restart: $json"
[[ $(json_field "$json" .resume_from) == "$checkpoint" ]] || fail "resume_from: $json"
events=$(cli --json watch "$job") || fail "$job did not succeed: $(cli get "$job" --json)"
jq -se 'map(select(.kind == "state")) | any(.message | test("daemon shut down; re-queued, resumes from"))' \
  <<<"$events" >/dev/null || fail "no shutdown re-queue event"
jq -se --arg dir "$checkpoint" 'map(select(.kind == "state")) | any(.message == "resuming on cpu from " + $dir)' \
  <<<"$events" >/dev/null || fail "no resume from $checkpoint"
# The step events after the resume message continue at step + 1.
first_after=$(jq -s --arg dir "$checkpoint" '
  (map(.kind == "state" and .message == "resuming on cpu from " + $dir) | index(true)) as $at
  | .[$at:] | map(select(.kind == "step")) | .[0].step' <<<"$events")
[[ "$first_after" == $((step + 1)) ]] || fail "first step after the resume: $first_after, want $((step + 1))"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .state) == SUCCEEDED ]] || fail "final: $json"
[[ $(json_field "$json" .progress.step) == "$max_steps" ]] || fail "final step: $json"
mapfile -t listed < <(cli checkpoints "$job" --json | jq -r '.checkpoints[].dir')
python3 "$SOURCE_DIR/tests/integration/fault_verify_checkpoint.py" "${listed[@]}" >&2 ||
  fail "a listed checkpoint does not verify"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
