#!/usr/bin/env bash
# Builds the server and client libraries and their unit tests (tests/server/,
# fake engine) with AddressSanitizer (+ LeakSanitizer) and
# UndefinedBehaviorSanitizer, and runs them. deploy/run-tests.sh calls it
# after the main suite; exits non-zero when the build fails or a test fails,
# a sanitizer report included (UBSan aborts: -fno-sanitize-recover).
#
#   deploy/run-sanitized-tests.sh
#
# Environment: BUILD_DIR (default <repo>/build-asan), JOBS (default nproc).
#
# The build has no LibTorch at all (-DMEGATRAIN_BUILD_ENGINE=OFF): proto/,
# server/ and client/ libraries, the CLI and the server unit tests, about
# 45 translation units, about 3 minutes on 2 cores with clang (gcc took 5);
# the tests take about 20 s. Engine and integration tests are not in
# it. Only our code is instrumented (MEGATRAIN_SANITIZE in
# cmake/MegatrainHelpers.cmake); Debian's gRPC, protobuf and yaml-cpp are
# not. Needs clang (deploy/install-deps.sh installs it for the fuzzers).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-${REPO}/build-asan}"
JOBS="${JOBS:-$(nproc)}"

if ! command -v clang++ >/dev/null; then
  echo "run-sanitized-tests: clang++ not found (deploy/install-deps.sh installs it)" >&2
  exit 2
fi
GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
# -O1 -g1: line tables for the reports; faster to build than -O2 -g.
cmake "${GENERATOR[@]}" -S "${REPO}" -B "${BUILD_DIR}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" \
  -DMEGATRAIN_BUILD_ENGINE=OFF -DMEGATRAIN_BUILD_SERVER=ON \
  -DMEGATRAIN_ALLOW_MISSING_SOURCES=OFF \
  "-DMEGATRAIN_SANITIZE=address;undefined" >/dev/null
cmake --build "${BUILD_DIR}" -j "${JOBS}"

# abort_on_error: a report fails the test (ctest sees the abort);
# detect_leaks: LeakSanitizer at exit; check_initialization_order and
# detect_stack_use_after_return: the costlier ASan checks, affordable here.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "${BUILD_DIR}" -L cpu --output-on-failure -j "${JOBS}"
echo "run-sanitized-tests: server unit tests passed under ASan + UBSan (${BUILD_DIR})"
