#!/usr/bin/env bash
# Integration: every auth refusal with the real daemon and CLI: no token,
# a bad token, another user's job (each command), another user's listing,
# and the loopback-only rule without a tokens file.
source "$(dirname "$0")/lib.sh"

tokens="$WORK/tokens.yaml"
{
  echo "users:"
  echo "  - {name: alice, role: user, token_sha256: $(printf alice-secret | "$CLI_BIN" hash-token)}"
  echo "  - {name: bob, role: user, token_sha256: $(printf bob-secret | "$CLI_BIN" hash-token)}"
  echo "  - {name: root, role: admin, token_sha256: $(printf root-secret | "$CLI_BIN" hash-token)}"
} >"$tokens"

log "without --auth_tokens a non-loopback --listen is refused"
rc=0
"$DAEMON_BIN" --listen=0.0.0.0:0 --metrics_listen=127.0.0.1:0 --state_dir="$WORK/refused" --device=cpu \
  >/dev/null 2>"$WORK/refused.log" || rc=$?
[[ $rc == 1 ]] || fail "expected exit 1, got $rc"
grep -q "serves only loopback" "$WORK/refused.log" || fail "$(cat "$WORK/refused.log")"

start_daemon "$WORK/state" --auth_tokens="$tokens"
job=$(MEGATRAIN_TOKEN=alice-secret cli --json submit "$(write_job alices 100000)" | jq -r .id)
[[ "$job" == job-* ]] || fail "alice could not submit"

expect_cli_error UNAUTHENTICATED "missing bearer token" get "$job"
expect_cli_error UNAUTHENTICATED "invalid bearer token" --token wrong get "$job"
expect_cli_error UNAUTHENTICATED "invalid bearer token" --token wrong status
for command in "get $job" "watch $job" "cancel $job" "suspend $job" "resume $job" \
               "checkpoint $job" "checkpoints $job" "export $job/step-1 --out $WORK/x" \
               "delete-checkpoint $job/step-1" "list --owner alice"; do
  # shellcheck disable=SC2086
  expect_cli_error PERMISSION_DENIED "" --token bob-secret $command
done
[[ $(cli --token bob-secret list --json | jq '.jobs | length') == 0 ]] || fail "bob sees jobs"
[[ $(cli --token root-secret get "$job" --json | jq -r .owner) == alice ]] || fail "admin get"
cli --token root-secret cancel "$job" >/dev/null || fail "admin cancel"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
