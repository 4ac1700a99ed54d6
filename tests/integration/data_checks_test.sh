#!/usr/bin/env bash
# Integration (issue 35, "chat SFT silently trains on nothing"; "data checks
# that come too late"), against the real megatraind (real engine, CPU) and
# CLI:
#   - a released-style chat template (no {% generation %} blocks) gives
#     trained tokens: megatrain_client.chat_template then `megatrain tokenize
#     --format chat` report them, tokenize.json counts them;
#   - chat JSONL given as data.text, with a tokenizer directory larger than
#     the model's vocabulary, is refused at submit with both problems at
#     once (INVALID_ARGUMENT, exit 2), each naming its field;
#   - data.tokens whose tokenize.json counts no trained token is refused;
#   - a spec with several bad fields names them all;
#   - a missing model.hf_dir is INVALID_ARGUMENT (exit 2); an unknown job is
#     NOT_FOUND (exit 4).
source "$(dirname "$0")/lib.sh"

CHAT="$SOURCE_DIR/tests/testdata/chat"
QWEN="$SOURCE_DIR/tests/testdata/tokenizers/qwen2-bpe"

log "chat SFT with a released template trains on the answers"
PYTHONPATH="$SOURCE_DIR/client/python" python3 -m megatrain_client.chat_template \
  --model "$CHAT/qwen2-chatml-released" "$CHAT/sharegpt.jsonl" "$WORK/rendered.jsonl" \
  2>"$WORK/render.log" || fail "chat_template: $(cat "$WORK/render.log")"
grep -q "3 conversations rendered, 0 refused" "$WORK/render.log" || fail "$(cat "$WORK/render.log")"
grep -q "assistant masks from prefix renders" "$WORK/render.log" || fail "$(cat "$WORK/render.log")"
"$CLI_BIN" tokenize --format chat --tokenizer "$QWEN" --max_document_tokens 64 --json \
  "$WORK/rendered.jsonl" --out "$WORK/chat" >"$WORK/tokenize.json" || fail "tokenize --format chat"
trained=$(jq -r .trained_tokens "$WORK/tokenize.json")
[[ $trained -gt 0 ]] || fail "no trained tokens: $(cat "$WORK/tokenize.json")"
[[ $(jq -r .truncated_documents "$WORK/tokenize.json") == 1 ]] || fail "$(cat "$WORK/tokenize.json")"
[[ $(jq -r .trained_tokens "$WORK/chat/tokenize.json") == "$trained" ]] || fail "tokenize.json"
log "tokenized: $trained trained tokens"

# expect_refused SUBSTRING FILE: submit fails at once with INVALID_ARGUMENT, exit 2.
expect_refused() {
  local substring=$1 file=$2 err rc=0
  err=$(cli submit "$file" 2>&1 >/dev/null) || rc=$?
  [[ $rc == 2 ]] || fail "submit $file: exit $rc, want 2: $err"
  [[ "$err" == *"INVALID_ARGUMENT"* && "$err" == *"$substring"* ]] ||
    fail "submit $file: want INVALID_ARGUMENT '$substring', got: $err"
  log "refused: $(head -n 1 <<<"$err" | cut -c1-200)"
}

start_daemon "$WORK/state" --host_memory_budget=4GiB

log "chat JSONL as data.text, and a tokenizer directory above the model's vocab"
text=$(write_job chat-as-text 10)
sed -i -e "s|tokens: .*|text: $CHAT/openai.jsonl\n  tokenizer: $QWEN|" "$text"
expect_refused "data.text: $CHAT/openai.jsonl:1: this is chat data" "$text"
expect_refused "data.tokenizer: $QWEN has 2000 ids, more than the model's vocab_size 512" "$text"

log "data.tokens with no trained token"
printf '{"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]}\n' >"$WORK/untrained.jsonl"
rc=0
"$CLI_BIN" tokenize --format sft --vocab_size 512 "$WORK/untrained.jsonl" --out "$WORK/untrained" \
  2>"$WORK/untrained.log" || rc=$?
[[ $rc == 1 ]] && grep -q "no document with trained tokens" "$WORK/untrained.log" ||
  fail "tokenize of untrained data: rc $rc, $(cat "$WORK/untrained.log")"
mkdir -p "$WORK/zero"
printf '{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n' >"$WORK/plain.jsonl"
"$CLI_BIN" tokenize --format sft --vocab_size 512 "$WORK/plain.jsonl" --out "$WORK/zero" \
  >/dev/null || fail "tokenize --format sft"
jq '.trained_tokens = 0' "$WORK/zero/tokenize.json" >"$WORK/zero/tokenize.json.new"
mv "$WORK/zero/tokenize.json.new" "$WORK/zero/tokenize.json"
zero=$(write_job zero 10)
sed -i -e "s|tokens: .*|tokens: $WORK/zero|" -e "s|seq_len: 128|seq_len: 4|" -e "s|micro_batch: 8|micro_batch: 1|" "$zero"
expect_refused "data.tokens: $WORK/zero/tokenize.json: no trained token" "$zero"

log "several bad fields at once"
bad=$(write_job bad 10)
sed -i -e "s|micro_batch: 8|micro_batch: 0|" -e "s|seq_len: 128|seq_len: 0|" "$bad"
expect_refused "train.micro_batch: must be in [1, 4096], got 0; train.seq_len: must be in" "$bad"

log "exit codes"
hf=$(write_job nohf 10)
sed -i "s|preset: tiny|hf_dir: $WORK/no-such-model|" "$hf"
expect_refused "model.hf_dir: '$WORK/no-such-model'" "$hf"
rc=0
cli get job-999999 >/dev/null 2>&1 || rc=$?
[[ $rc == 4 ]] || fail "get of an unknown job: exit $rc, want 4 (NOT_FOUND)"

stop_daemon || fail "daemon exit $?"
log "PASS"
