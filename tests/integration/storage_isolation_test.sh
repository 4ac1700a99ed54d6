#!/usr/bin/env bash
# Integration (issue 14, storage isolation): with the real daemon and CLI,
#  1. bob may not submit with an output_dir equal to, inside or containing
#     alice's (INVALID_ARGUMENT naming output_dir, not naming her job); alice
#     is told which of her jobs has it;
#  2. a checkpoint directory forged into alice's job directory is not
#     listed, exported or deleted (only recorded checkpoints are the job's);
#  3. a corrupt newest checkpoint is quarantined at resume (an event says
#     so) and the job resumes from the older one; with every checkpoint
#     corrupt the job fails with DATA_LOSS naming the files;
#  4. replacing the database file while the daemon runs makes writes fail
#     clearly; deleting it makes the next start refuse, saying what it found.
source "$(dirname "$0")/lib.sh"

tokens="$WORK/tokens.yaml"
write_tokens "$tokens" alice:user bob:user
out=$(realpath -m "$WORK/out")
mkdir -p "$out"
start_daemon "$WORK/state" --auth_tokens="$tokens" --data_roots="$SOURCE_DIR/examples" \
  --output_roots="$out"
alice() { cli --token alice-secret "$@"; }
export MEGATRAIN_TOKEN=alice-secret  # for wait_for_event; bob passes --token

# flip_byte FILE: flips one bit in the middle of FILE (a corrupt sector).
flip_byte() {
  python3 - "$1" <<'PY'
import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 1]))
PY
}

# last_seq JOB: the seq of JOB's newest event (the watch prints the history
# at once, then waits for more: cut it after 3 s).
last_seq() {
  timeout 3 "$CLI_BIN" --server "$GRPC_ADDR" --token alice-secret --json watch "$1" 2>/dev/null |
    tail -n 1 | jq .seq || true
}

log "1. output directories are exclusive"
alice_file=$(write_job alices 6 "output_dir: $out/alice-run")
sed -i 's/every_steps: 20/every_steps: 3/' "$alice_file"  # checkpoints at steps 3 and 6
job=$(alice --json submit "$alice_file" | jq -r .id)
[[ "$job" == job-* ]] || fail "alice could not submit"
for dir in "$out/alice-run" "$out/alice-run/inside"; do
  bob_file=$(write_job bobs 5 "output_dir: $dir")
  expect_cli_error INVALID_ARGUMENT "output_dir: '$dir' equals, contains or lies inside another job's output directory" \
    --token bob-secret submit "$bob_file"
  err=$(cli --token bob-secret submit "$bob_file" 2>&1 >/dev/null || true)
  [[ "$err" != *"$job"* ]] || fail "bob learned alice's job id: $err"
done
# The output root itself is nobody's (issue 36): it would claim every job's
# directory below it.
bob_file=$(write_job bobs 5 "output_dir: $out")
expect_cli_error INVALID_ARGUMENT "output_dir: '$out' is the output root" \
  --token bob-secret submit "$bob_file"
expect_cli_error INVALID_ARGUMENT "of job $job" --token alice-secret submit "$alice_file"
alice watch "$job" >/dev/null || fail "$job did not succeed"

log "2. a forged checkpoint is not the job's"
root="$out/alice-run/checkpoints"
[[ -d "$root/step-00000006" ]] || fail "no step-6 checkpoint: $(ls "$root")"
cp -r "$root/step-00000006" "$root/step-00000099"
ids=$(alice checkpoints "$job" --json | jq -r '.checkpoints[].id' | tr '\n' ' ')
[[ "$ids" == "$job/step-3 $job/step-6 " ]] || fail "listed: $ids"
expect_cli_error NOT_FOUND "not found" --token alice-secret export "$job/step-99" --out "$out/x"
expect_cli_error NOT_FOUND "not found" --token alice-secret delete-checkpoint "$job/step-99"
[[ -d "$root/step-00000099" ]] || fail "the forged directory was deleted"
alice export "$job/step-6" --out "$out/hf" >/dev/null || fail "export of a recorded checkpoint"

