#!/usr/bin/env bash
# Integration: a data-parallel job (train.devices N, issue 21) through the
# real daemon, engine and CLI, on two CPU device slots (`--device
# cpu,cpu:1`, Note [CPU device slots] in server/core/engine_backend.h): two
# ranks over c10d's gloo sharing one host store.
#   * the job runs on every slot (its `device` lists them) to SUCCEEDED;
#     every step event carries devices N and tokens/s per device = 1/N of
#     the job's; /metrics has tokens/s on every slot and the job's under
#     the first while it runs; `megatrain watch` prints "(N devices, ...)";
#   * suspended mid-run and resumed, it finishes with the same loss, bit for
#     bit, at every step after the suspend as an uninterrupted run of the
#     same spec (exact resume across a checkpoint, same world size);
#   * a job asking for 3 devices is refused at submission with
#     RESOURCE_EXHAUSTED naming train.devices;
#   * --max_devices_per_user (Note [Device limit] in
#     server/core/job_manager.h): -1 is a start-up error naming the flag; a
#     restart with 1 holds the queued and drained 2-device jobs as SUSPENDED
#     naming the limit, refuses 2-device and `all` submissions and ResumeJob
#     with RESOURCE_EXHAUSTED, and still runs a 1-device job; without the
#     limit the held job resumes on every slot from its checkpoint.
# Skipped (exit 0, "SKIP") on a build whose LibTorch has no gloo.
# The same checks run on two GPUs with an HF model directory
# (deploy/gpu-dp-scale.sh, phase daemon-hf) through these variables:
# DP_DEVICES (cpu,cpu:1; N is their count, every job asks for all of them
# with max(2, N) micro-batches a step), DP_MODEL (the job's model: line, {preset: tiny}),
# DP_TRAIN (extra train: fields), DP_STEPS (12), DP_CHECKPOINT (the
# checkpoint: line) and DP_LIMITS (1: the --max_devices_per_user part; 0
# skips it).
# The numerics (2 ranks = 1 device accumulating the global batch, within
# 1e-6) are tests/engine/job/data_parallel_job_test.cc's.
source "$(dirname "$0")/lib.sh"

