#!/usr/bin/env bash
# Installs every Debian package MegaTrain needs to build, test and run on a
# CPU machine (Debian 12). Idempotent: packages already present are skipped.
# GPU machines with pip-installed torch use deploy/gpu-build.sh instead.
set -euo pipefail

PACKAGES=(
  # build tools
  cmake ninja-build g++ pkg-config clang clang-format
  # libFuzzer and sanitizer runtimes for clang (deploy/run-fuzzers.sh)
  libclang-rt-dev
  # engine (OpenBLAS: Debian's LibTorch otherwise calls the reference BLAS, ~10x slower)
  libtorch-dev libopenblas0-pthread libabsl-dev nlohmann-json3-dev libxxhash-dev libsentencepiece-dev sentencepiece
  # engine/dist: gloo's headers for LibTorch's ProcessGroupGloo (docs/distributed.md;
  # not in deploy/fetch-debs.sh: the GPU build uses pip torch's own c10d)
  libgloo-dev
  # HF tokenizer.json: PCRE2 (Split regexes), ICU (NF* normalizers)
  libpcre2-dev libicu-dev
  # NVMe tier: io_uring (engine/store/nvme_tier.cc)
  liburing-dev
  # server and client
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  prometheus-cpp-dev libcpp-httplib-dev libsqlite3-dev libyaml-cpp-dev libcli11-dev libssl-dev
  # tests
  libgtest-dev libgmock-dev prometheus curl openssl jq python3
  # Python client (client/python), its wheel (deploy/build-python-wheel.sh)
  # and its integration test (a venv)
  python3-grpcio python3-protobuf python3-yaml python3-setuptools python3-wheel python3-venv
  # chat templates (client/python/megatrain_client/chat_template.py)
  python3-jinja2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
