#!/usr/bin/env bash
# Data-parallel scaling check (issue 21) on one multi-GPU host: builds
# megatrain-bench (deploy/gpu-build.sh) and measures llama-3b, bf16,
# micro-batch 8 x 2048, one micro-batch per GPU per step, clipping at 1.0,
# on 1, 2 and (when the host has them) 4 GPUs through
# `megatrain-bench --devices N` (data parallel over NCCL, one shared host
# store and one AdamW: docs/distributed.md). Prints tokens/s, the scaling
# ratios against one GPU (targets: 1.85x at 2 GPUs, 3.6x at 4), and each
# GPU's PCIe link use during the measured steps (nvidia-smi dmon's rxpci /
# txpci, MB/s, averaged over the samples of each run in which the GPU moved
# anything) beside the bench's own rank-0 H2D figures.
#
#   deploy/gpu-dp-check.sh [bench args...]
#
# Then, on a host with 2 or more GPUs, the job runner and the daemon over
# NCCL (JOB_CHECK=1): data_parallel_job_test's GPU tests (2 GPUs train as
# one accumulating the same global batch, within 1e-5; a suspended 2-GPU
# job resumes bit for bit, with its AdamW moments in host memory or on the
# NVMe tier under the test's temporary directory), and megatraind on cuda:0,cuda:1 running the
# tiny example with train.devices 2 (its progress lines show the job's and
# each device's tokens/s; /metrics per device), plus a job asking for 3
# devices, refused at submission with RESOURCE_EXHAUSTED.
#
# Environment: MODEL (llama-3b), MICRO_BATCH (8), SEQ_LEN (2048), ACCUM (1,
# per GPU), CLIP (1.0), STEPS (4), WARMUP (2), DEVICES ("1 2 4": counts
# above the host's GPUs are skipped), BUILD_DIR (build-gpu), SKIP_BUILD (0),
# JOB_CHECK (1).
# Results: $OUT/dp.jsonl (one bench JSON per GPU count), $OUT/dp.txt (the
# table), $OUT/dmon-N.txt (nvidia-smi dmon during the N-GPU run),
# $OUT/bench-N.log (the bench's progress), $OUT/dp-job-test.log,
# $OUT/dp-daemon.log, $OUT/dp-metrics.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
MODEL=${MODEL:-llama-3b}
MICRO_BATCH=${MICRO_BATCH:-8}
SEQ_LEN=${SEQ_LEN:-2048}
ACCUM=${ACCUM:-1}
CLIP=${CLIP:-1.0}
DEVICES=${DEVICES:-"1 2 4"}
BUILD_DIR=${BUILD_DIR:-build-gpu}
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  targets=(megatrain-bench)
  [ "${JOB_CHECK:-1}" = 1 ] && targets+=(data_parallel_job_test megatraind megatrain)
  MEGATRAIN_BUILD_SERVER=$([ "${JOB_CHECK:-1}" = 1 ] && echo ON || echo OFF) \
    bash deploy/gpu-build.sh "$BUILD_DIR" "${targets[@]}" \
    > "$OUT/build-$(basename "$BUILD_DIR").log" 2>&1 ||
    { tail -30 "$OUT/build-$(basename "$BUILD_DIR").log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
  # CMake says which c10d backends the build has (NCCL is the one needed).
  grep -h "c10d backends" "$OUT/build-$(basename "$BUILD_DIR").log" || true
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
echo "host: ${gpus} GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true
: > "$OUT/dp.jsonl"
for n in $DEVICES; do
  if [ "$n" -gt "$gpus" ]; then
    echo "devices $n: skipped (this host has $gpus GPU(s))"
    continue
  fi
  # PCIe throughput of every GPU, one sample a second, while the bench runs.
  nvidia-smi dmon -s t -d 1 -o T > "$OUT/dmon-$n.txt" 2>&1 &
  dmon=$!
  "$BUILD_DIR"/engine/megatrain-bench --model="$MODEL" --device=cuda --devices="$n" \
    --compute_dtype=bf16 --micro_batch="$MICRO_BATCH" --seq_len="$SEQ_LEN" \
    --gradient_accumulation_steps="$ACCUM" --max_grad_norm="$CLIP" \
    --steps="${STEPS:-4}" --warmup="${WARMUP:-2}" --data=random --json "$@" \
    2> "$OUT/bench-$n.log" | tail -n 1 >> "$OUT/dp.jsonl"
  status=${PIPESTATUS[0]}
  kill "$dmon" 2>/dev/null; wait "$dmon" 2>/dev/null
  if [ "$status" != 0 ]; then
    echo "devices $n: megatrain-bench failed ($status):"
    tail -20 "$OUT/bench-$n.log"
  fi
done
python3 - "$OUT" <<'EOF' | tee "$OUT/dp.txt"
import json, sys, collections
out = sys.argv[1]
runs = []
for line in open(f"{out}/dp.jsonl"):
    line = line.strip()
    if line.startswith("{"):
        runs.append(json.loads(line))
if not runs:
    sys.exit("no run finished")
base = next((r for r in runs if r.get("devices", 1) == 1), None)
targets = {2: 1.85, 4: 3.6}
print(f"{runs[0]['model']} bf16 micro_batch {runs[0]['micro_batch']} x {runs[0]['seq_len']}, "
      f"accum {runs[0]['gradient_accumulation_steps']} per GPU, clip {runs[0]['max_grad_norm']}, "
      f"on {runs[0]['device']}")
print(f"{'GPUs':>4} {'tokens/s':>10} {'per GPU':>9} {'scaling':>8} {'target':>7} {'step s':>7} "
      f"{'MFU':>6} {'rank0 H2D GB/s busy':>19} {'rank0 link use':>14} {'host GiB':>9}")
for r in runs:
    n = r.get("devices", 1)
    tps = r["tokens_per_s"]
    scaling = tps / base["tokens_per_s"] if base else float("nan")
    target = targets.get(n)
    verdict = "" if target is None else ("ok" if scaling >= target else "MISSED")
    print(f"{n:>4} {tps:>10.0f} {tps / n:>9.0f} {scaling:>7.2f}x "
          f"{(f'{target:.2f}x' if target else '-'):>7} {r['step_seconds']:>7.3f} "
          f"{r.get('mfu', 0):>6.3f} {r.get('h2d_gb_per_s_busy', 0):>19.2f} "
          f"{r.get('h2d_link_utilization', 0):>14.2f} "
          f"{r['host_bytes']['total'] / 2**30:>9.1f} {verdict}")
# nvidia-smi dmon -s t -o T: "#Time gpu rxpci txpci" (MB/s), one row per
# GPU per second. Per GPU: the mean over the seconds it moved anything
# (the run's build-up and teardown seconds with no traffic are left out).
print("per-GPU PCIe (nvidia-smi dmon, MB/s, mean over active seconds): rx = host->GPU, tx = GPU->host")
for r in runs:
    n = r.get("devices", 1)
    samples = collections.defaultdict(list)
    try:
        for line in open(f"{out}/dmon-{n}.txt"):
            f = line.split()
            if not f or f[0].startswith("#") or len(f) < 4:
                continue
            try:
                gpu, rx, tx = int(f[1]), float(f[2]), float(f[3])
            except ValueError:
                continue
            if rx + tx > 0:
                samples[gpu].append((rx, tx))
    except OSError:
        continue
    cells = []
    for gpu in sorted(samples):
        s = samples[gpu]
        cells.append(f"GPU{gpu} rx {sum(x for x, _ in s) / len(s):.0f} tx "
                     f"{sum(y for _, y in s) / len(s):.0f} ({len(s)} s)")
    print(f"  {n} GPU(s): " + ("; ".join(cells) if cells else "no samples"))
EOF
if [ "${JOB_CHECK:-1}" = 1 ] && [ "$gpus" -ge 2 ]; then
  timeout 900 "$BUILD_DIR"/tests/data_parallel_job_test --gtest_brief=1 \
    > "$OUT/dp-job-test.log" 2>&1
  echo "data_parallel_job_test: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' \
    "$OUT/dp-job-test.log" | tr '\n' ' ')"
  grep -E "relative|Failure|FAILED  \]" "$OUT/dp-job-test.log" | head -20
  bash deploy/gpu-dp-daemon-check.sh "$BUILD_DIR"
fi
echo "total: $(( $(date +%s) - start )) s"
