#!/usr/bin/env bash
# Integration: the Python client (client/python/megatrain_client) against the
# real megatraind, with Debian's python3-grpcio and python3-protobuf (stubs
# generated from proto/ by protoc + grpc_python_plugin): see
# python_client_test.py for the checks. Also runs examples/python_client.py.
source "$(dirname "$0")/lib.sh"

PYTHON=${MEGATRAIN_PYTHON:-/usr/bin/python3}
"$PYTHON" -c 'import grpc, google.protobuf, yaml' ||
  fail "$PYTHON lacks grpc/protobuf/yaml (apt-get install python3-grpcio python3-protobuf python3-yaml)"
export PYTHONPATH="$SOURCE_DIR/client/python"
export XDG_CACHE_HOME="$WORK/cache"  # generated stubs

tokens="$WORK/tokens.yaml"
{
  echo "users:"
  echo "  - {name: alice, role: user, token_sha256: $(printf alice-secret | "$CLI_BIN" hash-token)}"
  echo "  - {name: bob, role: user, token_sha256: $(printf bob-secret | "$CLI_BIN" hash-token)}"
} >"$tokens"
chmod 600 "$tokens"  # the daemon refuses a tokens file others may read
mkdir -p "$WORK/out"
start_daemon "$WORK/state" --auth_tokens="$tokens" --data_roots="$SOURCE_DIR/examples,$WORK" \
  --output_roots="$WORK/out" --host_memory_budget=4GiB

log "python client checks"
"$PYTHON" "$SOURCE_DIR/tests/integration/python_client_test.py" "$GRPC_ADDR" alice-secret bob-secret \
  "$TINY_DATA" "$WORK" || fail "python_client_test.py failed"

log "examples/python_client.py"
"$PYTHON" "$SOURCE_DIR/examples/python_client.py" --server "$GRPC_ADDR" --token alice-secret \
  --max_steps 20 --export "$WORK/out/example-hf" >"$WORK/example.log" 2>&1 ||
  fail "example failed: $(tail -n 20 "$WORK/example.log")"
[[ -f "$WORK/out/example-hf/config.json" ]] || fail "the example exported nothing"
log "PASS"
