#!/usr/bin/env bash
# Data-parallel scaling on one multi-GPU host, in phases that fit one
# device call each (docs/distributed.md, docs/performance.md "Data
# parallel"). Every ratio is against the 1-GPU run of the same build in
# the same call.
#
#   PHASES="build tests" deploy/gpu-dp-scale.sh
#   PHASES="scale" RUNS="llama-3b:1 llama-8b:1:fp32" deploy/gpu-dp-scale.sh
#   PHASES="build daemon-hf" deploy/gpu-dp-scale.sh
#   PHASES=scale RUNS=qwen2.5-14b:1:fp32 DEVICES="1 2" BENCH_ARGS=--peer_copies=true \
#     deploy/gpu-dp-scale.sh     # peer copies at 14B (then DEVICES=2 without, for NCCL)
#   PHASES="build daemon-hf" HF_DEVICES=cuda:0,cuda:1,cuda:2,cuda:3 deploy/gpu-dp-scale.sh
#   PHASES="build scale" RUNS="qwen2.5-14b:4:fp32 mistral-small-24b:4:fp32" DEVICES="1 4" \
#     deploy/gpu-dp-scale.sh     # the largest shapes a 4-GPU host holds
#   PHASES="build scale" RUNS="qwen3-30b-a3b-12l:4:fp32" DEVICES="1 2" \
#     deploy/gpu-dp-scale.sh     # a mixture of experts on 2 GPUs
#   PHASES="build tests scale" RUNS="llama-8b:1:fp32 llama-8b:4:fp32" DEVICES="1 2" CLIP=0 \
#     BENCH_ARGS=--gradient_landing=ring deploy/gpu-dp-scale.sh   # the gradient ring
#     (Note [Ring shards]; CLIP reaches deploy/gpu-dp-check.sh)
#
# Phases (in this order, each skipped unless named in PHASES):
#   build     deploy/gpu-build.sh into build-gpu: the bench, the GPU tests of
#             the data-parallel path, megatraind and the CLI.
#   probe     the peer link: a GPU-to-GPU copy and NCCL's all-reduce of
#             512 MiB (torch), with NCCL's transport (P2P, SHM or NET).
#   tests     nccl_reduce_scatter_test, peer_exchange_test,
#             data_parallel_job_test (2+ GPUs).
#   peer      llama-1b on 2 GPUs, NCCL's collectives against peer copies
#             (--peer_copies), 3 steps of one fixed batch: loss and tokens/s
#             of each; a run still going after PEER_LIMIT s (default 150)
#             has its threads' stacks printed (gdb) and is stopped.
#   scale     for each RUNS entry MODEL:ACCUM[:WEIGHT_STREAM], llama shapes
#             at 8 x 2048 per GPU, clip 1.0, bf16, on DEVICES GPUs (default
#             "1 2 4", cut to the host's): deploy/gpu-dp-check.sh's table
#             (tokens/s, scaling, host bytes, per-GPU PCIe).
#   torchrun  one process driving 2 GPUs, and 2 processes of one GPU each,
#             under torchrun (each bounded by `timeout`).
#   baseline  resident PyTorch on one GPU (BASELINE_PRESETS, default
#             "llama-1b llama-3b"), eager and each decoder layer compiled:
#             deploy/torch_baselines.py.
#   daemon    deploy/gpu-dp-daemon-check.sh (a 2-GPU megatraind job).
#   daemon-hf tests/integration/data_parallel_test.sh on HF_DEVICES
#             (default cuda:0,cuda:1; cuda:0,cuda:1,cuda:2,cuda:3 for 4) with
#             an HF model directory of the llama-1b shape (random weights,
#             written by transformers): SUCCEEDED with per-device tokens/s
#             and PCIe bandwidth, suspend and resume bit for bit, 3 devices
#             refused.
# Results: the tables on stdout; every log in $OUT/dp-scale.tgz (the device
# tool brings back few files). Give the device tool this script's output
# as it is (it keeps the last 12,000 characters): piped through `tail`, a
# call that reaches its time limit brings back nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
source deploy/gpu-bounded.sh
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
work=${WORK:-/tmp/dp-scale}
mkdir -p "$work"
# NVLink multicast stays off on shared hosts (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PHASES=${PHASES:-"build tests scale"}
BUILD_DIR=${BUILD_DIR:-build-gpu}
start=$(date +%s)
has() { [[ " $PHASES " == *" $1 "* ]]; }
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
elapsed "host: $gpus GPU(s), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"

