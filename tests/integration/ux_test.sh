#!/usr/bin/env bash
# Integration (issue 20, "what a new user ran into"), against the real
# megatraind (real engine, CPU) and CLI:
#   - submit checks (Note [Submit checks]): a missing data path, a truncated
#     shard, a shard for a larger vocabulary, a truncated safetensors file,
#     eval.every_steps without an eval set, seq_len above
#     max_position_embeddings (and the override) are refused at once with
#     INVALID_ARGUMENT naming the field, exit code 2;
#   - a forced cancel ends a running job CANCELLED;
#   - resume of a running job and checkpoint of a finished one fail at once
#     with FAILED_PRECONDITION; status text stays out of error_message;
#   - --version on megatraind and megatrain, megatrain_build_info;
#   - a CPU daemon exports no MFU or PCIe samples;
#   - --output_group makes job outputs group-readable.
source "$(dirname "$0")/lib.sh"

"$DAEMON_BIN" --version | grep -q '^megatraind [0-9]' || fail "megatraind --version"
"$CLI_BIN" --version | grep -q '^megatrain [0-9]' || fail "megatrain --version"
"$CLI_BIN" --help | grep -q 'megatrain tokenize' || fail "tokenize not in megatrain --help"

group=$(id -gn)
start_daemon "$WORK/state" --host_memory_budget=4GiB --output_group="$group"
[[ $(stat -c %a "$WORK/state") == 710 ]] || fail "state dir mode $(stat -c %a "$WORK/state")"
[[ $(stat -c %a "$WORK/state/jobs") == 2750 ]] || fail "jobs dir mode $(stat -c %a "$WORK/state/jobs")"

# expect_refused CODE SUBSTRING FILE: submit must fail at once, exit 2.
expect_refused() {
  local substring=$1 file=$2 err rc=0
  err=$(cli submit "$file" 2>&1 >/dev/null) || rc=$?
  [[ $rc == 2 ]] || fail "submit $file: exit $rc, want 2: $err"
  [[ "$err" == *"INVALID_ARGUMENT"* && "$err" == *"$substring"* ]] ||
    fail "submit $file: want INVALID_ARGUMENT '$substring', got: $err"
  log "refused: $(head -n 1 <<<"$err" | cut -c1-160)"
}

log "submit checks"
missing=$(write_job missing 10)
sed -i "s|tokens: .*|tokens: $WORK/no-such-data|" "$missing"
expect_refused "data.tokens: $WORK/no-such-data" "$missing"

mkdir -p "$WORK/truncated"
cp "$TINY_DATA"/*.mtt "$WORK/truncated/"
shard=$(ls "$WORK/truncated"/*.mtt | head -n 1)
truncate -s -100 "$shard"
truncated=$(write_job truncated 10)
sed -i "s|tokens: .*|tokens: $WORK/truncated|" "$truncated"
expect_refused "truncated copy?" "$truncated"

printf '{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n' >"$WORK/sft.jsonl"
"$CLI_BIN" tokenize --format sft --vocab_size 1000 --tokenizer "$SOURCE_DIR/examples/data/tiny-spm.model" \
  "$WORK/sft.jsonl" --out "$WORK/wide" >/dev/null || fail "tokenize --format sft"
wide=$(write_job wide 10)
sed -i "s|tokens: .*|tokens: $WORK/wide|" "$wide"
expect_refused "was written for vocab_size 1000 (its header), above the model's vocab_size 512" "$wide"

noeval=$(write_job noeval 10 "eval: {every_steps: 5}")
expect_refused "eval.every_steps: 5 but the job has no eval set" "$noeval"

long=$(write_job longseq 10)
sed -i "s|seq_len: 128|seq_len: 4096|" "$long"
expect_refused "train.seq_len: 4096 is above the model's max_position_embeddings 2048" "$long"

mkdir -p "$WORK/hf"
cp "$SOURCE_DIR/tests/testdata/hf/llama/config.json" "$SOURCE_DIR/tests/testdata/hf/llama/model.safetensors" "$WORK/hf/"
truncate -s -64 "$WORK/hf/model.safetensors"
# The fixture's vocab_size is 128 and max_position_embeddings 64: data and
# seq_len that fit it, so that the weights are what is refused.
"$CLI_BIN" tokenize --format sft --vocab_size 128 --tokenizer "$SOURCE_DIR/examples/data/tiny-spm.model" \
  "$WORK/sft.jsonl" --out "$WORK/small" >/dev/null || fail "tokenize --format sft (128)"
hf=$(write_job hf 10)
sed -i -e "s|preset: tiny|hf_dir: $WORK/hf|" -e "s|tokens: .*|tokens: $WORK/small|" \
  -e "s|seq_len: 128|seq_len: 8|" "$hf"
expect_refused "model.hf_dir: $WORK/hf/model.safetensors" "$hf"

log "forced cancel of a running job"
big=$(write_job big 100000 "")
sed -i "s|micro_batch: 8|micro_batch: 4|; s|seq_len: 128|seq_len: 512|" "$big"
job=$(cli --json submit "$big" | jq -r .id)
wait_for_event "$job" '.kind == "step" and .step >= 1' 300 || fail "no step of $job"
expect_cli_error FAILED_PRECONDITION "only SUSPENDED jobs resume" resume "$job"
t0=$(date +%s)
cli cancel --force "$job" >/dev/null || fail "cancel --force"
wait_for_event "$job" '.kind == "state" and .state == "CANCELLED"' 120 || fail "$job not CANCELLED"
log "forced cancel took $(( $(date +%s) - t0 )) s"
json=$(cli get "$job" --json)
[[ $(json_field "$json" .error_message) == "" ]] || fail "status text in error_message: $json"
[[ $(json_field "$json" .status_message) == *"cancel"* ]] || fail "status_message: $json"
expect_cli_error FAILED_PRECONDITION "only RUNNING jobs checkpoint" checkpoint "$job"
[[ $(stat -c %G "$WORK/state/jobs/$job") == "$group" ]] || fail "job dir group"

log "metrics on a CPU daemon"
metrics=$(curl -sf "http://$METRICS_ADDR/metrics") || fail "no /metrics"
grep -q '^megatrain_build_info{version="' <<<"$metrics" || fail "no megatrain_build_info"
grep -q '^megatrain_tokens_total [1-9]' <<<"$metrics" || fail "no tokens counted"
if grep -E '^megatrain_(mfu_ratio|pcie_bytes_total|pcie_bandwidth_bytes_per_second)\{' <<<"$metrics"; then
  fail "a CPU daemon exported MFU or PCIe samples"
fi

stop_daemon || fail "daemon exit $?"
log "PASS"