log "3. a corrupt newest checkpoint is quarantined; the job resumes from the older one"
long=$(write_job long 100000 "output_dir: $out/long")
sed -i -e 's/every_steps: 20/every_steps: 2/' -e 's/keep_last: 2/keep_last: 5/' "$long"
job2=$(alice --json submit "$long" | jq -r .id)
wait_for_event "$job2" '.kind == "checkpoint" and .step >= 4' 600 || fail "no checkpoint at step 4"
alice suspend "$job2" >/dev/null
wait_for_event "$job2" '.kind == "state" and .state == "SUSPENDED"' 600 || fail "not SUSPENDED"
newest=$(alice checkpoints "$job2" --json | jq -r '.checkpoints[-1].dir')
older=$(alice checkpoints "$job2" --json | jq -r '.checkpoints[-2].dir')
flip_byte "$newest/exp_avg.bin"
alice resume "$job2" >/dev/null
wait_for_event "$job2" '.kind == "state" and (.message | contains("failed verification at resume"))' 600 ||
  fail "no quarantine event"
[[ -d "$(dirname "$newest")/quarantined-$(basename "$newest")" ]] || fail "not quarantined: $(ls "$(dirname "$newest")")"
[[ ! -e "$newest" ]] || fail "$newest still there"
older_id="$job2/step-$((10#${older##*step-}))"
wait_for_event "$job2" ".kind == \"state\" and (.message | contains(\"newest intact checkpoint $older_id\"))" 600 ||
  fail "no event saying it resumes from $older_id"
[[ $(alice checkpoints "$job2" --json | jq -r '.checkpoints[].dir' | grep -c quarantined) == 0 ]] ||
  fail "a quarantined checkpoint is listed"

log "   every checkpoint corrupt: DATA_LOSS naming the files"
seq0=$(last_seq "$job2")
alice suspend "$job2" >/dev/null
wait_for_event "$job2" ".kind == \"state\" and .state == \"SUSPENDED\" and .seq > $seq0" 600 ||
  fail "not SUSPENDED (2)"
for dir in $(alice checkpoints "$job2" --json | jq -r '.checkpoints[].dir'); do
  flip_byte "$dir/master.bin"
done
alice resume "$job2" >/dev/null
wait_for_event "$job2" '.kind == "state" and .state == "FAILED"' 600 || fail "did not fail"
json=$(alice get "$job2" --json)
msg=$(json_field "$json" .error_message)
[[ "$msg" == *"no intact checkpoint to resume from"* && "$msg" == *"master.bin"* ]] || fail "message: $json"
[[ $(json_field "$json" .error_code) == *DATA_LOSS* || $(json_field "$json" .error_code) == 15 ]] ||
  fail "error code: $json"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"

log "4. the database file"
state2="$WORK/state2"
start_daemon "$state2"
short=$(cli --json submit "$(write_job short 5)" | jq -r .id)
cli watch "$short" >/dev/null || fail "$short did not succeed"
cp "$state2/megatrain.db" "$WORK/copy.db"
mv "$WORK/copy.db" "$state2/megatrain.db"  # same name, another inode
expect_cli_error FAILED_PRECONDITION "was replaced while megatraind runs" submit "$(write_job after 5)"
stop_daemon TERM || true
rm -f "$state2/megatrain.db" "$state2/megatrain.db-wal" "$state2/megatrain.db-shm"
rc=0
timeout 120 "$DAEMON_BIN" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state2" \
  --device=cpu >/dev/null 2>"$WORK/lost.log" || rc=$?
[[ $rc == 1 ]] || fail "expected exit 1 without the database, got $rc: $(cat "$WORK/lost.log")"
grep -q "the job database is empty, but .* holds 1 job directories ($short)" "$WORK/lost.log" ||
  fail "$(cat "$WORK/lost.log")"
grep -q "Restore the database from a backup" "$WORK/lost.log" || fail "$(cat "$WORK/lost.log")"
log "PASS"
