#!/usr/bin/env bash
# The README's test command: on a fresh Debian 12 machine, installs what is
# missing, configures, builds into build/ and runs the CPU test suite
# (ctest -LE gpu: unit and integration tests), then the parsers' fuzzers
# (deploy/run-fuzzers.sh, build-fuzz/) and the server unit tests and the
# engine's suites of its own memory handling under ASan + UBSan
# (deploy/run-sanitized-tests.sh, build-asan/ and build-asan-engine/). Prints failing tests'
# output. docs/testing.md says what each part covers and costs.
#
#   deploy/run-tests.sh            # everything that runs without a GPU
#   MEGATRAIN_TEST_LABELS=cpu deploy/run-tests.sh   # one label only
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase prints its wall time, so that a slow run shows where it went
# (CI's budget is 45 minutes on 2 cores).
start=$SECONDS
phase() { echo "run-tests: $1 took $((SECONDS - start)) s"; start=$SECONDS; }

bash deploy/install-deps.sh
phase install-deps

jobs=$(nproc)
# What CI's build costs (docs/testing.md, "CI time"): -g1 (line tables, the
# same machine code as -g, a third less compile time for a gtest source);
# the test programs' own sources at -O1 (the libraries under test keep
# -O2); every test program that links LibTorch one ctest test, not one
# process per case.
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGATRAIN_BUILD_SERVER=ON \
  -DMEGATRAIN_ALLOW_MISSING_SOURCES=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DMEGATRAIN_TEST_CXX_FLAGS=-O1 -DMEGATRAIN_CTEST_WHOLE_PROGRAMS=ON >/dev/null
cmake --build build -j "$jobs"
phase build

# OpenBLAS threads on top of LibTorch's and ours oversubscribe small CI
# machines; the numerics tests are single-stream anyway.
export OPENBLAS_NUM_THREADS=1
labels_exclude="gpu"
if [ -n "${MEGATRAIN_TEST_LABELS:-}" ]; then
  ctest --test-dir build -L "$MEGATRAIN_TEST_LABELS" -LE "$labels_exclude" --output-on-failure -j "$jobs"
else
  ctest --test-dir build -LE "$labels_exclude" --output-on-failure -j "$jobs"
  phase ctest
  # The parsers' libFuzzer targets (I/O formats, job specs), a bounded run
  # from the committed corpora (clang, ASan + UBSan; a separate small build
  # without LibTorch, build-fuzz/).
  bash deploy/run-fuzzers.sh "${MEGATRAIN_FUZZ_SECONDS:-15}"
  phase fuzzers
  # The server and client unit tests under AddressSanitizer + UBSan (a
  # separate build without LibTorch, build-asan/), then the engine's suites
  # of its own memory handling (a gcc build with LibTorch, build-asan-engine/).
  bash deploy/run-sanitized-tests.sh
  phase sanitizers
fi
