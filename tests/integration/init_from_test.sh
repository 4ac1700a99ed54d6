#!/usr/bin/env bash
# Integration: model.init_from (docs/job-spec.md, "Starting from a
# checkpoint") through the real megatraind, engine and CLI, on the CPU.
#   * job A trains 8 steps with checkpoints at 4 and 8;
#   * B, `init_from: A/step-4` (fresh AdamW): its first loss is A's step-5
#     loss (A's step-4 weights on the same batch), it counts its steps from
#     1, and its second loss is not A's step 6 (zero moments, its own
#     warm-up);
#   * C, `{checkpoint: A/step-4, optimizer: restore}` (given as `megatrain
#     submit --init_from A/step-4 --optimizer restore`): runs steps 5..8
#     with A's losses of those steps, bit for bit; the flags alone or with
#     the file's own init_from are usage errors (exit 2);
#   * the same two on two CPU device slots (train.devices 2, gloo), with
#     the AdamW moments on the NVMe tier (memory.nvme_tier: moments), and
#     with both at once;
#   * another user's checkpoint is PERMISSION_DENIED (exit 6), a deleted
#     checkpoint and an unknown job NOT_FOUND (exit 4), a path
#     INVALID_ARGUMENT (exit 2), each naming model.init_from.checkpoint; a
#     restore that leaves no step after the checkpoint's is INVALID_ARGUMENT
#     naming train.max_steps; the audit log's SubmitJob record names the
#     checkpoint bob tried.
# Why the losses can be compared: the data is one 31-token document, so the
# stream repeats every 32 tokens (31 + EOS; Note [Packing rule] in
# engine/data/data_loader.h) and with seq_len 16 and micro_batch 2 every
# micro-batch is the same two windows. A step's loss then depends only on
# the weights and AdamW state, not on where the data cursor stands (an
# init_from job reads its data from its start).
source "$(dirname "$0")/lib.sh"

tokens="$WORK/tokens.yaml"
write_tokens "$tokens" alice:user bob:user root:admin

log "one 31-token document"
python3 -c 'import json; print(json.dumps({"input_ids": list(range(3, 34))}))' >"$WORK/one.jsonl"
"$CLI_BIN" tokenize --format sft --vocab_size 512 "$WORK/one.jsonl" --out "$WORK/one" \
  >"$WORK/tokenize.log" 2>&1 || fail "tokenize: $(cat "$WORK/tokenize.log")"

# one_job NAME MAX_STEPS [MODEL_EXTRA] [TOP_EXTRA]: tiny on the one-window
# data, 2 micro-batches a step (so that 2 devices split them), checkpoints
# every 4 steps. MODEL_EXTRA goes into model:, TOP_EXTRA (e.g. a memory:
# line) at the top level; $DEVICES, when set, is train.devices.
one_job() {
  local path="$WORK/$1.yaml"
  cat >"$path" <<YAML
name: $1
model: {preset: tiny ${3:+, $3}}
data: {tokens: $WORK/one}
train: {micro_batch: 2, seq_len: 16, gradient_accumulation_steps: 2, max_steps: $2,
        compute_dtype: fp32 ${DEVICES:+, devices: $DEVICES}}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
checkpoint: {every_steps: 4, keep_last: 3}
${4:-}
YAML
  echo "$path"
}

# losses JOB: "step loss" lines of the job's applied steps.
losses() {
  alice --json watch "$1" | jq -r 'select(.kind == "step") | "\(.step) \(.loss)"' | sort -n -u
}

# run_job FILE [SUBMIT_FLAGS...]: submits as alice, waits for SUCCEEDED,
# prints the id.
run_job() {
  local id
  id=$(alice --json submit "$@" | jq -r .id)
  [[ "$id" == job-* ]] || fail "submit $1 failed"
  alice watch "$id" >/dev/null || fail "$id ($1) did not succeed: $(alice get "$id" --json)"
  echo "$id"
}

alice() { cli --token alice-secret "$@"; }

