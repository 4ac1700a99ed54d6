#!/usr/bin/env bash
# Downloads (does not install) the Debian 12 packages that a GPU machine
# without them needs to build MegaTrain with deploy/gpu-build.sh: the C++
# dependencies other than LibTorch, with their runtime libraries. Run on a
# Debian 12 machine (apt-get update first); the .deb files land in
# .deps/debs/ (git ignores it), which gpu-build.sh unpacks into a private
# prefix on the GPU machine (never into /).
#
#   deploy/fetch-debs.sh [dir]     # default .deps/debs
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.deps/debs}
mkdir -p "$dir"
PACKAGES=(
  # engine
  libabsl-dev libabsl20220623 nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0
  libsentencepiece-dev libsentencepiece0
  # HF tokenizer.json: PCRE2 and ICU
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72 icu-devtools
  # NVMe tier: io_uring
  liburing-dev liburing2
  # server and client
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 libc-ares-dev libc-ares2 libre2-dev libre2-9
  libprotobuf-dev libprotobuf-lite32 libprotobuf32 libprotoc32 protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  civetweb libcivetweb-dev libcivetweb1 libcpp-httplib-dev libcpp-httplib0.11
  libsqlite3-dev libsqlite3-0 libyaml-cpp-dev libyaml-cpp0.7 libssl-dev libssl3 zlib1g-dev
  libcurl4-openssl-dev libcurl4 libbrotli-dev libbrotli1
  # tests
  googletest libgtest-dev libgmock-dev
)
(cd "$dir" && apt-get download "${PACKAGES[@]}")
echo "fetch-debs: $(ls "$dir"/*.deb | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1))"
