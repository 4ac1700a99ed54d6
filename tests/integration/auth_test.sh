#!/usr/bin/env bash
# Integration: every auth refusal with the real daemon and CLI: no token,
# a bad token, another user's job (each command), another user's listing,
# and the loopback-only rule without a tokens file; path roots (a path
# outside --data_roots, a symbolic link out of it, an export outside
# --output_roots); and the audit log (`megatrain audit`, audit.jsonl).
source "$(dirname "$0")/lib.sh"

tokens="$WORK/tokens.yaml"
write_tokens "$tokens" alice:user bob:user root:admin

log "without --auth_tokens a non-loopback --listen is refused"
rc=0
"$DAEMON_BIN" --listen=0.0.0.0:0 --metrics_listen=127.0.0.1:0 --state_dir="$WORK/refused" --device=cpu \
  >/dev/null 2>"$WORK/refused.log" || rc=$?
[[ $rc == 1 ]] || fail "expected exit 1, got $rc"
grep -q "serves only loopback" "$WORK/refused.log" || fail "$(cat "$WORK/refused.log")"

mkdir -p "$WORK/out"
start_daemon "$WORK/state" --auth_tokens="$tokens" --data_roots="$SOURCE_DIR/examples" \
  --output_roots="$WORK/out"
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

log "path roots"
outside=$(realpath "$WORK")/outside
mkdir -p "$outside"
cp -r "$TINY_DATA" "$outside/tiny"
outside_job=$(write_job outside 5)
sed -i "s|tokens: .*|tokens: $outside/tiny|" "$outside_job"
expect_cli_error PERMISSION_DENIED "data.tokens: '$outside/tiny' is outside the daemon's data roots" \
  --token alice-secret submit "$outside_job"
# A symbolic link inside a data root that leads out of it (made in the
# work directory, linked from a temporary root).
link_root="$WORK/linkroot"
mkdir -p "$link_root"
ln -s "$outside" "$link_root/escape"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
start_daemon "$WORK/state" --auth_tokens="$tokens" \
  --data_roots="$SOURCE_DIR/examples,$link_root" --output_roots="$WORK/out"
escape_job=$(write_job escape 5)
sed -i "s|tokens: .*|tokens: $link_root/escape/tiny|" "$escape_job"
expect_cli_error PERMISSION_DENIED "resolves to '$outside/tiny'" --token alice-secret submit "$escape_job"
done_job=$(MEGATRAIN_TOKEN=alice-secret cli --json submit "$(write_job short 6)" | jq -r .id)
MEGATRAIN_TOKEN=alice-secret cli watch "$done_job" >/dev/null || fail "short job"
checkpoint=$(MEGATRAIN_TOKEN=alice-secret cli --json checkpoints "$done_job" | jq -r '.checkpoints[-1].id')
expect_cli_error PERMISSION_DENIED "out_dir: '$WORK/elsewhere' is outside the daemon's output roots" \
  --token alice-secret export "$checkpoint" --out "$WORK/elsewhere"
MEGATRAIN_TOKEN=alice-secret cli export "$checkpoint" --out "$WORK/out/hf" >/dev/null \
  || fail "export inside --output_roots"
[[ -f "$WORK/out/hf/config.json" ]] || fail "export wrote no config.json"

log "audit log"
expect_cli_error PERMISSION_DENIED "the audit log is for admins" --token alice-secret audit
audit=$(cli --token root-secret --json audit --all)
# bob's refused cancel of alice's job, with who, what, when and the code.
jq -e --arg job "$job" '.records[] | select(.method == "CancelJob" and .user == "bob"
    and .target == $job and .code == "PERMISSION_DENIED" and (.time | test("Z$")))' \
  <<<"$audit" >/dev/null || fail "no audit record of bob's refused cancel: $audit"
jq -e --arg job "$job" '.records[] | select(.method == "CancelJob" and .user == "root"
    and .code == "OK")' <<<"$audit" >/dev/null || fail "no audit record of root's cancel"
jq -e '.records[] | select(.method == "SubmitJob" and .code == "PERMISSION_DENIED")' \
  <<<"$audit" >/dev/null || fail "no audit record of the refused submission"
jq -e '.records[] | select(.method == "ExportCheckpoint" and .code == "OK")' \
  <<<"$audit" >/dev/null || fail "no audit record of the export"
[[ $(cli --token root-secret --json audit --user bob --method CancelJob | jq '.records | length') -ge 1 ]] \
  || fail "audit --user bob --method CancelJob"
cli --token root-secret audit --job "$job" | grep -q "PERMISSION_DENIED" || fail "audit table"
# The JSON-lines copy, one object per mutating call.
[[ -s "$WORK/state/audit.jsonl" ]] || fail "no audit.jsonl"
jq -se 'any(.[]; .method == "CancelJob" and .user == "bob")' "$WORK/state/audit.jsonl" >/dev/null \
  || fail "audit.jsonl lacks bob's cancel"
[[ $(stat -c %a "$WORK/state/audit.jsonl") == 600 ]] || fail "audit.jsonl mode"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
