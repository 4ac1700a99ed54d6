#!/usr/bin/env bash
# `megatrain plan` against the real daemon and engine (issue 19): a 120B
# Llama does not fit a 1.5 TB host with everything in host memory and fits
# with the AdamW moments on an NVMe tier (auto picks it); the daemon's own
# budgets fill unset machine fields; bad input is INVALID_ARGUMENT naming
# the field. A plan starts nothing: no job appears.
source "$(dirname "$0")/lib.sh"

start_daemon "$WORK/state" --host_memory_budget=64GiB --nvme_budget=2TB

big=(--family llama --params 120B --micro_batch 8 --seq_len 2048 --dtype bf16
     --offload_activations --host_memory 1.5TB --gpu_memory 139GiB)
off=$(cli --json plan "${big[@]}" --nvme_tier off --nvme 0)
[[ $(jq -r .fits <<<"$off") == false ]] || fail "120B fits 1.5 TB all in RAM? $off"
jq -r .verdict <<<"$off" | grep -q "fits with memory.nvme_tier: moments" ||
  fail "verdict does not point at the NVMe tier: $off"
auto=$(cli --json plan "${big[@]}" --nvme_tier auto --nvme 8TB)
[[ $(jq -r .fits <<<"$auto") == true ]] || fail "120B with NVMe does not fit: $auto"
[[ $(jq -r .nvme_tier <<<"$auto") == moments ]] || fail "auto did not pick moments: $auto"
params=$(jq -r .params <<<"$auto")
nvme=$(jq -r .nvme_bytes <<<"$auto")
# 8 bytes per parameter (two fp32 moments), plus the 4 KiB block padding.
python3 -c "import sys; p, n = $params, $nvme; sys.exit(0 if 8 * p <= n < 8.01 * p else 1)" ||
  fail "NVMe bytes $nvme are not 8 x $params"
log "120B: all in RAM does not fit; auto: $(jq -r .verdict <<<"$auto")"

# The daemon's machine: its --host_memory_budget and --nvme_budget.
own=$(cli --json plan --preset llama-8b --nvme_tier auto)
[[ $(jq -r .machine.host_memory_bytes <<<"$own") == $((64 << 30)) ]] || fail "budget: $own"
[[ $(jq -r .machine.nvme_bytes <<<"$own") == 2000000000000 ]] || fail "nvme budget: $own"
cli plan --preset llama-8b | grep -q "step .* projected" || fail "no projected step in text"

expect_cli_error INVALID_ARGUMENT "memory.nvme_tier" plan --preset llama-8b --nvme_tier all
expect_cli_error INVALID_ARGUMENT "model.family" plan --family gpt --params 1B
expect_cli_error INVALID_ARGUMENT "train.micro_batch" plan --preset llama-8b --micro_batch 0
[[ $(cli --json list | jq '.jobs | length') == 0 ]] || fail "a plan created a job"
log "PASS"
