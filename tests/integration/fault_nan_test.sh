#!/usr/bin/env bash
# Integration: train.nan_policy through the real daemon and CLI. megatraind
# runs with the debug knob MEGATRAIN_DEBUG_POISON_STEP=3 (engine/
# training_job.h): the third step of every job goes NaN once. A skip job
# (the default) reports one skipped step, still runs all its steps and
# succeeds, and megatrain_skipped_steps_total counts it; a fail job ends
# FAILED with a message naming step 3 and the policy; the daemon then runs
# the job queued behind the failed one. (Weights and AdamW moments staying
# bit-identical over a skip is checked in tests/engine/step/trainer_test.cc.)
source "$(dirname "$0")/lib.sh"

# nan_job NAME MAX_STEPS POLICY: a tiny job file with train.nan_policy set.
nan_job() {
  local path="$WORK/$1.yaml"
  cat >"$path" <<YAML
name: $1
model: {preset: tiny}
data: {tokens: $TINY_DATA}
train: {micro_batch: 8, seq_len: 128, max_steps: $2, nan_policy: $3}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
YAML
  echo "$path"
}

export MEGATRAIN_DEBUG_POISON_STEP=3
start_daemon "$WORK/state"

skip=$(cli --json submit "$(nan_job nan-skip 8 skip)" | jq -r .id)
failing=$(cli --json submit "$(nan_job nan-fail 8 fail)" | jq -r .id)
after=$(cli --json submit "$(write_job after-failure 6)" | jq -r .id)
log "submitted $skip (skip), $failing (fail), $after (queued behind)"

log "skip: one skipped step, all 8 steps applied, SUCCEEDED"
cli watch "$skip" >/dev/null || fail "$skip did not succeed: $(cli get "$skip" --json)"
json=$(cli get "$skip" --json)
[[ $(json_field "$json" .progress.step) == 8 ]] || fail "final step: $json"
[[ $(json_field "$json" .spec.train.nan_policy) == NAN_POLICY_SKIP ]] || fail "policy: $json"
events=$(cli --json watch "$skip")
skipped=$(jq -s -c '[.[] | select(.kind == "step" and .skipped) | .step]' <<<"$events")
[[ "$skipped" == "[2]" ]] || fail "expected one skipped step reported after step 2, got $skipped"
applied=$(jq -s '[.[] | select(.kind == "step" and (.skipped | not))] | length' <<<"$events")
[[ "$applied" == 8 ]] || fail "expected 8 applied steps, got $applied"
jq -se '[.[] | select(.kind == "step" and (.skipped | not)) | .loss] | all(. != null and . > 0)' \
  <<<"$events" >/dev/null || fail "non-finite loss after the skip: $events"

log "fail: FAILED naming the step and the policy"
rc=0
cli watch "$failing" >/dev/null || rc=$?
[[ $rc != 0 ]] || fail "watch of a failed job should not exit 0"
json=$(cli get "$failing" --json)
[[ $(json_field "$json" .state) == FAILED ]] || fail "state: $json"
message=$(json_field "$json" .error_message)
[[ "$message" == *"step 3: loss nan"* && "$message" == *"train.nan_policy: fail"* ]] ||
  fail "error message: $message"
[[ $(json_field "$json" .progress.step) == 2 ]] || fail "progress at failure: $json"

log "the daemon runs the job queued behind the failed one"
cli watch "$after" >/dev/null || fail "$after did not succeed: $(cli get "$after" --json)"

log "metrics: the skipped steps of both skip jobs are counted"
metrics=$(cli metrics)
grep -qE '^megatrain_skipped_steps_total 2(\.0+)?$' <<<"$metrics" ||
  fail "megatrain_skipped_steps_total: $(grep skipped <<<"$metrics")"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
