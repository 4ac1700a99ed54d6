#!/usr/bin/env bash
# Builds the server and client libraries and their unit tests (tests/server/,
# fake engine) with AddressSanitizer (+ LeakSanitizer) and
# UndefinedBehaviorSanitizer, and runs them. deploy/run-tests.sh calls it
# after the main suite; exits non-zero when the build fails or a test fails,
# a sanitizer report included (UBSan aborts: -fno-sanitize-recover).
#
#   deploy/run-sanitized-tests.sh
#
# Environment: BUILD_DIR (default <repo>/build-asan), JOBS (default nproc),
# ENGINE_SANITIZE (default "off"; "io" runs the second phase, not yet part of
# CI: it has not been run to completion on a CI-sized machine, README "Not
# built yet"),
# ENGINE_BUILD_DIR (default <repo>/build-asan-engine).
#
# Second phase (ENGINE_SANITIZE=io): the engine's input-parsing tests
# (safetensors, token_shard, checkpoint, checkpoint_paths, hf_model,
# hf_tokenizer, data_loader, tokenizer, text_corpus, dir_fd) in a build
# with LibTorch, our code instrumented. Not the whole engine suite: each
# engine test links LibTorch and the step/optimizer tests are slow under
# ASan; these are the tests of the code that parses what users hand the
# daemon (docs/testing.md, "Sanitizers", has the cost).
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

ENGINE_SANITIZE="${ENGINE_SANITIZE:-off}"
if [[ "${ENGINE_SANITIZE}" == "off" ]]; then exit 0; fi
if [[ "${ENGINE_SANITIZE}" != "io" ]]; then
  echo "run-sanitized-tests: ENGINE_SANITIZE must be io or off, got '${ENGINE_SANITIZE}'" >&2
  exit 2
fi
ENGINE_BUILD_DIR="${ENGINE_BUILD_DIR:-${REPO}/build-asan-engine}"
ENGINE_TESTS=(safetensors_test token_shard_test checkpoint_test checkpoint_paths_test
  hf_model_test hf_tokenizer_test data_loader_test tokenizer_test text_corpus_test dir_fd_test)
cmake "${GENERATOR[@]}" -S "${REPO}" -B "${ENGINE_BUILD_DIR}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" \
  -DMEGATRAIN_BUILD_ENGINE=ON -DMEGATRAIN_BUILD_SERVER=ON -DMEGATRAIN_CUDA=OFF \
  -DMEGATRAIN_ALLOW_MISSING_SOURCES=OFF \
  "-DMEGATRAIN_SANITIZE=address;undefined" >/dev/null
cmake --build "${ENGINE_BUILD_DIR}" -j "${JOBS}" --target "${ENGINE_TESTS[@]}"

# Debian's LibTorch is not instrumented, so ASan sees only half of what
# happens to memory it shares with our code:
# - detect_container_overflow=0: our code's std::vector annotations do not
#   match LibTorch's unannotated operations on the same containers (false
#   "container-overflow" reports);
# - alloc_dealloc_mismatch=0: memory LibTorch allocates with one allocator
#   and we release with another through its API is not a bug of ours;
# - detect_leaks=0: LibTorch's global registries (operators, dispatch
#   tables) live until exit by design and would be reported as leaks; the
#   server phase above keeps LeakSanitizer on for our code.
# detect_odr_violation=0: both libtorch_cpu and our test binaries carry
# some of the same inline globals (protobuf, fmt); not a bug of ours.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=0:detect_container_overflow=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:check_initialization_order=1"
ctest --test-dir "${ENGINE_BUILD_DIR}" --output-on-failure -j "${JOBS}" \
  --no-tests=error -R "^($(IFS='|'; echo "${ENGINE_TESTS[*]}"))\\."
echo "run-sanitized-tests: engine input-parsing tests passed under ASan + UBSan (${ENGINE_BUILD_DIR})"