if has build; then
  bash deploy/gpu-build.sh "$BUILD_DIR" megatrain-bench data_parallel_job_test \
    nccl_reduce_scatter_test peer_exchange_test megatraind megatrain > "$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log"; tar czf "$OUT/dp-scale.tgz" -C "$work" .; exit 1; }
  elapsed "build done; $(grep -h 'c10d backends' "$work/build.log" | head -1)"
fi
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

if has probe && [ "$gpus" -ge 2 ]; then
  # The peer link as the collectives see it: a device-to-device copy
  # between GPUs 0 and 1, and NCCL's all-reduce of 512 MiB over all GPUs
  # (one process), with NCCL's own word on its transport.
  NCCL_DEBUG=INFO python3 - > "$work/probe.log" 2>&1 <<'PY'
import time, torch, torch.cuda.nccl as nccl
n = 128 * 1024 * 1024
a = torch.randn(n, device="cuda:0"); b = torch.empty(n, device="cuda:1")
def timed(f, reps=10):
    for _ in range(3): f()
    for i in range(torch.cuda.device_count()): torch.cuda.synchronize(i)
    t = time.time()
    for _ in range(reps): f()
    for i in range(torch.cuda.device_count()): torch.cuda.synchronize(i)
    return (time.time() - t) / reps
dt = timed(lambda: b.copy_(a))
print(f"probe: peer copy 512 MiB: {n * 4 / dt / 1e9:.0f} GB/s, "
      f"peer access {torch.cuda.can_device_access_peer(0, 1)}")
