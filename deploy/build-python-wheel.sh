#!/usr/bin/env bash
# Builds the megatrain-client wheel (client/python) offline, with the gRPC
# stubs generated from proto/ inside it:
#
#   deploy/build-python-wheel.sh [OUT_DIR]     (default: dist/)
#   pip install OUT_DIR/megatrain_client-0.1.0-py3-none-any.whl
#
# Needs python3 with setuptools and wheel (Debian: python3-setuptools,
# python3-wheel; python3-build is used when present), protoc and
# grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc). No
# package index is contacted: the build runs without isolation. The
# package is built from a copy, so the checkout stays clean. Prints the
# wheel's path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)
PYTHON=${PYTHON:-python3}

"$PYTHON" -c 'import setuptools, wheel' 2>/dev/null || {
  echo "build-python-wheel: $PYTHON lacks setuptools or wheel" \
    "(apt-get install python3-setuptools python3-wheel)" >&2
  exit 1
}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$ROOT/client/python" "$WORK/src"
rm -rf "$WORK/src/build" "$WORK/src"/*.egg-info
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
export MEGATRAIN_PROTO_DIR="$ROOT/proto"
cd "$WORK"  # so that a build/ directory of the caller's is not taken for python3-build
if "$PYTHON" -m build --version >/dev/null 2>&1; then
  "$PYTHON" -m build --wheel --no-isolation --outdir "$WORK/dist" "$WORK/src" >&2
else
  "$PYTHON" -m pip wheel --no-deps --no-build-isolation --no-index \
    --wheel-dir "$WORK/dist" "$WORK/src" >&2
fi
wheel=$(ls "$WORK"/dist/megatrain_client-*.whl)
cp "$wheel" "$OUT/"
echo "$OUT/$(basename "$wheel")"
