#!/usr/bin/env bash
# Integration: the real megatraind (real engine, CPU) driven by the real CLI
# over loopback. Covers: submit -> SUCCEEDED with falling loss, the watch
# stream, checkpoints and export, pagination, cancel, suspend/resume,
# idempotent resubmit, each invalid-spec case, admission refusal, SIGTERM.
source "$(dirname "$0")/lib.sh"

# 4 GiB budget: the tiny model fits, llama-8b (~128 GB of fp32 state) never.
start_daemon "$WORK/state" --host_memory_budget=4GiB

log "submit tiny --wait"
out=$(cli submit "$TINY_JOB" --wait) || fail "submit --wait did not succeed: $out"
job=$(grep -o 'job-[0-9]*' <<<"$out" | head -n 1)
[[ "$out" == *"$job ended SUCCEEDED"* ]] || fail "no SUCCEEDED line: $out"

log "get --json"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .state) == SUCCEEDED ]] || fail "state: $json"
[[ $(json_field "$json" .progress.step) == 60 ]] || fail "step: $json"

log "loss falls (from the watch stream's history)"
events=$(cli --json watch "$job")
first=$(jq -s '[.[] | select(.kind == "step")] | .[0].loss' <<<"$events")
last=$(jq -s '[.[] | select(.kind == "step")] | .[-1].loss' <<<"$events")
steps=$(jq -s '[.[] | select(.kind == "step")] | length' <<<"$events")
[[ "$steps" -ge 60 ]] || fail "expected >= 60 step events, got $steps"
jq -en "$last < $first" >/dev/null || fail "loss did not fall: first $first, last $last"
log "loss $first -> $last"

log "watch (human) ends with the final state"
human=$(cli watch "$job")
[[ "$human" == *"ended SUCCEEDED"* ]] || fail "watch: $human"

