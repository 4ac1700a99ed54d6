# ctest script: runs megatrain-bench and checks a field of its final JSON
# line against a bound.
#   cmake -DBENCH=path -DARGS="--model=tiny;..." -DFIELD=loss_last -DMAX=0.5 -P CheckBenchLoss.cmake
execute_process(COMMAND ${BENCH} ${ARGS} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "megatrain-bench failed (${rc}):\n${err}")
endif()
string(STRIP "${out}" out)
string(REGEX REPLACE ".*\n" "" last_line "${out}")
string(JSON value ERROR_VARIABLE json_err GET "${last_line}" ${FIELD})
if(json_err)
  message(FATAL_ERROR "no ${FIELD} in the last line: ${last_line}\n${json_err}")
endif()
message(STATUS "${FIELD} = ${value} (bound ${MAX})\n${err}")
if(value GREATER_EQUAL ${MAX})
  message(FATAL_ERROR "${FIELD} = ${value} is not below ${MAX}")
endif()
