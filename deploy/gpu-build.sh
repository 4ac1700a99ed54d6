#!/usr/bin/env bash
# Builds MegaTrain on a GPU machine whose LibTorch comes from a pip-installed
# torch with CUDA (e.g. torch 2.11+cu130), using the project's Debian
# dependencies either installed system-wide (deploy/install-deps.sh minus
# libtorch-dev) or unpacked from .deb files into a private prefix.
#
#   deploy/gpu-build.sh [build-dir] [targets...]
#
# Environment:
#   MEGATRAIN_DEBS     folder of .deb files to unpack (default .deps/debs;
#                      fetch them on a Debian 12 machine with
#                      deploy/fetch-debs.sh). Ignored if absent.
#   MEGATRAIN_PREFIX   where to unpack them (default /opt/megatrain-deps)
#   PYTHON             the Python whose torch to use (default python3)
#   TORCH_CUDA_ARCH_LIST  default 9.0 (Hopper); Torch ignores
#                      CMAKE_CUDA_ARCHITECTURES.
#   MEGATRAIN_BUILD_SERVER  ON (default) or OFF to build only the engine.
#   MEGATRAIN_CMAKE_ARGS    further configure arguments (-DMEGATRAIN_PCH=OFF).
#
# After it, run binaries with the environment printed at the end (the
# unpacked libraries need LD_LIBRARY_PATH). Traps (see docs/operations.md):
# protobuf/gRPC are found before Torch, whose package defines its own
# protobuf target; the GPU image's own /usr/include/google protobuf must not
# be mixed with ours, hence -isystem of the prefix first.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-gpu}
shift || true
targets=("$@")

PYTHON=${PYTHON:-python3}
debs=${MEGATRAIN_DEBS:-.deps/debs}
prefix=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

torch_cmake=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda)')
echo "gpu-build: torch ${torch_version} (${torch_cmake})"

cmake_args=(-G Ninja -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release
            -DMEGATRAIN_CUDA=ON
            -DMEGATRAIN_BUILD_SERVER="${MEGATRAIN_BUILD_SERVER:-ON}")
prefix_path="$torch_cmake"
if [ -d "$debs" ] && ls "$debs"/*.deb >/dev/null 2>&1; then
  mkdir -p "$prefix"
  if [ ! -f "$prefix/.unpacked" ] || [ "$debs" -nt "$prefix/.unpacked" ]; then
    for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
    touch "$prefix/.unpacked"
  fi
  lib="$prefix/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$prefix/usr/bin:$PATH"
  # cpp-httplib is found through pkg-config: see only the unpacked .pc
  # files, with their /usr paths rebased into the prefix.
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  prefix_path="$torch_cmake;$prefix/usr;$lib/cmake;$prefix/usr/share/cmake"
  cmake_args+=(-DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include"
               -DCMAKE_EXE_LINKER_FLAGS="-L$lib -Wl,-rpath-link,$lib"
               -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc"
               -DProtobuf_INCLUDE_DIR="$prefix/usr/include"
               -DProtobuf_LIBRARY="$lib/libprotobuf.so"
               -DGTest_DIR="$lib/cmake/GTest")
fi
cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix_path")
# Extra configure arguments, e.g. MEGATRAIN_CMAKE_ARGS=-DMEGATRAIN_PCH=OFF.
read -r -a extra_args <<< "${MEGATRAIN_CMAKE_ARGS:-}"
cmake_args+=("${extra_args[@]}")

cmake "${cmake_args[@]}"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build "$build_dir" -j "$(nproc)"
fi
echo "gpu-build: done. Run binaries with:"
echo "  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
