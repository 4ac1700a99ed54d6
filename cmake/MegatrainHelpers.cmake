# Declares every MegaTrain target the same way.
#
#   megatrain_cc_library(NAME megatrain_engine SRCS a.cc b.cc DEPS absl::status
#                        [FORBID regex...])
#   megatrain_cc_binary(NAME megatraind SRCS main.cc DEPS megatrain_server)
#   megatrain_cc_test(NAME adamw_test SRCS adamw_test.cc DEPS megatrain_engine
#                     [LABELS gpu])
#
# Our code builds with -Wall -Wextra; third-party headers come in as SYSTEM
# include directories through their imported targets, so they do not warn.

# Developer aid while several people add files at once: with
# MEGATRAIN_ALLOW_MISSING_SOURCES=ON (default OFF; never in CI) a target whose
# sources are not all there yet is skipped with a warning instead of failing
# the configure step.
option(MEGATRAIN_ALLOW_MISSING_SOURCES "Skip targets with missing sources (development only)" OFF)
function(_megatrain_sources_missing out)
  set(_missing "")
  foreach(src IN LISTS ARGN)
    if(NOT IS_ABSOLUTE "${src}")
      set(src "${CMAKE_CURRENT_SOURCE_DIR}/${src}")
    endif()
    if(NOT EXISTS "${src}")
      list(APPEND _missing "${src}")
    endif()
  endforeach()
  set(${out} "${_missing}" PARENT_SCOPE)
endfunction()

function(_megatrain_common_options target)
  # Every target declared here, for later passes over all of them
  # (megatrain_torch_pch() in cmake/MegatrainPch.cmake).
  set_property(GLOBAL APPEND PROPERTY MEGATRAIN_TARGETS ${target})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_include_directories(${target} PUBLIC "${PROJECT_SOURCE_DIR}")
  if(MEGATRAIN_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC MEGATRAIN_WITH_CUDA=1)
  endif()
  # MEGATRAIN_SANITIZE ("address;undefined"): our code instrumented, the
  # sanitizer runtimes linked into every program that uses it. Third-party
  # libraries and the generated megatrain_proto code are not instrumented.
  # -fno-sanitize-recover: a UBSan finding aborts the program, so the test
  # fails (by default UBSan prints and goes on). The same flags for clang
  # and gcc: deploy/run-sanitized-tests.sh builds the server with clang and
  # the engine with gcc (clang 14 rejects LibTorch 1.13's headers).
  if(MEGATRAIN_SANITIZE)
    string(REPLACE ";" "," _san "${MEGATRAIN_SANITIZE}")
    target_compile_options(${target} PRIVATE
      -fsanitize=${_san} -fno-sanitize-recover=all -fno-omit-frame-pointer)
    target_link_options(${target} PUBLIC -fsanitize=${_san})
  endif()
endfunction()

