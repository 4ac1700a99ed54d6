#!/usr/bin/env bash
# Integration (issue 14, reads confined at use time; Note [Confined reads] in
# engine/fs/dir_fd.h): with the real daemon, engine and CLI,
#  1. a token shard reached through a symbolic link that stays inside the
#     data root trains;
#  2. one whose link leads out of the data root (to a file the daemon could
#     read) fails the job with PERMISSION_DENIED naming data.tokens and the
#     path; the daemon never checked the directory's entries at submission,
#     so only the use-time open stands in the way;
#  3. a FIFO as the model.safetensors of model.hf_dir is refused at
#     submission naming the file, instead of blocking a thread
#     in open(2) for ever;
#  4. SIGTERM then ends the daemon within --shutdown_timeout.
source "$(dirname "$0")/lib.sh"

data=$(realpath -m "$WORK/data")
out=$(realpath -m "$WORK/out")
secret=$(realpath -m "$WORK/secret")
mkdir -p "$data/real" "$data/inside" "$data/escape" "$secret" "$out"
cp "$TINY_DATA"/train-00000.mtt "$data/real/"
cp "$TINY_DATA"/train-00000.mtt "$secret/"
ln -s ../real/train-00000.mtt "$data/inside/train-00000.mtt"
ln -s "$secret/train-00000.mtt" "$data/escape/train-00000.mtt"
# An HF model directory whose weights file is a FIFO (the config is the
# test model's, with a vocabulary that covers the tiny data).
mkdir -p "$data/model"
jq '.vocab_size = 32000 | .max_position_embeddings = 4096' "$SOURCE_DIR/tests/testdata/hf/llama/config.json" >"$data/model/config.json"
mkfifo "$data/model/model.safetensors"
start_daemon "$WORK/state" --data_roots="$data" --output_roots="$out" --shutdown_timeout=5

# job_reading NAME TOKENS_DIR: a short job (6 steps, past warmup) of the tiny preset reading TOKENS_DIR.
job_reading() {
  local path
  path=$(write_job "$1" 6 "output_dir: $out/$1")
  sed -i "s|tokens: $TINY_DATA|tokens: $2|" "$path"
  echo "$path"
}

log "1. a link that stays inside the data root is read"
job=$(cli --json submit "$(job_reading inside "$data/inside")" | jq -r .id)
cli watch "$job" >/dev/null || fail "$job did not succeed: $(cli get "$job" --json)"

log "2. a link out of the data root fails the job at the open"
job=$(cli --json submit "$(job_reading escape "$data/escape")" | jq -r .id)
[[ "$job" == job-* ]] || fail "the submission was refused; the link is inside a directory"
wait_for_event "$job" '.kind == "state" and .state == "FAILED"' 300 || fail "$job did not fail"
json=$(cli get "$job" --json)
msg=$(json_field "$json" .error_message)
[[ "$msg" == *"data.tokens"* && "$msg" == *"$data/escape/train-00000.mtt: resolves outside $data"* ]] ||
  fail "message: $json"
[[ $(json_field "$json" .error_code) == *PERMISSION_DENIED* || $(json_field "$json" .error_code) == 7 ]] ||
  fail "error code: $json"

log "3. a FIFO as model.safetensors is refused clearly, without blocking"
# The submit checks (server/core/submit_checks.h) stat the weights files
# before reading any: a FIFO is refused at submission, naming it.
fifo_job=$(job_reading fifo "$data/real")
sed -i "s|  preset: tiny|  hf_dir: $data/model|" "$fifo_job"
if out=$(cli --json submit "$fifo_job" 2>&1); then
  fail "a FIFO as model.safetensors was accepted: $out"
fi
[[ "$out" == *"INVALID_ARGUMENT"*"$data/model/model.safetensors: not a regular file"* ]] ||
  fail "message: $out"

log "4. SIGTERM ends the daemon within --shutdown_timeout"
start=$(date +%s)
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
(($(date +%s) - start <= 10)) || fail "shutdown took $(($(date +%s) - start)) s"
log "PASS"