DP_DEVICES=${DP_DEVICES:-cpu,cpu:1}
IFS=, read -r -a DEVICE_LIST <<<"$DP_DEVICES"
N=${#DEVICE_LIST[@]}  # the daemon's devices, every one a data-parallel job's
FIRST=${DEVICE_LIST[0]}
DP_MODEL=${DP_MODEL:-"{preset: tiny}"}
DP_TRAIN=${DP_TRAIN:-}
DP_STEPS=${DP_STEPS:-12}
DP_CHECKPOINT=${DP_CHECKPOINT:-"{every_steps: 4, keep_last: 2}"}
DP_LIMITS=${DP_LIMITS:-1}

# dp_job NAME DEVICES MAX_STEPS: a job (tiny, fp32 unless DP_MODEL and
# DP_TRAIN say otherwise) with max(2, N) micro-batches per step.
dp_job() {
  local path="$WORK/$1.yaml"
  cat >"$path" <<YAML
name: $1
model: $DP_MODEL
data: {tokens: $TINY_DATA}
train: {micro_batch: 4, seq_len: 64, gradient_accumulation_steps: $(( N > 2 ? N : 2 )), devices: $2,
        max_steps: $3, max_grad_norm: 1.0 ${DP_TRAIN:+, $DP_TRAIN}}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
checkpoint: $DP_CHECKPOINT
YAML
  echo "$path"
}

DAEMON_DEVICE=$DP_DEVICES start_daemon "$WORK/state"
probe_out=$(cli submit "$(dp_job probe "$N" 3)" 2>&1) || true
if [[ "$probe_out" == *"no c10d backend"* ]]; then
  log "SKIP: this build's LibTorch has no gloo"
  stop_daemon TERM || true
  exit 0
fi
probe=$(cli --json list | jq -r '.jobs[] | select(.name == "probe") | .id')
[[ -n "$probe" ]] || fail "probe job not submitted: $probe_out"
cli watch "$probe" >/dev/null || fail "probe job: $(cli get "$probe" --json)"

log "refused: $((N + 1)) devices on a $N-device daemon"
expect_cli_error RESOURCE_EXHAUSTED "train.devices: $((N + 1)) requested, this daemon has $N device(s)" \
  submit "$(dp_job too-many $((N + 1)) 4)"

log "an uninterrupted $N-device run"
straight=$(cli --json submit "$(dp_job straight "$N" "$DP_STEPS")" | jq -r .id)
progress=$(cli watch "$straight") || fail "$straight did not succeed: $(cli get "$straight" --json)"
[[ "$progress" == *"($N devices, "*" each)"* ]] || fail "watch lines: $progress"
json=$(cli get "$straight" --json)
[[ $(json_field "$json" .progress.step) == "$DP_STEPS" ]] || fail "final step: $json"
straight_events=$(cli --json watch "$straight")
jq -se --argjson n "$DP_STEPS" --argjson d "$N" '[.[] | select(.kind == "step")] | length == $n and
        all(.devices == $d and .device_tokens_per_s > 0 and
            (.tokens_per_s - $d * .device_tokens_per_s | fabs) <= 1e-6 * .tokens_per_s)' \
  <<<"$straight_events" >/dev/null || fail "step events: $straight_events"
grep -q "started on $DP_DEVICES" "$WORK/daemon.log" || fail "not started on every slot"

log "suspended and resumed: the same losses as the uninterrupted run"
resumed=$(cli --json submit "$(dp_job resumed "$N" "$DP_STEPS")" | jq -r .id)
wait_for_event "$resumed" '.kind == "step" and .step >= 3' || fail "no step of $resumed"
# While it runs (a job's end zeroes its devices' gauges): tokens/s on
# every slot and the job's under the first.
metrics=$(cli metrics)
cli suspend "$resumed" >/dev/null
for device in "${DEVICE_LIST[@]}"; do
  grep -qE "^megatrain_tokens_per_second\\{device=\"$device\"\\} [1-9]" <<<"$metrics" ||
    fail "tokens/s of $device: $(grep tokens_per_second <<<"$metrics")"
done
grep -qE "^megatrain_job_tokens_per_second\\{device=\"$FIRST\"\\} [1-9]" <<<"$metrics" ||
  fail "job tokens/s: $(grep tokens_per_second <<<"$metrics")"
wait_for_event "$resumed" '.kind == "state" and .state == "SUSPENDED"' ||
  fail "$resumed never SUSPENDED"
json=$(cli get "$resumed" --json)
suspended_step=$(json_field "$json" .progress.step)
[[ -d $(json_field "$json" .resume_from) ]] || fail "no checkpoint to resume from: $json"
(( suspended_step < DP_STEPS )) || fail "finished before the suspend took effect: $json"
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
if [[ $FIRST == cuda* ]]; then  # each GPU's host-to-device bandwidth while the job ran
  for device in "${DEVICE_LIST[@]}"; do
    grep -qE "^megatrain_pcie_bandwidth_bytes_per_second\{device=\"$device\",direction=\"h2d\"\} [1-9]" <<<"$metrics" ||
      fail "PCIe bandwidth of $device: $(grep pcie_bandwidth <<<"$metrics")"
  done
fi

if [[ $DP_LIMITS != 1 ]]; then
  stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
  log "PASS (DP_LIMITS=0: the --max_devices_per_user part skipped)"
  exit 0
fi

log "--max_devices_per_user: a negative value is a start-up error naming the flag"
rc=0
bad_err=$("$DAEMON_BIN" --listen=127.0.0.1:0 --metrics_listen=off --state_dir="$WORK/bad-state" \
  --device=cpu --max_devices_per_user=-1 2>&1 >/dev/null) || rc=$?
[[ $rc -eq 1 && "$bad_err" == *"--max_devices_per_user: must be >= 0 (0: no limit), got -1"* ]] ||
  fail "--max_devices_per_user=-1: exit $rc: $bad_err"

log "--max_devices_per_user lowered across a restart: queued jobs held, submits refused"
capped=$(cli --json submit "$(dp_job capped "$N" 400)" | jq -r .id)
wait_for_event "$capped" '.kind == "step" and .step >= 1' || fail "no step of $capped"
behind=$(cli --json submit "$(dp_job behind "$N" 4)" | jq -r .id)
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
DAEMON_DEVICE=$DP_DEVICES start_daemon "$WORK/state" --max_devices_per_user=1
expect_cli_error RESOURCE_EXHAUSTED \
  "train.devices $N exceeds --max_devices_per_user 1; the job can never run on this daemon" \
  submit "$(dp_job many "$N" 4)"
expect_cli_error RESOURCE_EXHAUSTED \
  "train.devices $N exceeds --max_devices_per_user 1 (train.devices: all is this daemon's $N devices)" \
  submit "$(dp_job all all 4)"
for job in "$capped" "$behind"; do
  json=$(cli get "$job" --json)
  [[ $(json_field "$json" .state) == SUSPENDED ]] || fail "$job not held: $json"
  [[ $(json_field "$json" .status_message) == *"held at start-up: train.devices $N exceeds --max_devices_per_user 1"* ]] ||
    fail "$job message: $json"
done
expect_cli_error RESOURCE_EXHAUSTED "train.devices $N exceeds --max_devices_per_user 1" resume "$capped"
# The held jobs hold back nobody: a 1-device job runs.
one=$(cli --json submit "$(dp_job one 1 2)" | jq -r .id)
cli watch "$one" >/dev/null || fail "$one did not succeed: $(cli get "$one" --json)"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"

log "limit lifted: the held job resumes on every slot from its checkpoint"
DAEMON_DEVICE=$DP_DEVICES start_daemon "$WORK/state"
held_from=$(json_field "$(cli get "$capped" --json)" .resume_from)
[[ -d "$held_from" ]] || fail "$capped has no checkpoint to resume from: $(cli get "$capped" --json)"
cli resume "$capped" >/dev/null
wait_for_event "$capped" ".kind == \"state\" and .state == \"RUNNING\" and (.message | test(\"resuming on $DP_DEVICES from\"))" ||
  fail "$capped did not resume on every slot: $(cli get "$capped" --json)"
cli cancel "$capped" >/dev/null
cli cancel "$behind" >/dev/null
wait_for_event "$capped" '.kind == "state" and .state == "CANCELLED"' || fail "$capped not CANCELLED"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
