#!/usr/bin/env bash
# Integration (issue 14, shared-lab isolation) with the real daemon and CLI:
# a FIFO given as data.tokens or as the model's config.json fails that
# submission at once with INVALID_ARGUMENT naming the path; "{user}" data
# roots refuse another user's data without revealing anything about it;
# other users' calls go on throughout.
source "$(dirname "$0")/lib.sh"

tokens="$WORK/tokens.yaml"
write_tokens "$tokens" alice:user bob:user
data=$(realpath "$WORK")/data
mkdir -p "$data/alice" "$data/bob" "$WORK/out"
cp -r "$TINY_DATA" "$data/alice/tiny"
cp -r "$TINY_DATA" "$data/bob/tiny"
start_daemon "$WORK/state" --auth_tokens="$tokens" --data_roots="$data/{user}" \
  --output_roots="$WORK/out"

# bounded_cli TOKEN ARGS...: the CLI with a 60 s bound, so that a blocking
# open in the daemon fails the test instead of hanging it.
bounded_cli() {
  local token=$1
  shift
  timeout 60 "$CLI_BIN" --server "$GRPC_ADDR" --token "$token" "$@"
}

# expect_refusal CODE SUBSTRING TOKEN ARGS...
expect_refusal() {
  local code=$1 substring=$2 rc=0 err
  shift 2
  err=$(bounded_cli "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -ne 124 ]] || fail "'$*' did not return within 60 s"
  [[ $rc -ne 0 ]] || fail "expected '$*' to fail with $code"
  [[ "$err" == *"$code"* && "$err" == *"$substring"* ]] \
    || fail "expected $code '$substring' from '$*', got: $err"
  echo "$err"
}

log "a FIFO as data.tokens fails that submit"
mkfifo "$data/alice/tokens.fifo"
fifo_job=$(write_job fifo 5)
sed -i "s|tokens: .*|tokens: $data/alice/tokens.fifo|" "$fifo_job"
expect_refusal INVALID_ARGUMENT "data.tokens: '$data/alice/tokens.fifo' is a FIFO" \
  alice-secret submit "$fifo_job" >/dev/null

log "a FIFO as the model's config.json fails that submit"
mkdir -p "$data/alice/model"
mkfifo "$data/alice/model/config.json"
hf_job=$(write_job hf 5)
sed -i -e "s|preset: tiny|hf_dir: $data/alice/model|" -e "s|tokens: .*|tokens: $data/alice/tiny|" \
  "$hf_job"
expect_refusal INVALID_ARGUMENT "model.hf_dir: '$data/alice/model/config.json' is a FIFO" \
  alice-secret submit "$hf_job" >/dev/null

log "{user} data roots: alice cannot read bob's data, and learns nothing about it"
theirs=$(write_job theirs 5)
sed -i "s|tokens: .*|tokens: $data/bob/tiny|" "$theirs"
err=$(expect_refusal PERMISSION_DENIED \
  "data.tokens: '$data/bob/tiny' is outside the daemon's data roots ($data/{user}; --data_roots)" \
  alice-secret submit "$theirs")
missing=$(write_job missing 5)
sed -i "s|tokens: .*|tokens: $data/bob/nothing-here|" "$missing"
err_missing=$(expect_refusal PERMISSION_DENIED "outside the daemon's data roots" \
  alice-secret submit "$missing")
# The same words for bob's real data and for a path that does not exist.
[[ "${err//tiny/X}" == "${err_missing//nothing-here/X}" ]] \
  || fail "refusals differ: '$err' vs '$err_missing'"

log "bob trains on his own data meanwhile"
mine=$(write_job mine 6)
sed -i "s|tokens: .*|tokens: $data/bob/tiny|" "$mine"
job=$(bounded_cli bob-secret --json submit "$mine" | jq -r .id)
[[ "$job" == job-* ]] || fail "bob could not submit"
bounded_cli bob-secret watch "$job" >/dev/null || fail "bob's job"
[[ $(bounded_cli bob-secret --json get "$job" | jq -r .state) == SUCCEEDED ]] \
  || fail "bob's job did not succeed: $(bounded_cli bob-secret --json get "$job")"
mine_alice=$(write_job mine-alice 6)
sed -i "s|tokens: .*|tokens: $data/alice/tiny|" "$mine_alice"
job=$(bounded_cli alice-secret --json submit "$mine_alice" | jq -r .id)
[[ "$job" == job-* ]] || fail "alice could not submit her own data"

stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