# expect_exit RC CODE SUBSTRING ARGS...: the CLI fails with exit RC, the
# gRPC code's name and SUBSTRING in its message.
expect_exit() {
  local want_rc=$1 code=$2 substring=$3 err rc=0
  shift 3
  err=$(cli "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc == "$want_rc" && "$err" == *"$code"* && "$err" == *"$substring"* ]] ||
    fail "'$*': want exit $want_rc $code '$substring', got exit $rc: $err"
  log "refused: $(head -n 1 <<<"$err" | cut -c1-160)"
}

# check_fresh_and_restored LABEL A_LOSSES FRESH_ID RESTORED_ID: B's first
# loss is A's step 5, its second not A's step 6; C's steps are 5..8 with
# A's losses of those steps.
check_fresh_and_restored() {
  local label=$1 a=$2 fresh restored
  fresh=$(losses "$3")
  restored=$(losses "$4")
  [[ $(head -n 1 <<<"$fresh") == "1 $(sed -n 5p <<<"$a" | cut -d' ' -f2)" ]] ||
    fail "$label fresh: first loss is not A's step 5: fresh [$fresh] A [$a]"
  [[ $(sed -n 2p <<<"$fresh" | cut -d' ' -f2) != $(sed -n 6p <<<"$a" | cut -d' ' -f2) ]] ||
    fail "$label fresh: the second step is A's step 6: a fresh AdamW should differ"
  [[ $(wc -l <<<"$fresh") == 4 ]] || fail "$label fresh: not 4 steps: [$fresh]"
  [[ "$restored" == "$(sed -n '5,8p' <<<"$a")" ]] ||
    fail "$label restore: steps 5..8 differ from A's: restored [$restored] A [$a]"
  log "$label: fresh starts at A's step-5 loss; restore continues A bit for bit"
}

mkdir -p "$WORK/nvme"
chmod 700 "$WORK/nvme"
DAEMON_DEVICE=cpu,cpu:1 start_daemon "$WORK/state" --auth_tokens="$tokens" \
  --data_roots="$WORK" --nvme_dir="$WORK/nvme" --nvme_budget=1GiB

log "job A: 8 steps, checkpoints at 4 and 8"
a=$(run_job "$(one_job a 8)")
a_losses=$(losses "$a")
[[ $(wc -l <<<"$a_losses") == 8 ]] || fail "A's steps: [$a_losses]"
[[ $(alice --json checkpoints "$a" | jq -r '[.checkpoints[].id] | join(" ")') == "$a/step-4 $a/step-8" ]] ||
  fail "A's checkpoints: $(alice --json checkpoints "$a")"

log "B (fresh) and C (restore) on one device"
b=$(run_job "$(one_job b 4 "init_from: $a/step-4")")
# C through the CLI's flags rather than the job file.
c=$(run_job "$(one_job c 8)" --init_from "$a/step-4" --optimizer restore)
check_fresh_and_restored "1 device" "$a_losses" "$b" "$c"
json=$(alice get "$c" --json)
[[ $(json_field "$json" .spec.model.init_from.checkpoint) == "$a/step-4" &&
   $(json_field "$json" .spec.model.init_from.optimizer) == restore ]] ||
  fail "GetJob does not show init_from: $(json_field "$json" .spec.model)"
alice get "$c" | grep -qE "^init from: +$a/step-4 \(optimizer restore\)$" ||
  fail "megatrain get does not show init_from: $(alice get "$c")"

log "the same on 2 CPU device slots (gloo)"
probe_out=$(DEVICES=2 alice submit "$(one_job probe 2)" 2>&1) || true
if [[ "$probe_out" == *"no c10d backend"* ]]; then
  log "SKIP (2 devices): this build's LibTorch has no gloo"
else
  probe=$(alice --json list | jq -r '.jobs[] | select(.name == "probe") | .id')
  alice watch "$probe" >/dev/null || fail "probe job: $probe_out $(alice get "$probe" --json)"
  b2=$(run_job "$(DEVICES=2 one_job b2 4 "init_from: $a/step-4")")
  c2=$(run_job "$(DEVICES=2 one_job c2 8 "init_from: {checkpoint: $a/step-4, optimizer: restore}")")
  check_fresh_and_restored "2 devices" "$a_losses" "$b2" "$c2"
  alice --json watch "$c2" | jq -se '[.[] | select(.kind == "step")] | length == 4 and
    all(.devices == 2)' >/dev/null || fail "$c2 did not train on 2 devices"
  # Both at once: each rank's shard of the moments in its own files
  # (Note [Tier shards] in engine/store/nvme_tier.h).
  dp_nvme="memory: {nvme_tier: moments}"
  b4=$(run_job "$(DEVICES=2 one_job b4 4 "init_from: $a/step-4" "$dp_nvme")")
  c4=$(run_job "$(DEVICES=2 one_job c4 8 "init_from: {checkpoint: $a/step-4, optimizer: restore}" \
    "$dp_nvme")")
  check_fresh_and_restored "2 devices, NVMe tier" "$a_losses" "$b4" "$c4"
  alice --json watch "$c4" | jq -se '[.[] | select(.kind == "step") | .nvme_read_bytes // 0] |
    add > 0' >/dev/null || fail "$c4 did not run with the tier: $(alice --json watch "$c4" | tail -n 2)"
fi

log "the same with the AdamW moments on the NVMe tier"
nvme="memory: {nvme_tier: moments}"
b3=$(run_job "$(one_job b3 4 "init_from: $a/step-4" "$nvme")")
c3=$(run_job "$(one_job c3 8 "init_from: {checkpoint: $a/step-4, optimizer: restore}" "$nvme")")
check_fresh_and_restored "NVMe tier" "$a_losses" "$b3" "$c3"
# Its optimizer read the restored moments back from the tier's files.
alice --json watch "$c3" | jq -se '[.[] | select(.kind == "step") | .nvme_read_bytes // 0] | add > 0' \
  >/dev/null || fail "$c3 did not run with the tier: $(alice --json watch "$c3" | tail -n 2)"

log "refusals at submit, each naming model.init_from.checkpoint"
expect_exit 6 PERMISSION_DENIED "model.init_from.checkpoint" --token bob-secret \
  submit "$(one_job bobs 4 "init_from: $a/step-4")"
# The audit log names the checkpoint bob tried to start from.
cli --token root-secret --json audit --user bob --method SubmitJob |
  jq -e --arg c "$a/step-4" '.records[0] | .code == "PERMISSION_DENIED" and
    (.detail | contains("init_from=" + $c + " optimizer=fresh"))' >/dev/null ||
  fail "audit of bob's submit: $(cli --token root-secret --json audit --user bob)"
alice delete-checkpoint "$a/step-8" >/dev/null || fail "delete-checkpoint $a/step-8"
expect_exit 4 NOT_FOUND "model.init_from.checkpoint" --token alice-secret \
  submit "$(one_job deleted 4 "init_from: $a/step-8")"
expect_exit 4 NOT_FOUND "model.init_from.checkpoint" --token alice-secret \
  submit "$(one_job unknown 4 "init_from: job-999999/step-4")"
expect_exit 2 INVALID_ARGUMENT "train.max_steps: 4 leaves nothing to train after model.init_from" \
  --token alice-secret submit "$(one_job short 4 "init_from: {checkpoint: $a/step-4, optimizer: restore}")"
expect_exit 2 INVALID_ARGUMENT "--optimizer: only with --init_from" \
  --token alice-secret submit "$(one_job flags 4)" --optimizer restore
expect_exit 2 INVALID_ARGUMENT "--init_from: the job file has model.init_from ($a/step-4) already" \
  --token alice-secret submit "$(one_job twice 4 "init_from: $a/step-4")" --init_from "$a/step-8"
expect_exit 2 INVALID_ARGUMENT "model.init_from.checkpoint: expected '<job id>/step-<step>'" \
  --token alice-secret submit "$(one_job path 4 "init_from: $WORK/state")"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
