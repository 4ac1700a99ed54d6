# Integration tests: shell scripts that start the real megatraind (with the
# real engine, on the CPU) on free loopback ports with a temporary state
# directory and drive it with the real `megatrain` CLI. Label `integration`
# (run with `ctest -L integration`; CI's unit run is `ctest -LE
# "gpu|integration"`). They need megatraind and megatrain built, jq, curl,
# python3 (a free port for prometheus; the dashboard checks) and Debian's
# prometheus/promtool.
set(_it_dir ${CMAKE_CURRENT_SOURCE_DIR}/integration)
foreach(_it cli_flow crash_resume auth prometheus grafana_dashboard tls fault_nan fault_kill_checkpoint
           fault_sigterm fault_disk_full storage_isolation
           python_client isolation_ops ux data_parallel data_checks init_from readme_walkthrough)
  add_test(NAME integration_${_it}
    COMMAND bash ${_it_dir}/${_it}_test.sh
            $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(integration_${_it} PROPERTIES LABELS integration TIMEOUT 900)
endforeach()
# Shared-lab isolation (issue 14): FIFO inputs, {user} data roots.
add_test(NAME integration_isolation
  COMMAND bash ${_it_dir}/isolation_test.sh
          $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_isolation PROPERTIES LABELS integration TIMEOUT 900)
# Issue 19: `megatrain plan` against the real daemon and engine.
add_test(NAME integration_plan
  COMMAND bash ${_it_dir}/plan_test.sh
          $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_plan PROPERTIES LABELS integration TIMEOUT 300)
# Issue 36: hostile model sizes and output roots against the real daemon.
add_test(NAME integration_hostile_user
  COMMAND bash ${_it_dir}/hostile_user_test.sh
          $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_hostile_user PROPERTIES LABELS integration TIMEOUT 300)
# Issue 20: `cmake --install` to a temporary prefix, then the installed
# daemon, CLI and SentencePiece module run from there.
add_test(NAME integration_install
  COMMAND bash ${_it_dir}/install_test.sh
          $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_install PROPERTIES LABELS integration TIMEOUT 900)
# Reads confined below the data roots at use time (issue 14).
add_test(NAME integration_input_confinement
  COMMAND bash ${_it_dir}/input_confinement_test.sh
          $<TARGET_FILE:megatraind> $<TARGET_FILE:megatrain> ${PROJECT_SOURCE_DIR}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_input_confinement PROPERTIES LABELS integration TIMEOUT 900)
# `ctest -j` starts the tests of highest COST first. A clean clone has no
# CTestCostData.txt yet, so without these the longest scripts, declared
# last, would start last and leave a core idle at the end of CI's run.
# Seconds on the 2-core machine (2026-11-28); the cost data of a run
# replaces them.
foreach(_it_cost python_client:61 fault_kill_checkpoint:38 crash_resume:38 cli_flow:37
                 fault_sigterm:26 storage_isolation:23 data_parallel:16 grafana_dashboard:15)
  string(REPLACE ":" ";" _it_cost "${_it_cost}")
  list(GET _it_cost 0 _it)
  list(GET _it_cost 1 _cost)
  set_tests_properties(integration_${_it} PROPERTIES COST ${_cost})
endforeach()
