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
# ENGINE_SANITIZE (default "on": the second phase, part of CI; "all" runs
# every engine suite of label cpu, "off" skips it; docs/testing.md, "Engine
# tests under the sanitizers"), ENGINE_BUILD_DIR (default
# <repo>/build-asan-engine).
#
# Second phase (ENGINE_SANITIZE=on): the engine's unit tests of our own
# memory handling (engine/fs, formats, data, checkpoint, store, optim,
# runtime, dist and the step
# suites that drive the executor's buffers; the list below) in a gcc build
# with LibTorch, our code instrumented; "all": every engine suite of label
# cpu (CMake target megatrain_tests_cpu). LibTorch is not instrumented.
#
# First phase: a clang build with no LibTorch at all
# (-DMEGATRAIN_BUILD_ENGINE=OFF): proto/, server/ and client/ libraries,
# the CLI and the server unit tests, about 45 translation units, about 3
# minutes on 2 cores with clang (gcc took 5); the tests take about 20 s.
# Engine and integration tests are not in it. Only our code is
# instrumented (MEGATRAIN_SANITIZE in cmake/MegatrainHelpers.cmake);
# Debian's gRPC, protobuf and yaml-cpp are not. Needs clang
# (deploy/install-deps.sh installs it for the fuzzers).
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
# -O0 -g1: line tables for the reports. The phase's cost is its build:
# clang with ASan + UBSan takes about three times the CPU at -O1 (CPU
# seconds, 2026-11-28: tests/server/core/job_manager_test.cc 38.2 s at
# -O1, 11.8 s at -O0; client/cli.cc 34.6 s and 13.2 s). At -O0 no check
# is optimised away; the tests run slower.
cmake "${GENERATOR[@]}" -S "${REPO}" -B "${BUILD_DIR}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" \
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

# --- Second phase: the engine's unit tests, gcc ---------------------------
# gcc, not clang: Debian's clang 14 with libstdc++ 12 in C++20 mode rejects
# LibTorch 1.13's headers (std::vector<c10::IValue> instantiated while
# c10::IValue is incomplete); gcc 12 is the project's compiler and has the
# same two sanitizers. -O0: half the compile time of -O1 (21.8 s against
# 42.1 s of CPU for engine/checkpoint/checkpoint.cc), and the phase's cost is its
# build; LibTorch's own arithmetic, not instrumented, runs at full speed
# either way.
ENGINE_SANITIZE="${ENGINE_SANITIZE:-on}"
case "${ENGINE_SANITIZE}" in
  off) exit 0 ;;
  on | all) ;;
  *)
    echo "run-sanitized-tests: ENGINE_SANITIZE must be on, all or off, got '${ENGINE_SANITIZE}'" >&2
    exit 2
    ;;
esac
ENGINE_BUILD_DIR="${ENGINE_BUILD_DIR:-${REPO}/build-asan-engine}"
# The suites of our own memory handling (docs/testing.md, "Engine tests
# under the sanitizers", has the rule and what is left out): engine/fs,
# engine/formats, engine/data, engine/checkpoint, engine/store, engine/optim, engine/runtime, engine/dist, and the step
# suites that drive the executor's buffers (weight slots, gradient landing
# and rings, activation offload, the NVMe tier). ENGINE_SANITIZE=all builds
# and runs every CPU suite of the engine (target megatrain_tests_cpu).
ENGINE_TESTS=(
  # io: the parsers of what users hand the daemon, checkpoints, data
  safetensors_test token_shard_test hf_model_test checkpoint_test checkpoint_paths_test
  data_loader_test tokenizer_test text_corpus_test hf_tokenizer_test input_checks_test
  # store, optim, runtime, dist
  nvme_tier_test adamw_test tiered_adamw_test optimizer_queue_test embedding_updater_test
  lr_schedule_test optimizer_bench_test thread_pool_test host_buffer_test device_info_test torch_compat_test
  data_parallel_test tiered_data_parallel_test gradient_shard_test dist_multi_process_test
  # step: the executor's parts and the trainer in each memory mode
  step_parts_test step_plan_test trainer_test memory_modes_test tiered_trainer_test
)
cmake "${GENERATOR[@]}" -S "${REPO}" -B "${ENGINE_BUILD_DIR}" \
  -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" \
  -DMEGATRAIN_BUILD_ENGINE=ON -DMEGATRAIN_BUILD_SERVER=OFF -DMEGATRAIN_CUDA=OFF \
  -DMEGATRAIN_ALLOW_MISSING_SOURCES=OFF \
  "-DMEGATRAIN_SANITIZE=address;undefined" >/dev/null
if [[ "${ENGINE_SANITIZE}" == "all" ]]; then
  mapfile -t ENGINE_TESTS <"${ENGINE_BUILD_DIR}/megatrain_tests/cpu.txt"
  cmake --build "${ENGINE_BUILD_DIR}" -j "${JOBS}" --target megatrain_tests_cpu
else
  cmake --build "${ENGINE_BUILD_DIR}" -j "${JOBS}" --target "${ENGINE_TESTS[@]}"
fi

# Debian's LibTorch is not instrumented. What that needs is in
# deploy/sanitizer-suppressions/ (one entry per finding, each with its
# reason); everything else a sanitizer reports fails the test:
# abort_on_error (ASan, LeakSanitizer at exit), halt_on_error (UBSan; our
# code is built with -fno-sanitize-recover=all too).
SUPP="${REPO}/deploy/sanitizer-suppressions"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=${SUPP}/lsan-libtorch.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# One process per test program, not ctest's one per test case: an
# instrumented program that loads LibTorch takes about 3.5 s of CPU to
# start and to check for leaks at exit (measured with optimizer_queue_test
# and no test selected), which over the phase's ~400 test cases would be
# about 23 minutes of CPU. Run from the source root, as ctest does.
LOG_DIR="${ENGINE_BUILD_DIR}/sanitizer-logs"
rm -rf "${LOG_DIR}"
mkdir -p "${LOG_DIR}"
export ENGINE_BUILD_DIR LOG_DIR
cd "${REPO}"
# shellcheck disable=SC2016  # expanded by the inner bash, per program
printf '%s\n' "${ENGINE_TESTS[@]}" | xargs -P "${JOBS}" -I{} bash -c '
  if "${ENGINE_BUILD_DIR}/tests/$1" >"${LOG_DIR}/$1.log" 2>&1; then
    echo "  passed: $1"
  else
    echo "  FAILED: $1 (exit $?, log ${LOG_DIR}/$1.log)"
    touch "${LOG_DIR}/$1.failed"
  fi' _ {}
failed=("${LOG_DIR}"/*.failed)
if [[ -e "${failed[0]}" ]]; then
  for f in "${failed[@]}"; do
    name="$(basename "${f}" .failed)"
    echo "===== ${name} =====" >&2
    tail -n 200 "${LOG_DIR}/${name}.log" >&2
  done
  echo "run-sanitized-tests: ${#failed[@]} engine test program(s) failed under ASan + UBSan" >&2
  exit 1
fi
echo "run-sanitized-tests: ${#ENGINE_TESTS[@]} engine test programs (${ENGINE_SANITIZE}) passed under ASan + UBSan (${ENGINE_BUILD_DIR})"