xs = [torch.ones(n, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
dt = timed(lambda: nccl.all_reduce(xs))
print(f"probe: nccl all_reduce 512 MiB over {len(xs)} GPUs: {dt * 1e3:.1f} ms, "
      f"algbw {n * 4 / dt / 1e9:.0f} GB/s")
PY
  grep -E "^probe:" "$work/probe.log"
  grep -hoE "via (P2P|SHM|NET)[^ ]*( [^ ]+)?" "$work/probe.log" | sort | uniq -c | head -5
fi

if has tests; then
  for t in nccl_reduce_scatter_test peer_exchange_test data_parallel_job_test; do
    timeout 300 "$BUILD_DIR/tests/$t" > "$work/$t.log" 2>&1
    elapsed "$t: exit $? $(grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$work/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure|error' "$work/$t.log" | head -10
  done
fi

if has peer && [ "$gpus" -ge 2 ]; then
  for peer in false true; do
    "$BUILD_DIR/engine/megatrain-bench" --model=llama-1b --device=cuda --devices=2 \
      --compute_dtype=bf16 --micro_batch=8 --seq_len=2048 --gradient_accumulation_steps=1 \
      --max_grad_norm=1.0 --steps=3 --warmup=1 --data=fixed --json --peer_copies=$peer \
      --collective_timeout_s=60 > "$work/peer-$peer.json" 2> "$work/peer-$peer.log" &
    wait_bounded $! "${PEER_LIMIT:-150}" "peer_copies=$peer"
    elapsed "peer_copies=$peer: exit $? $(grep -oE '"(tokens_per_s|loss_last|peer_copies)":[^,]*' "$work/peer-$peer.json" | tr '\n' ' ')"
    grep -iE 'error|peer copies' "$work/peer-$peer.log" | head -5
  done
fi

if has scale; then
  # Public shapes past the presets (deploy/public-shapes.sh): RUNS may
  # name qwen2.5-14b, mistral-small-24b or qwen3-30b-a3b-12l / -24l.
  source deploy/public-shapes.sh
  write_public_shapes
  # Never more than the host has (the bench refuses before allocating).
  budget=$(awk '/MemAvailable/ {printf "%d", ($2 - 6 * 1048576) * 1024}' /proc/meminfo)
  for run in ${RUNS:-"llama-3b:1 llama-8b:1:fp32"}; do
    IFS=: read -r model accum stream <<< "$run"
    label="$model-a$accum${stream:+-$stream}"
    model=$(public_shape_dir "$model")
    elapsed "scale $label"
    OUT="$work/$label" MODEL="$model" ACCUM="$accum" SKIP_BUILD=1 JOB_CHECK=0 \
      STEPS=${STEPS:-4} WARMUP=${WARMUP:-2} DEVICES="${DEVICES:-1 2 4}" \
      bash deploy/gpu-dp-check.sh --weight_stream="${stream:-bf16}" \
      --host_memory_budget="$budget" ${BENCH_ARGS:-} 2>&1 |
      grep -v '^$' | head -40
  done
fi

if has torchrun && command -v torchrun > /dev/null && [ "$gpus" -ge 2 ]; then
  bench="$BUILD_DIR/engine/megatrain-bench"
  common=(--model=llama-1b --device=cuda --compute_dtype=bf16 --micro_batch=8 --seq_len=2048
          --gradient_accumulation_steps=1 --max_grad_norm=1.0 --steps=3 --warmup=1
          --data=random --json)
  timeout 240 torchrun --standalone --nnodes=1 --nproc_per_node=1 --no-python \
    "$bench" "${common[@]}" --dist=env --devices=2 > "$work/torchrun-1x2.json" \
    2> "$work/torchrun-1x2.log"
  elapsed "torchrun 1 process x 2 GPUs: exit $? $(grep -o '"tokens_per_s":[0-9.]*' "$work/torchrun-1x2.json")"
  timeout 240 torchrun --standalone --nnodes=1 --nproc_per_node=2 --no-python \
    "$bench" "${common[@]}" --dist=env --devices=1 > "$work/torchrun-2x1.json" \
    2> "$work/torchrun-2x1.log"
  elapsed "torchrun 2 processes x 1 GPU: exit $? $(grep -o '"loss_last":[^,]*' "$work/torchrun-2x1.json" | tr '\n' ' ')"
fi

if has baseline; then
  for preset in ${BASELINE_PRESETS:-llama-1b llama-3b}; do
    for mode in eager compiled; do
      extra=()
      [ "$mode" = compiled ] && extra=(--compile)
      timeout 300 python3 deploy/torch_baselines.py --mode resident --preset "$preset" \
        --micro-batch 8 --ckpt --clip "${extra[@]}" > "$work/torch-$preset-$mode.log" 2>&1
      elapsed "torch $preset $mode: exit $? $(tail -1 "$work/torch-$preset-$mode.log")"
    done
  done
fi

if has daemon; then
  SKIP_BUILD=1 OUT="$work/daemon" timeout 400 bash deploy/gpu-dp-daemon-check.sh \
    > "$work/daemon.log" 2>&1
  elapsed "daemon check: exit $?"
  tail -25 "$work/daemon.log"
fi
if has daemon-hf && [ "$gpus" -ge 2 ]; then
  hf=/tmp/dp-llama-1b-hf
  python3 - "$hf" > "$work/hf-dir.log" 2>&1 <<'PY'
import sys, torch, transformers
c = transformers.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    tie_word_embeddings=False, torch_dtype="bfloat16")
with torch.device("cuda"):
    m = transformers.LlamaForCausalLM(c).to(torch.bfloat16)
m.save_pretrained(sys.argv[1])
print("hf dir:", sys.argv[1], sum(p.numel() for p in m.parameters()), "parameters")
PY
  elapsed "$(tail -1 "$work/hf-dir.log")"
  DP_DEVICES=${HF_DEVICES:-cuda:0,cuda:1} DP_MODEL="{hf_dir: $hf}" DP_TRAIN="compute_dtype: bf16" \
    DP_STEPS=${DP_STEPS:-60} DP_CHECKPOINT="{every_steps: 1000, keep_last: 1}" DP_LIMITS=0 \
    timeout 420 bash tests/integration/data_parallel_test.sh "$BUILD_DIR/server/megatraind" \
    "$BUILD_DIR/client/megatrain" "$PWD" > "$work/daemon-hf.log" 2>&1
  elapsed "daemon-hf: exit $?"
  tail -12 "$work/daemon-hf.log"
fi
tar czf "$OUT/dp-scale.tgz" -C "$work" . 2>/dev/null
elapsed "done"
