# ctest script (the server_core_layering test). server/core/ is the daemon's
# library core; server/rpc/ is its gRPC front end, where proto types stop
# (house style, "Layering"). Fails when a file under server/core/ (any depth)
#  - includes a gRPC or protobuf header, a generated `.pb.h`, anything from
#    proto/, or a header of server/rpc/ (the core must not reach up to its
#    front end), or
#  - includes a prometheus-cpp header outside the metrics registry
#    (core/metrics.h and core/metrics.cc): the rest of the core records
#    metrics through megatrain::server::ServerMetrics.
# The registry is allowed prometheus-cpp because it is where server/ turns
# the engine's plain stats into Prometheus families (house style), and it is
# part of the core, not of the gRPC front end.
cmake_minimum_required(VERSION 3.22)
file(GLOB_RECURSE _files "${CORE_DIR}/*.h" "${CORE_DIR}/*.cc")
set(_prometheus_allowed "metrics.h;metrics.cc")
set(_bad "")
foreach(_f IN LISTS _files)
  file(STRINGS "${_f}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](grpcpp/|grpc/|grpc\\+\\+/|google/protobuf/|proto/|server/rpc/)|\\.pb\\.h[\">]")
  if(_lines)
    list(APPEND _bad "${_f}: ${_lines}")
  endif()
  file(RELATIVE_PATH _rel "${CORE_DIR}" "${_f}")
  list(FIND _prometheus_allowed "${_rel}" _allowed)
  if(_allowed EQUAL -1)
    file(STRINGS "${_f}" _prom REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]prometheus/")
    if(_prom)
      list(APPEND _bad "${_f}: prometheus-cpp outside core/metrics.{h,cc}: ${_prom}")
    endif()
  endif()
endforeach()
list(LENGTH _files _n)
if(_bad)
  string(REPLACE ";" "\n" _bad "${_bad}")
  message(FATAL_ERROR "server/core layering violated:\n${_bad}")
endif()
if(_n EQUAL 0)
  message(FATAL_ERROR "no sources found under ${CORE_DIR}")
endif()
message(STATUS "server/core layering ok: ${_n} files checked")
