#!/usr/bin/env bash
# Long context at 8B (issue 19): llama-8b at micro-batch 1 x 128k tokens
# (then longer, while the time budget lasts) on one H200 with a 125 GiB
# host, through deploy/gpu-long-context.sh. Builds megatrain-bench first
# (~1 min with a warm cache). docs/performance.md, "Long context at 8B",
# has the memory arithmetic behind the flags and the predicted results:
#   - clipping off (--max_grad_norm=0, the sweep's default), the gradient
#     ring and the fp32 master streamed (--gradient_landing=ring
#     --weight_stream=fp32): ~12.8 bytes/param of host store (103 GB)
#     instead of 16 (129 GB, over the host once the staging for 128k
#     tokens is added);
#   - saved layer inputs on the device (OFFLOAD=0, --activations=device):
#     offloading them would need 31 x 2.1 GB = 67 GB more pinned host
#     memory at 128k, which this host does not have; the device holds them
#     (69 GB at 128k) beside one layer's working set, which the chunked MLP
#     (Note [Chunked MLP] in engine/model/layers.h) keeps near 25 GB;
#   - nothing resident (--resident_layers=0 --resident_embedding=0): at a
#     step of about a minute what residency saves is noise, and its 16 GB
#     are better left to the activations.
#   deploy/gpu-long-context-8b.sh      # SEQS ("131072 163840"), BUDGET_S (330)
# Output under $OUT (./gpu-out): long-context.jsonl, long-context.log, the
# table on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"
t0=$(date +%s)
MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh build-gpu megatrain-bench > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# Each length is one process: start-up (store of 8.03 B parameters,
# pinning) plus one measured step; no new length starts after BUDGET_S
# seconds of the sweep.
PRESET=llama-8b OFFLOAD=0 SEQS=${SEQS:-131072 163840} BUDGET_S=${BUDGET_S:-330} OUT="$OUT" \
  EXTRA="--weight_stream=fp32 --gradient_landing=ring --resident_layers=0 --resident_embedding=0" \
  bash deploy/gpu-long-context.sh
