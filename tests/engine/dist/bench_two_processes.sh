#!/bin/bash
# megatrain-bench --dist=env as torchrun would start it on two hosts, here
# two processes on loopback (gloo over a TCPStore): both must finish within
# the deadline with the same loss (their replicas see the same reduced
# gradient; Note [Replica processes] in engine/dist/data_parallel.h) and
# report 2 processes. With `ring` the gradient ring (clipping off; Note
# [Ring shards] in engine/step/gradient_reducer.h): the ring takes the
# device path (one rank per process: its shard is the whole block, each
# all-reduced over the processes), and both processes still agree. With
# `tier` the AdamW moments on the NVMe tier under one --nvme_dir (Note
# [Tier shards] in engine/store/nvme_tier.h): both processes train with it,
# read and write their own files, and agree.
# Usage: bench_two_processes.sh <megatrain-bench> <dir> [ring|tier]
set -u
bench=$1
dir=$2
mode=${3:-arena}
extra=()
reduction=host_all_reduce
if [ "$mode" = ring ]; then
  extra=(--gradient_landing=ring --max_grad_norm=0)
  reduction=device_reduce_scatter
fi
mkdir -p "$dir"
if [ "$mode" = tier ]; then
  mkdir -p "$dir/nvme"
  extra=(--nvme_tier=moments "--nvme_dir=$dir/nvme")
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for rank in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$rank LOCAL_RANK=0 \
    timeout -k 5 240 "$bench" --model=tiny --device=cpu --steps=3 --warmup=1 --threads=1 \
    --dist=env --json "${extra[@]}" >"$dir/out.$rank.json" 2>"$dir/err.$rank.txt" &
  pids+=($!)
done
status=0
for rank in 0 1; do
  if ! wait "${pids[$rank]}"; then
    echo "process $rank failed (124: the 240 s deadline):"; cat "$dir/err.$rank.txt"; status=1
  fi
done
[ $status -eq 0 ] || exit 1
python3 - "$dir" "$reduction" "$mode" <<'PY'
import json, sys
d = sys.argv[1]
runs = [json.load(open(f"{d}/out.{r}.json")) for r in (0, 1)]
for r in runs:
    assert r["processes"] == 2, r
    assert r["gradient_reduction"] == sys.argv[2], r
    assert r["gradient_ring"] == (sys.argv[3] == "ring"), r
    assert r["nvme_tier"] == ("moments" if sys.argv[3] == "tier" else "off"), r
    if sys.argv[3] == "tier":
        assert r["nvme_written_bytes_per_step"] > 0, r
assert runs[0]["loss_last"] == runs[1]["loss_last"], (runs[0]["loss_last"], runs[1]["loss_last"])
assert runs[0]["loss_first"] == runs[1]["loss_first"]
print("two processes: loss", runs[0]["loss_first"], "->", runs[0]["loss_last"], "on both")
PY
