# One precompiled <ATen/ATen.h> for every translation unit that includes
# LibTorch (docs/testing.md, "CI time"). Parsing LibTorch's ~4,500 headers
# is most of such a unit's compile: engine/step/weight_slots.cc took 18-21 s
# of CPU without it and 3.2 s with it (gcc 12, RelWithDebInfo), 9.5 s and
# 4.2 s in the engine sanitizer build (-O0, ASan + UBSan); building the
# header once costs 15-23 s. A unit that does not include LibTorch is left
# out: the header would cost it 1.5-3.5 s of loading for nothing.
#
#   megatrain_torch_pch()   # after every target is declared (top-level CMakeLists.txt)
#
# The header is built once, by the object library megatrain_torch_pch, with
# the flags every MegaTrain target gets (_megatrain_common_options, torch's
# interface); the other targets reuse it (REUSE_FROM). gcc checks the header
# against each unit's options and, with -Winvalid-pch (CMake adds it), warns
# and parses the headers normally when they differ: slower, never wrong.
# A unit "includes LibTorch" when it or a project header it includes
# ("engine/...", "tests/...", relative ones), at any depth, includes
# <ATen/...>, <torch/...> or <c10/...>.
#
# ccache: a unit compiled against a precompiled header is cached only with
# `sloppiness = pch_defines,time_macros`; megatrain_torch_pch() sets it for
# the compiler launcher when that launcher is ccache.

# Sets `out` to TRUE when `file` (absolute) includes LibTorch, directly or
# through project headers. Memoised in global properties.
function(_megatrain_includes_torch file out)
  string(MD5 _key "${file}")
  get_property(_known GLOBAL PROPERTY "MEGATRAIN_TORCHY_${_key}" SET)
  if(_known)
    get_property(_value GLOBAL PROPERTY "MEGATRAIN_TORCHY_${_key}")
    set(${out} ${_value} PARENT_SCOPE)
    return()
  endif()
  # FALSE while scanning: an include cycle ends here.
  set_property(GLOBAL PROPERTY "MEGATRAIN_TORCHY_${_key}" FALSE)
  set(_value FALSE)
  if(EXISTS "${file}")
    file(STRINGS "${file}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    get_filename_component(_dir "${file}" DIRECTORY)
    foreach(_line IN LISTS _includes)
      if(_line MATCHES "<(ATen|torch|c10)/")
        set(_value TRUE)
        break()
      endif()
      if(_line MATCHES "\"([^\"]+)\"")
        set(_header "${CMAKE_MATCH_1}")
        foreach(_candidate "${PROJECT_SOURCE_DIR}/${_header}" "${_dir}/${_header}")
          if(EXISTS "${_candidate}" AND NOT IS_DIRECTORY "${_candidate}")
            _megatrain_includes_torch("${_candidate}" _inner)
            if(_inner)
              set(_value TRUE)
            endif()
            break()
          endif()
        endforeach()
        if(_value)
          break()
        endif()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY "MEGATRAIN_TORCHY_${_key}" ${_value})
  set(${out} ${_value} PARENT_SCOPE)
endfunction()

function(megatrain_torch_pch)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(STATUS "MegaTrain: no precompiled LibTorch header (compiler ${CMAKE_CXX_COMPILER_ID}, gcc only)")
    return()
  endif()
  set(_stub "${CMAKE_BINARY_DIR}/megatrain_torch_pch.cc")
  if(NOT EXISTS "${_stub}")
    file(WRITE "${_stub}" "// Owner of the precompiled LibTorch header (cmake/MegatrainPch.cmake).\n")
  endif()
  add_library(megatrain_torch_pch OBJECT "${_stub}")
  _megatrain_common_options(megatrain_torch_pch)
  target_link_libraries(megatrain_torch_pch PRIVATE ${TORCH_LIBRARIES})
  target_precompile_headers(megatrain_torch_pch PRIVATE <ATen/ATen.h>)

  get_property(_targets GLOBAL PROPERTY MEGATRAIN_TARGETS)
  set(_n_targets 0)
  set(_n_units 0)
  foreach(_target IN LISTS _targets)
    if(NOT TARGET ${_target})
      continue()
    endif()
    get_target_property(_sources ${_target} SOURCES)
    get_target_property(_source_dir ${_target} SOURCE_DIR)
    set(_torchy "")
    set(_plain "")
    foreach(_src IN LISTS _sources)
      if(NOT _src MATCHES "\\.(cc|cpp)$")
        continue()
      endif()
      if(IS_ABSOLUTE "${_src}")
        set(_abs "${_src}")
      else()
        set(_abs "${_source_dir}/${_src}")
      endif()
      _megatrain_includes_torch("${_abs}" _uses)
      # Absolute: a relative path would be read against this directory.
      if(_uses)
        list(APPEND _torchy "${_abs}")
      else()
        list(APPEND _plain "${_abs}")
      endif()
    endforeach()
    if(NOT _torchy)
      continue()
    endif()
    target_precompile_headers(${_target} REUSE_FROM megatrain_torch_pch)
    if(_plain)
      set_source_files_properties(${_plain} TARGET_DIRECTORY ${_target}
        PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
    math(EXPR _n_targets "${_n_targets} + 1")
    list(LENGTH _torchy _k)
    math(EXPR _n_units "${_n_units} + ${_k}")
  endforeach()
  message(STATUS "MegaTrain: precompiled <ATen/ATen.h> for ${_n_units} units in ${_n_targets} targets")

  # ccache caches a unit built against a precompiled header only with this
  # sloppiness; the launcher gets it in its environment.
  if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
    set(_sloppiness "pch_defines,time_macros")
    if(DEFINED ENV{CCACHE_SLOPPINESS} AND NOT "$ENV{CCACHE_SLOPPINESS}" STREQUAL "")
      set(_sloppiness "$ENV{CCACHE_SLOPPINESS},${_sloppiness}")
    endif()
    set(_launcher ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=${_sloppiness}"
        ${CMAKE_CXX_COMPILER_LAUNCHER})
    list(APPEND _targets megatrain_torch_pch)
    foreach(_target IN LISTS _targets)
      if(TARGET ${_target})
        set_target_properties(${_target} PROPERTIES CXX_COMPILER_LAUNCHER "${_launcher}")
      endif()
    endforeach()
  endif()
endfunction()
