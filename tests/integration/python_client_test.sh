#!/usr/bin/env bash
# Integration: the Python client as users install it. Builds the wheel with
# deploy/build-python-wheel.sh (offline: Debian's setuptools + wheel,
# protoc), installs it into a virtual environment that sees Debian's
# python3-grpcio / python3-protobuf / python3-yaml (no PYTHONPATH, no
# repository on the path), and drives the real megatraind with it: see
# python_client_test.py for the checks; then runs the notebook-style
# examples/python_client.py the same way. Also: `pip install client/python`
# from the checkout imports, and without grpcio the import says what to
# install.
source "$(dirname "$0")/lib.sh"

PYTHON=${MEGATRAIN_PYTHON:-/usr/bin/python3}
"$PYTHON" -c 'import grpc, google.protobuf, yaml, setuptools, wheel, venv' ||
  fail "$PYTHON lacks grpc/protobuf/yaml/setuptools/wheel (apt-get install python3-grpcio" \
    "python3-protobuf python3-yaml python3-setuptools python3-wheel python3-venv)"

log "wheel"
wheel=$(PYTHON="$PYTHON" "$SOURCE_DIR/deploy/build-python-wheel.sh" "$WORK/dist" 2>"$WORK/wheel.log") ||
  fail "build-python-wheel.sh failed: $(tail -n 20 "$WORK/wheel.log")"
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-index "$wheel" >"$WORK/pip.log" 2>&1 ||
  fail "pip install of the wheel failed: $(tail -n 20 "$WORK/pip.log")"
VENV_PYTHON="$WORK/venv/bin/python"
(cd "$WORK" && env -u PYTHONPATH "$VENV_PYTHON" -c '
import megatrain_client.client as c, sys
assert "site-packages" in c.__file__, c.__file__
assert "_generated" in c._stubs._dir, c._stubs._dir') || fail "the installed package does not use its bundled stubs"

log "pip install client/python"
"$PYTHON" -m venv --system-site-packages "$WORK/venv-src"
cp -r "$SOURCE_DIR/client/python" "$WORK/client-src"  # pip builds in place: keep the checkout clean
MEGATRAIN_PROTO_DIR="$SOURCE_DIR/proto" "$WORK/venv-src/bin/pip" install -q --no-index \
  --no-build-isolation "$WORK/client-src" >"$WORK/pip-src.log" 2>&1 ||
  fail "pip install client/python failed: $(tail -n 20 "$WORK/pip-src.log")"
(cd "$WORK" && env -u PYTHONPATH "$WORK/venv-src/bin/python" -c 'from megatrain_client import Client') ||
  fail "the package installed from client/python does not import"

log "without grpcio"
"$PYTHON" -m venv "$WORK/venv-bare"
"$WORK/venv-bare/bin/pip" install -q --no-index --no-deps "$wheel" >/dev/null 2>&1
if (cd "$WORK" && "$WORK/venv-bare/bin/python" -c 'from megatrain_client import Client') \
  2>"$WORK/bare.log"; then
  fail "importing the client without protobuf/grpcio succeeded"
fi
grep -q "megatrain_client needs the protobuf package (pip install grpcio protobuf" "$WORK/bare.log" ||
  fail "no install hint without grpcio: $(tail -n 3 "$WORK/bare.log")"

tokens="$WORK/tokens.yaml"
write_tokens "$tokens" alice:user bob:user
mkdir -p "$WORK/out"
start_daemon "$WORK/state" --auth_tokens="$tokens" --data_roots="$SOURCE_DIR/examples,$WORK" \
  --output_roots="$WORK/out" --host_memory_budget=4GiB

log "python client checks"
(cd "$WORK" && "$VENV_PYTHON" "$SOURCE_DIR/tests/integration/python_client_test.py" "$GRPC_ADDR" \
  alice-secret bob-secret "$TINY_DATA" "$WORK") || fail "python_client_test.py failed"

log "megatrain plot"
plot=$("$CLI_BIN" --server "$GRPC_ADDR" --token alice-secret plot "$(cat "$WORK/plot-job")" --height 8) ||
  fail "megatrain plot failed: $plot"
grep -q "^loss, steps 1..40: \* train" <<<"$plot" || fail "no loss chart: $plot"
[[ $(grep -c ' |' <<<"$plot") -eq 8 ]] || fail "the chart has not 8 rows: $plot"

log "examples/python_client.py"
"$VENV_PYTHON" "$SOURCE_DIR/examples/python_client.py" --server "$GRPC_ADDR" --token alice-secret \
  --max_steps 20 --export "$WORK/out/example-hf" >"$WORK/example.log" 2>&1 ||
  fail "example failed: $(tail -n 20 "$WORK/example.log")"
[[ -f "$WORK/out/example-hf/config.json" ]] || fail "the example exported nothing"
grep -qE "^from job-[0-9]+/step-20 : JOB_STATE_SUCCEEDED$" "$WORK/example.log" ||
  fail "the example's init_from job: $(tail -n 5 "$WORK/example.log")"
log "PASS"
