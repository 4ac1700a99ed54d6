#!/usr/bin/env bash
# Data parallelism on a multi-GPU host (issue 21, docs/distributed.md): one
# call builds megatrain-bench and the NCCL test, runs the NCCL
# reduce-scatter test, then measures llama-3b at micro-batch 8 x 2048 with
# clipping at 1.0 (bf16) on 1, 2 and 4 GPUs (as many as the host has), and
# checks the torchrun path (--dist=env). Prints tokens/s and the speedup
# over one GPU (the issue's targets: 2 GPUs >= 1.85x, 4 GPUs >= 3.6x).
#
#   deploy/gpu-dp-bench.sh                 # everything
#   GPUS="1 2" STEPS=6 deploy/gpu-dp-bench.sh
#
# Environment: GPUS (default "1 2 4", cut to the host's count), MODEL
# (llama-3b), MICRO_BATCH (8), SEQ_LEN (2048), STEPS (5), WARMUP (2),
# BUILD_DIR (build-gpu), SKIP_BUILD (0), HOST_PATH (1: also measure each
# N > 1 with --gradient_reduction=host_all_reduce, the path without the
# device reduce-scatter), TORCHRUN (1: the --dist=env runs below).
# Results: $OUT/dp.jsonl, $OUT/dp.txt, one log per run.
#
# The commands it runs, for a lead running them by hand (B=build-gpu/engine):
#   $B/megatrain-bench --model=llama-3b --device=cuda --devices=N --compute_dtype=bf16 \
#     --micro_batch=8 --seq_len=2048 --gradient_accumulation_steps=1 --max_grad_norm=1.0 \
#     --steps=5 --warmup=2 --data=random --json                        # N = 1, 2, 4
#   torchrun --standalone --nnodes=1 --nproc_per_node=1 --no-python $B/megatrain-bench \
#     --dist=env --devices=N ...                  # one process per host, N GPUs as threads
#   torchrun --standalone --nnodes=1 --nproc_per_node=2 --no-python $B/megatrain-bench \
#     --dist=env --devices=1 --model=llama-1b ... # two replica processes (the multi-host path
#                                                 # on one host: cross-process NCCL all-reduce)
# On several hosts: on each, torchrun --nnodes=H --node_rank=K --nproc_per_node=1
#   --rdzv_backend=static --master_addr=HOST0 --master_port=29500 --no-python
#   $B/megatrain-bench --dist=env --devices=<GPUs per host> ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
MODEL=${MODEL:-llama-3b}
MB=${MICRO_BATCH:-8}
SEQ_LEN=${SEQ_LEN:-2048}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=OFF bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench \
    nccl_reduce_scatter_test dist_multi_process_test gradient_shard_test \
    > "$OUT/build-dp.log" 2>&1 || { tail -30 "$OUT/build-dp.log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bench="$BUILD_DIR/engine/megatrain-bench"
have=$(nvidia-smi -L | wc -l)
echo "GPUs: $have"; nvidia-smi -L
grep -h "c10d backends" "$OUT/build-dp.log" 2>/dev/null

# The unit tests: the NCCL ones need 2 GPUs (they skip otherwise); the
# gloo ones skip on pip's torch (no gloo headers).
for t in gradient_shard_test nccl_reduce_scatter_test dist_multi_process_test; do
  "$BUILD_DIR/tests/$t" > "$OUT/$t.log" 2>&1
  echo "$t: exit $? ($(grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$OUT/$t.log" | tr '\n' ' '))"
done

common=(--model="$MODEL" --device=cuda --compute_dtype=bf16 --micro_batch="$MB"
        --seq_len="$SEQ_LEN" --gradient_accumulation_steps=1 --max_grad_norm=1.0
        --steps="$STEPS" --warmup="$WARMUP" --data=random --json)
: > "$OUT/dp.jsonl"
run() {  # label, then the command
  local label=$1; shift
  echo "== $label: $*"
  if "$@" 2> "$OUT/$label.log" > "$OUT/$label.json"; then
    python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]);
j["label"]=sys.argv[2]; print(json.dumps(j))' "$OUT/$label.json" "$label" >> "$OUT/dp.jsonl"
  else
    echo "   failed: $(tail -3 "$OUT/$label.log")"
  fi
}
for n in ${GPUS:-1 2 4}; do
  [ "$n" -le "$have" ] || { echo "skip $n GPUs (the host has $have)"; continue; }
  run "dp-$n" "$bench" "${common[@]}" --devices="$n"
  if [ "$n" -gt 1 ] && [ "${HOST_PATH:-1}" = 1 ]; then
    run "dp-$n-host" "$bench" "${common[@]}" --devices="$n" --gradient_reduction=host_all_reduce
  fi
done
if [ "${TORCHRUN:-1}" = 1 ] && command -v torchrun > /dev/null; then
  n=$(( have >= 2 ? 2 : 1 ))
  run "torchrun-1x$n" torchrun --standalone --nnodes=1 --nproc_per_node=1 --no-python \
    "$bench" "${common[@]}" --dist=env --devices="$n"
  if [ "$have" -ge 2 ]; then
    # Two processes, each one GPU and its own host-store replica (the
    # multi-host layout on one host); llama-1b so that two replicas fit.
    # Every process prints its JSON: the two lines must show the same loss.
    echo "== torchrun-2x1 (llama-1b, two replica processes)"
    torchrun --standalone --nnodes=1 --nproc_per_node=2 --no-python \
      "$bench" "${common[@]}" --model=llama-1b --dist=env --devices=1 \
      > "$OUT/torchrun-2x1.json" 2> "$OUT/torchrun-2x1.log" || echo "   failed: $(tail -3 "$OUT/torchrun-2x1.log")"
    grep -o '"loss_last":[^,]*' "$OUT/torchrun-2x1.json"
  fi
fi
python3 - "$OUT/dp.jsonl" <<'PY' | tee "$OUT/dp.txt"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
one = next((r["tokens_per_s"] for r in runs if r["label"] == "dp-1"), None)
print(f"{'run':<16} {'devices':>7} {'procs':>5} {'reduction':<22} {'tokens/s':>10} {'speedup':>8} {'step s':>7} {'loss_last':>10}")
for r in runs:
    speed = r["tokens_per_s"] / one if one else float("nan")
    print(f"{r['label']:<16} {r.get('devices', 1):>7} {r.get('processes', 1):>5} "
          f"{r.get('gradient_reduction', '-'):<22} {r['tokens_per_s']:>10.0f} {speed:>7.2f}x "
          f"{r['step_seconds']:>7.3f} {r.get('loss_last', float('nan')):>10.4f}")
print("targets: 2 GPUs >= 1.85x, 4 GPUs >= 3.6x (issue 21)")
PY
echo "total: $(( $(date +%s) - start )) s"
