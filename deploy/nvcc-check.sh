#!/usr/bin/env bash
# Compile-checks every CUDA source of the engine with nvcc (no GPU needed):
# the fused kernels (engine/model/fused_kernels.cu) include only CUDA
# headers, so a machine with the CUDA toolkit but a CPU-only LibTorch can
# still check them. Usage: deploy/nvcc-check.sh [NVCC] (default: nvcc on
# PATH, else /usr/local/cuda/bin/nvcc). Exits 0 when every file compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc_bin="${1:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [[ ! -x "$nvcc_bin" ]]; then
  echo "nvcc-check: no nvcc at $nvcc_bin" >&2
  exit 2
fi
arch="${MEGATRAIN_CUDA_ARCH:-90}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
while IFS= read -r src; do
  if timeout 300 "$nvcc_bin" -std=c++20 -arch="sm_${arch}" -I. -Xcompiler -Wall,-Wextra -Werror all-warnings \
      -c "$src" -o "$out/$(basename "$src").o"; then
    echo "nvcc-check: ok $src"
  else
    echo "nvcc-check: FAILED $src" >&2
    status=1
  fi
done < <(git ls-files 'engine/*.cu')
exit "$status"
