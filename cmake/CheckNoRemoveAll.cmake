# ctest script (the no_filesystem_remove_all test). Fails when a C++ file
# under one of DIRS (a ;-list) calls remove_all (std::filesystem's or an
# alias's) outside a comment line: pip's libtorch.so interposes its own
# copy, which jumps to address 0 in any process that loads it (Note [No
# std::filesystem::remove_all] in engine/fs/mapped_file.h; it crashed
# checkpoint retention, then megatrain-bench --nvme_tier's teardown, on
# CUDA only). Use RemoveTree or DirFd::RemoveTreeAt instead.
cmake_minimum_required(VERSION 3.22)
set(_bad "")
set(_n 0)
foreach(_dir IN LISTS DIRS)
  file(GLOB_RECURSE _files "${_dir}/*.h" "${_dir}/*.cc")
  foreach(_f IN LISTS _files)
    math(EXPR _n "${_n} + 1")
    file(STRINGS "${_f}" _lines REGEX "remove_all[ \t]*\\(")
    foreach(_line IN LISTS _lines)
      if(NOT _line MATCHES "^[ \t]*//")
        list(APPEND _bad "${_f}: ${_line}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(_bad)
  string(REPLACE ";" "\n" _bad "${_bad}")
  message(FATAL_ERROR "remove_all called (use RemoveTree, engine/fs/mapped_file.h):\n${_bad}")
endif()
if(_n EQUAL 0)
  message(FATAL_ERROR "no sources found under ${DIRS}")
endif()
message(STATUS "no remove_all: ${_n} files checked")
