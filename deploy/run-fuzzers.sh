#!/usr/bin/env bash
# Builds the libFuzzer targets of the I/O parsers and the job spec parsers
# (tests/fuzz/) with clang, ASan and UBSan, and runs each for a bounded time,
# starting from its seed corpus (and its dictionary, tests/fuzz/<target>.dict,
# where there is one). Exits non-zero when a build fails or a target finds a crash, a leak
# or a sanitizer error; the reproducer is left in build-fuzz/artifacts/.
#
#   deploy/run-fuzzers.sh [seconds_per_target]    # default 20
#
# Environment: BUILD_DIR (default <repo>/build-fuzz), JOBS (default 2: the
# build's jobs and the targets run at once), FUZZ_TARGETS (default: all),
# RSS_LIMIT_MB (default 2048).
#
# The build is the standalone project tests/fuzz/CMakeLists.txt: only the
# pure-C++ I/O sources, the job file parser and the daemon's spec
# conversion (with protobuf, gRPC and yaml-cpp), no LibTorch, so it
# configures and builds in about a minute on 2 cores. Needs clang++ and its
# runtime (Debian: clang, libclang-rt-dev; see deploy/install-deps.sh). Mutated inputs go to a
# scratch copy of the corpus, never into the committed seeds.
set -euo pipefail

SECONDS_PER_TARGET="${1:-20}"
if ! [[ "${SECONDS_PER_TARGET}" =~ ^[0-9]+$ ]] || [ "${SECONDS_PER_TARGET}" -lt 1 ]; then
  echo "run-fuzzers: seconds_per_target must be a positive integer, got '${SECONDS_PER_TARGET}'" >&2
  exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-${REPO}/build-fuzz}"
JOBS="${JOBS:-2}"
RSS_LIMIT_MB="${RSS_LIMIT_MB:-2048}"
TARGETS=(${FUZZ_TARGETS:-safetensors_header_fuzz token_shard_fuzz job_yaml_fuzz jobspec_proto_fuzz})

if ! command -v clang++ >/dev/null; then
  echo "run-fuzzers: clang++ not found (deploy/install-deps.sh installs it)" >&2
  exit 2
fi

GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
if [ ! -f "${BUILD_DIR}/CMakeCache.txt" ]; then
  cmake "${GENERATOR[@]}" -S "${REPO}/tests/fuzz" -B "${BUILD_DIR}" \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "${BUILD_DIR}" -j "${JOBS}" --target "${TARGETS[@]}"

mkdir -p "${BUILD_DIR}/artifacts"
# run_target TARGET: one bounded libFuzzer run; its log in
# ${BUILD_DIR}/TARGET.log, its exit status that of the run.
run_target() {
  local target=$1
  local seeds="${REPO}/tests/fuzz/corpus/${target}"
  local work="${BUILD_DIR}/corpus/${target}"
  mkdir -p "${work}"
  local dict=()
  if [ -f "${REPO}/tests/fuzz/${target}.dict" ]; then
    dict=(-dict="${REPO}/tests/fuzz/${target}.dict")
  fi
  echo "run-fuzzers: ${target} for ${SECONDS_PER_TARGET}s (seeds: ${seeds})"
  # New inputs go to ${work} (the first corpus dir); the seeds are read only.
  "${BUILD_DIR}/${target}" "${work}" "${seeds}" "${dict[@]}" \
    -max_total_time="${SECONDS_PER_TARGET}" \
    -rss_limit_mb="${RSS_LIMIT_MB}" \
    -max_len=65536 \
    -print_final_stats=1 \
    -artifact_prefix="${BUILD_DIR}/artifacts/${target}-" \
    > "${BUILD_DIR}/${target}.log" 2>&1
}

# JOBS targets at a time: a libFuzzer run uses one core for its fixed time,
# so on 2 cores two at once halve the wall time and keep each run's
# executions.
failed=()
pids=()
names=()
finish_oldest() {
  local target=${names[0]}
  if wait "${pids[0]}"; then
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|DONE" \
      "${BUILD_DIR}/${target}.log" | sed "s/^/  ${target}: /" || true
  else
    echo "run-fuzzers: ${target} FAILED; last lines of ${BUILD_DIR}/${target}.log:" >&2
    tail -n 40 "${BUILD_DIR}/${target}.log" >&2
    failed+=("${target}")
  fi
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
}
for target in "${TARGETS[@]}"; do
  if [ ${#pids[@]} -ge "${JOBS}" ]; then finish_oldest; fi
  run_target "${target}" &
  pids+=($!)
  names+=("${target}")
done
while [ ${#pids[@]} -gt 0 ]; do finish_oldest; done

if [ ${#failed[@]} -ne 0 ]; then
  echo "run-fuzzers: failures in ${failed[*]}; reproducers in ${BUILD_DIR}/artifacts/" >&2
  exit 1
fi
echo "run-fuzzers: all ${#TARGETS[@]} targets ran ${SECONDS_PER_TARGET}s without a crash"
