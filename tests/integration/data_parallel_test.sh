#!/usr/bin/env bash
# Integration: a data-parallel job (train.devices 2, issue 21) through the
# real daemon, engine and CLI, on two CPU device slots (`--device
# cpu,cpu:1`, Note [CPU device slots] in server/core/engine_backend.h): two
# ranks over c10d's gloo sharing one host store.
#   * the job runs on both slots (its `device` lists them) to SUCCEEDED;
#     every step event carries devices 2 and tokens/s per device = half the
#     job's; /metrics has tokens/s on both slots and the job's under the
#     first while it runs; `megatrain watch` prints "(2 devices, N each)";
#   * suspended mid-run and resumed, it finishes with the same loss, bit for
#     bit, at every step after the suspend as an uninterrupted run of the
#     same spec (exact resume across a checkpoint, same world size);
#   * a job asking for 3 devices is refused at submission with
#     RESOURCE_EXHAUSTED naming train.devices.
# Skipped (exit 0, "SKIP") on a build whose LibTorch has no gloo.
# The numerics (2 ranks = 1 device accumulating the global batch, within
# 1e-6) are tests/engine/job/data_parallel_job_test.cc's.
source "$(dirname "$0")/lib.sh"

# dp_job NAME DEVICES MAX_STEPS: a tiny fp32 job with 2 micro-batches per step.
dp_job() {
  local path="$WORK/$1.yaml"
  cat >"$path" <<YAML
name: $1
model: {preset: tiny}
data: {tokens: $TINY_DATA}
train: {micro_batch: 4, seq_len: 64, gradient_accumulation_steps: 2, devices: $2,
        max_steps: $3, max_grad_norm: 1.0}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
checkpoint: {every_steps: 4, keep_last: 2}
YAML
  echo "$path"
}

DAEMON_DEVICE=cpu,cpu:1 start_daemon "$WORK/state"
probe_out=$(cli submit "$(dp_job probe 2 3)" 2>&1) || true
if [[ "$probe_out" == *"no c10d backend"* ]]; then
  log "SKIP: this build's LibTorch has no gloo"
  stop_daemon TERM || true
  exit 0
fi
probe=$(cli --json list | jq -r '.jobs[] | select(.name == "probe") | .id')
[[ -n "$probe" ]] || fail "probe job not submitted: $probe_out"
cli watch "$probe" >/dev/null || fail "probe job: $(cli get "$probe" --json)"

log "refused: 3 devices on a 2-device daemon"
expect_cli_error RESOURCE_EXHAUSTED "train.devices: 3 requested, this daemon has 2 device(s)" \
  submit "$(dp_job three 3 4)"

log "an uninterrupted 2-device run"
straight=$(cli --json submit "$(dp_job straight 2 12)" | jq -r .id)
progress=$(cli watch "$straight") || fail "$straight did not succeed: $(cli get "$straight" --json)"
[[ "$progress" == *"(2 devices, "*" each)"* ]] || fail "watch lines: $progress"
json=$(cli get "$straight" --json)
[[ $(json_field "$json" .progress.step) == 12 ]] || fail "final step: $json"
straight_events=$(cli --json watch "$straight")
jq -se '[.[] | select(.kind == "step")] | length == 12 and
        all(.devices == 2 and .device_tokens_per_s > 0 and
            (.tokens_per_s - 2 * .device_tokens_per_s | fabs) <= 1e-6 * .tokens_per_s)' \
  <<<"$straight_events" >/dev/null || fail "step events: $straight_events"
grep -q "started on cpu,cpu:1" "$WORK/daemon.log" || fail "not started on both slots"

log "suspended and resumed: the same losses as the uninterrupted run"
resumed=$(cli --json submit "$(dp_job resumed 2 12)" | jq -r .id)
wait_for_event "$resumed" '.kind == "step" and .step >= 3' || fail "no step of $resumed"
# While it runs (a job's end zeroes its devices' gauges): tokens/s on both
# slots and the job's under the first.
metrics=$(cli metrics)
cli suspend "$resumed" >/dev/null
grep -qE '^megatrain_tokens_per_second\{device="cpu:1"\} [1-9]' <<<"$metrics" ||
  fail "tokens/s of cpu:1: $(grep tokens_per_second <<<"$metrics")"
grep -qE '^megatrain_job_tokens_per_second\{device="cpu"\} [1-9]' <<<"$metrics" ||
  fail "job tokens/s: $(grep tokens_per_second <<<"$metrics")"
wait_for_event "$resumed" '.kind == "state" and .state == "SUSPENDED"' ||
  fail "$resumed never SUSPENDED"
json=$(cli get "$resumed" --json)
suspended_step=$(json_field "$json" .progress.step)
[[ -d $(json_field "$json" .resume_from) ]] || fail "no checkpoint to resume from: $json"
(( suspended_step < 12 )) || fail "finished before the suspend took effect: $json"
cli resume "$resumed" >/dev/null
cli watch "$resumed" >/dev/null || fail "$resumed did not succeed: $(cli get "$resumed" --json)"
losses() {  # EVENTS FROM_STEP: "step loss" lines of the applied steps after FROM_STEP
  jq -r --argjson from "$2" 'select(.kind == "step" and .step > $from) | "\(.step) \(.loss)"' <<<"$1" |
    sort -n -u
}
after_straight=$(losses "$straight_events" "$suspended_step")
after_resume=$(losses "$(cli --json watch "$resumed")" "$suspended_step")
[[ -n "$after_resume" && "$after_resume" == "$after_straight" ]] ||
  fail "losses after step $suspended_step differ: resumed [$after_resume] straight [$after_straight]"
log "resumed after step $suspended_step: $(wc -l <<<"$after_resume") steps identical"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