function(megatrain_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;FORBID" ${ARGN})
  # Layering: refuse a forbidden dependency at configure time (see STYLE).
  foreach(dep IN LISTS ARG_DEPS)
    foreach(pattern IN LISTS ARG_FORBID)
      if(dep MATCHES "${pattern}")
        message(FATAL_ERROR "${ARG_NAME} must not depend on ${dep} (matches '${pattern}')")
      endif()
    endforeach()
  endforeach()
  if(MEGATRAIN_ALLOW_MISSING_SOURCES)
    _megatrain_sources_missing(_missing ${ARG_SRCS})
    if(_missing)
      message(WARNING "${ARG_NAME}: leaving out missing ${_missing}")
      list(REMOVE_ITEM ARG_SRCS ${_missing})
      foreach(m IN LISTS _missing)
        file(RELATIVE_PATH _rel "${CMAKE_CURRENT_SOURCE_DIR}" "${m}")
        list(REMOVE_ITEM ARG_SRCS "${_rel}")
      endforeach()
    endif()
  endif()
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  _megatrain_common_options(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

function(megatrain_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  _megatrain_common_options(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
endfunction()

# Each test program's name in <build>/megatrain_tests/<label>.txt, one a
# line, rewritten at every configure (deploy/run-sanitized-tests.sh runs the
# programs of a label directly, one process per program).
file(REMOVE_RECURSE "${CMAKE_BINARY_DIR}/megatrain_tests")

# Test programs that ctest runs as one test, one process, instead of one
# process per test case: programs of many short cases whose cost under ctest
# is LibTorch's start-up per case. executor_parity_test: 251 cases of about
# 0.05 s each, while a process that loads LibTorch takes about 0.5 s of CPU
# to start; one process runs all 251 in 25 s of CPU (docs/testing.md,
# "CI time"). A failing case is named in the program's output
# (--output-on-failure); run one case with --gtest_filter.
set(MEGATRAIN_WHOLE_PROGRAM_TESTS executor_parity_test)
# CI (deploy/run-tests.sh) goes further: every test program that links
# LibTorch (DEPS megatrain_engine, megatrain_testing or
# megatrain_server_engine) is one ctest test. Such a process takes about
# 0.5 s of CPU to start, and those programs have about 830 cases, most of
# them much shorter than that (docs/testing.md, "CI time"). Off by default:
# a developer's `ctest -R Suite.Case` needs one test per case.
option(MEGATRAIN_CTEST_WHOLE_PROGRAMS
  "One ctest test per test program that links LibTorch, not one per case (CI)" OFF)
set(_MEGATRAIN_TORCH_TEST_DEPS megatrain_engine megatrain_testing megatrain_server_engine)
# Extra compile flags for the test programs' own sources (CI: -O1, about a
# quarter less compile time than -O2 for a gtest source; the libraries under
# test keep the build type's flags). A list, e.g. "-O1".
set(MEGATRAIN_TEST_CXX_FLAGS "" CACHE STRING "Extra compile flags for test programs' sources")

# Sets `out` to TRUE when test program `name` with dependencies `deps` runs
# as one ctest test (MEGATRAIN_WHOLE_PROGRAM_TESTS, MEGATRAIN_CTEST_WHOLE_PROGRAMS).
function(_megatrain_whole_program_test name deps out)
  set(_whole FALSE)
  if(name IN_LIST MEGATRAIN_WHOLE_PROGRAM_TESTS)
    set(_whole TRUE)
  elseif(MEGATRAIN_CTEST_WHOLE_PROGRAMS)
    foreach(_dep IN LISTS _MEGATRAIN_TORCH_TEST_DEPS)
      if(_dep IN_LIST deps)
        set(_whole TRUE)
      endif()
    endforeach()
  endif()
  set(${out} ${_whole} PARENT_SCOPE)
endfunction()

function(megatrain_cc_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  if(MEGATRAIN_ALLOW_MISSING_SOURCES)
    _megatrain_sources_missing(_missing ${ARG_SRCS})
    if(_missing)
      message(WARNING "skipping test ${ARG_NAME}: missing ${_missing}")
      return()
    endif()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  _megatrain_common_options(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  if(MEGATRAIN_TEST_CXX_FLAGS)
    target_compile_options(${ARG_NAME} PRIVATE ${MEGATRAIN_TEST_CXX_FLAGS})
  endif()
  set(_labels cpu)
  if(ARG_LABELS)
    set(_labels ${ARG_LABELS})
  endif()
  # One target per label that builds its test programs: `cmake --build build
  # --target megatrain_tests_cpu` (deploy/run-sanitized-tests.sh builds the
  # engine's CPU suites that way, without the tools, the GPU suites or the
  # daemon).
  foreach(_label IN LISTS _labels)
    if(NOT TARGET megatrain_tests_${_label})
      add_custom_target(megatrain_tests_${_label})
    endif()
    add_dependencies(megatrain_tests_${_label} ${ARG_NAME})
    file(APPEND "${CMAKE_BINARY_DIR}/megatrain_tests/${_label}.txt" "${ARG_NAME}\n")
  endforeach()
  _megatrain_whole_program_test(${ARG_NAME} "${ARG_DEPS}" _whole)
  if(_whole)
    # One ctest test for the whole program (see MEGATRAIN_WHOLE_PROGRAM_TESTS).
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}")
    set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${_labels}" TIMEOUT 900)
    return()
  endif()
  gtest_discover_tests(${ARG_NAME}
    TEST_PREFIX "${ARG_NAME}."
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    PROPERTIES LABELS "${_labels}" TIMEOUT 900)
endfunction()
