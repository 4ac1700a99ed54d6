# ctest script (bench_nvme_tier_teardown): runs megatrain-bench with the
# NVMe tier in a fresh directory and checks the whole run, teardown
# included: exit status 0, the teardown markers in order on stderr, the
# JSON's tier bytes (moments read and written), and
# nothing left in the directory (the tier's subdirectory is removed with
# RemoveTree; std::filesystem::remove_all crashed it on CUDA builds, Note
# [No std::filesystem::remove_all] in engine/fs/mapped_file.h).
#   cmake -DBENCH=path -DDIR=scratch-dir -P CheckBenchNvmeTeardown.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(
  COMMAND ${BENCH} --model=tiny --device=cpu --steps=3 --warmup=1 --max_grad_norm=0
          --nvme_tier=moments --nvme_dir=${DIR} --json
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "megatrain-bench failed (${rc}):\n${err}")
endif()
string(FIND "${err}" "4 steps done; teardown: trainer" trainer_at)
string(FIND "${err}" "teardown: NVMe tier directory ${DIR}/megatrain-bench." dir_at)
string(FIND "${err}" "teardown done" done_at)
if(trainer_at EQUAL -1 OR dir_at LESS trainer_at OR done_at LESS dir_at)
  message(FATAL_ERROR "teardown markers missing or out of order:\n${err}")
endif()
string(STRIP "${out}" out)
string(REGEX REPLACE ".*\n" "" last_line "${out}")
string(JSON read GET "${last_line}" nvme_read_bytes_per_step)
string(JSON written GET "${last_line}" nvme_written_bytes_per_step)
# Each step reports the tier's bytes of the updates that finished since
# the previous report (they run behind the step), so the two means need
# not be equal; both must be there.
if(read LESS_EQUAL 0 OR written LESS_EQUAL 0)
  message(FATAL_ERROR "nvme bytes per step: read ${read}, written ${written}:\n${last_line}")
endif()
file(GLOB left "${DIR}/*")
if(left)
  message(FATAL_ERROR "left in ${DIR}: ${left}")
endif()
file(REMOVE_RECURSE "${DIR}")
message(STATUS "tier teardown ok: ${read} bytes read and ${written} written per step")