log "checkpoints --json and export"
ckpts=$(cli checkpoints "$job" --json)
count=$(jq '.checkpoints | length' <<<"$ckpts")
[[ "$count" -ge 1 && "$count" -le 2 ]] || fail "keep_last 2: $ckpts"
ckpt=$(jq -r '.checkpoints[-1].id' <<<"$ckpts")
[[ "$ckpt" == "$job/step-60" ]] || fail "last checkpoint: $ckpt"
cli export "$ckpt" --out "$WORK/hf" >/dev/null || fail "export failed"
[[ -f "$WORK/hf/config.json" ]] || fail "export wrote no config.json"
ls "$WORK/hf"/*.safetensors >/dev/null || fail "export wrote no safetensors"

log "idempotent resubmit"
long=$(write_job long 100000)
a=$(cli --json submit "$long" --request_id it-1 | jq -r .id)
b=$(cli --json submit "$long" --request_id it-1 | jq -r .id)
[[ "$a" == "$b" ]] || fail "resubmit made a second job: $a $b"

log "suspend / resume / cancel"
wait_for_event "$a" '.kind == "step" and .step >= 2' || fail "no step of $a"
cli suspend "$a" >/dev/null
wait_for_event "$a" '.kind == "state" and .state == "SUSPENDED"' || fail "$a never SUSPENDED"
json=$(cli get "$a" --json)
resume_from=$(json_field "$json" .resume_from)
[[ -n "$resume_from" && -d "$resume_from" ]] || fail "no checkpoint to resume from: $json"
suspended_step=$(json_field "$json" .progress.step)
cli resume "$a" >/dev/null
wait_for_event "$a" ".kind == \"step\" and .step > $suspended_step" ||
  fail "$a did not continue after resume"
json=$(cli get "$a" --json)
[[ $(json_field "$json" .state) == RUNNING ]] || fail "after resume: $json"

log "pagination"
c=$(cli --json submit "$long" | jq -r .id)
d=$(cli --json submit "$long" | jq -r .id)
page1=$(cli list --page_size 2 --json)
[[ $(jq '.jobs | length' <<<"$page1") == 2 ]] || fail "page 1: $page1"
[[ $(jq -r '.jobs[0].id' <<<"$page1") == "$d" ]] || fail "newest first: $page1"
token=$(jq -r .next_page_token <<<"$page1")
[[ -n "$token" ]] || fail "no next_page_token"
page2=$(cli list --page_size 2 --page_token "$token" --json)
[[ $(jq -r '.jobs[0].id' <<<"$page2") == "$a" ]] || fail "page 2: $page2"
all=$(cli list --all --page_size 1 --json)
[[ $(jq '.jobs | length' <<<"$all") == 4 ]] || fail "--all: $all"
[[ $(cli get "$c" --json | jq -r .state) == QUEUED ]] || fail "$c should wait for the device"

log "cancel queued and running jobs"
cli cancel "$c" >/dev/null
cli cancel "$d" >/dev/null
[[ $(cli get "$c" --json | jq -r .state) == CANCELLED ]] || fail "$c not CANCELLED"
cli cancel "$a" >/dev/null
rc=0
cli watch "$a" >/dev/null || rc=$?
[[ $rc == 3 ]] || fail "watch of a cancelled job should exit 3, got $rc"
[[ $(cli get "$a" --json | jq -r .state) == CANCELLED ]] || fail "$a not CANCELLED"
expect_cli_error FAILED_PRECONDITION "already ended" cancel "$job"

log "invalid specs (each names its field)"
bad() {  # NAME YAML_BODY FIELD
  local path="$WORK/bad-$1.yaml"
  printf '%s\n' "$2" >"$path"
  expect_cli_error INVALID_ARGUMENT "$3" submit "$path"
}
base="model: {preset: tiny}
data: {tokens: $TINY_DATA}"
bad micro_batch "$base
train: {micro_batch: 0, max_steps: 5}" "train.micro_batch"
bad seq_len "$base
train: {seq_len: 0, max_steps: 5}" "train.seq_len"
bad accumulation "$base
train: {gradient_accumulation_steps: 0, max_steps: 5}" "train.gradient_accumulation_steps"
bad no_length "$base
train: {micro_batch: 8}" "train.max_steps"
bad lr "$base
train: {max_steps: 5}
optimizer: {lr: -1}" "optimizer.lr"
bad schedule "$base
train: {max_steps: 5}
optimizer: {schedule: exponential}" "optimizer.schedule"
bad preset "model: {preset: gpt-17}
data: {tokens: $TINY_DATA}
train: {max_steps: 5}" "model.preset"
bad both_models "model: {preset: tiny, hf_dir: /nonexistent}
data: {tokens: $TINY_DATA}
train: {max_steps: 5}" "model"
bad no_data "model: {preset: tiny}
train: {max_steps: 5}" "data"
bad dtype "$base
train: {max_steps: 5, compute_dtype: fp16}" "train.compute_dtype"
bad unknown_key "$base
train: {max_steps: 5, micro_btch: 8}" "train.micro_btch: unknown key"
bad priority "$base
train: {max_steps: 5}
priority: 5000" "priority"
bad global_batch "$base
train: {micro_batch: 8, global_batch: 12, max_steps: 5}" "train.global_batch"

log "admission: a job that can never fit is refused with the numbers"
big="$WORK/big.yaml"
printf 'model: {preset: llama-8b}\ndata: {tokens: %s}\ntrain: {max_steps: 5, seq_len: 128}\n' \
  "$TINY_DATA" >"$big"
expect_cli_error RESOURCE_EXHAUSTED "--host_memory_budget is 4.00 GiB" submit "$big"

log "status and metrics"
cli status >/dev/null
metrics=$(cli metrics)
grep -q '^megatrain_tokens_total [1-9]' <<<"$metrics" || fail "no megatrain_tokens_total > 0"

log "SIGTERM: exit 0"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
