#!/usr/bin/env bash
# Checks `megatrain plan`'s projected step time (Note [Plan projection] in
# engine/job/plan.h) against the steps measured on `nvidia-h200` and
# recorded in docs/performance.md (issue 19: error <= 15%). A plan starts
# nothing: the daemon runs on the CPU; the machine is given by flags, with
# the rates docs/performance.md records for that machine (pinned link 55
# GB/s each way, bf16 matmul 780 TFLOP/s, CPU AdamW 5.78 G params/s, 139
# GiB of device memory, 125 GiB of host).
#
# Usage: deploy/plan-check.sh BUILD_DIR   (needs megatraind and megatrain built)
# Prints a Markdown table on stdout: each run's measured and projected step
# seconds, the projection's bound and the error (projected / measured - 1).
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
source "$SRC/tests/integration/lib.sh" "$BUILD/server/megatraind" "$BUILD/client/megatrain" "$SRC"
start_daemon "$WORK/state" >&2

MACHINE=(--host_memory 125GiB --gpu_memory 139GiB --h2d_gbps 55 --d2h_gbps 55
         --matmul_tflops 780 --adamw_gparams 5.78)
echo "| run (docs/performance.md) | measured s/step | projected s/step | bound | error |"
echo "|---|---|---|---|---|"
# row LABEL MEASURED_TOKENS_PER_S PLAN_ARGS...: the measured step is the
# step's tokens over the recorded tokens/s.
row() {
  local label=$1 measured_tps=$2
  shift 2
  local json
  json=$(cli --json plan "${MACHINE[@]}" "$@")
  python3 - "$label" "$measured_tps" "$json" <<'PY'
import json, sys
label, tps, p = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
pr = p["projection"]
measured = int(pr["tokens"]) / tps
projected = float(pr["step_seconds"])
print(f"| {label} | {measured:.3f} ({tps:,.0f} tokens/s) | {projected:.3f} | {pr['bound']} | "
      f"{100 * (projected / measured - 1):+.0f}% |")
PY
}
S=(--micro_batch 8 --seq_len 2048 --dtype bf16)
# 2026-11-24 (nvidia-h200, merged code).
row "llama-1b, accumulation 1, clip 1.0" 33112 --preset llama-1b "${S[@]}" \
  --gradient_accumulation_steps 1 --max_grad_norm 1
row "llama-1b, accumulation 4, clip 1.0" 34845 --preset llama-1b "${S[@]}" \
  --gradient_accumulation_steps 4 --max_grad_norm 1
row "llama-3b, accumulation 1, clip 1.0" 13781 --preset llama-3b "${S[@]}" \
  --gradient_accumulation_steps 1 --max_grad_norm 1
row "llama-1b, clip 0" 33767 --preset llama-1b "${S[@]}" --gradient_accumulation_steps 1 \
  --max_grad_norm 0
row "llama-3b, clip 0" 14428 --preset llama-3b "${S[@]}" --gradient_accumulation_steps 1 \
  --max_grad_norm 0
row "gemma2-2b, clip 0" 11327 --preset gemma2-2b "${S[@]}" --gradient_accumulation_steps 1 \
  --max_grad_norm 0
row "gemma2-2b, clip 1.0, auto resident" 11380 --preset gemma2-2b "${S[@]}" \
  --gradient_accumulation_steps 1 --max_grad_norm 1
row "qwen3-moe-4b, accumulation 4, clip 1.0" 14272 --preset qwen3-moe-4b "${S[@]}" \
  --gradient_accumulation_steps 4 --max_grad_norm 1
row "mixtral-4b, accumulation 4, clip 1.0" 22491 --preset mixtral-4b "${S[@]}" \
  --gradient_accumulation_steps 4 --max_grad_norm 1
row "llama-8b, accumulation 4, clip 1.0, weight_stream fp32" 6450 --preset llama-8b "${S[@]}" \
  --gradient_accumulation_steps 4 --max_grad_norm 1 --weight_stream fp32
row "llama-3b, accumulation 8, clip 1.0, all in RAM" 14485 --preset llama-3b "${S[@]}" \
  --gradient_accumulation_steps 8 --max_grad_norm 1
# The tiered run's disk rate is not recorded apart from the run: 25.6 GB
# read and 25.6 GB written took 18-21 s, i.e. ~2.6 GB/s each way on the
# virtual disk (/dev/vda); this row checks the overlap model, not a rate.
row "llama-3b, accumulation 8, clip 1.0, moments on NVMe (best of 4,572-5,137)" 5137 \
  --preset llama-3b "${S[@]}" --gradient_accumulation_steps 8 --max_grad_norm 1 \
  --nvme_tier moments --nvme 1TB --nvme_read_gbps 2.6 --nvme_write_gbps 2.6
# 2026-11-21 (the check docs/operations.md recorded first; one
# micro-batch per step, the default clipping).
row "llama-1b, 2026-11-21 (0.529 s)" 30973 --preset llama-1b "${S[@]}" \
  --gradient_accumulation_steps 1
row "llama-3b, 2026-11-21 (1.190 s)" 13768 --preset llama-3b "${S[@]}" \
  --gradient_accumulation_steps 1
row "llama-8b, 2026-11-21 (2.230 s)" 7347 --preset llama-8b "${S[@]}" \
  --gradient_accumulation_steps 1
