#!/usr/bin/env bash
# The end-to-end run on a GPU machine (issue #5): a real HF checkpoint and
# real text trained on the GPU through megatraind, driven by the megatrain CLI.
#
#   1. build everything (deploy/gpu-build.sh) and run the daemon-free CUDA
#      TrainingJob test;
#   2. data: English text from Debian documentation packages
#      (deploy/fetch-e2e-corpus.sh, run beforehand on a Debian machine; the
#      gzipped corpus is at $CORPUS), a SentencePiece model trained on it with
#      spm_train, token shards with a held-out split written by
#      `megatrain tokenize`;
#   3. model: a Llama-3.2-1B-shaped LlamaForCausalLM (hidden 2048, 16 layers,
#      32 query / 8 KV heads, MLP 8192, RoPE theta 500000 with llama3 scaling,
#      tied embeddings; vocabulary = the tokenizer's) written by transformers'
#      save_pretrained in bf16, i.e. the real on-disk format;
#   4. megatraind on cuda:0; `megatrain submit`, `watch`, `checkpoint` at mid
#      run, /metrics scraped every few seconds during the run;
#   5. `megatrain export` of the last checkpoint; transformers loads it and its
#      logits / loss on held-out text are compared with the engine's.
# Everything the docs need lands in $OUT: logs, events.jsonl (every step and
# eval), metrics scrapes, summary.json. Exits non-zero when a check fails.
#
# Environment: OUT (./e2e-out), WORK (/tmp/megatrain-e2e), CORPUS
# (.deps/e2e/corpus.txt.gz), STEPS (300), MICRO_BATCH (8), SEQ_LEN (1024),
# VOCAB (16384), SKIP_BUILD (0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/e2e-out}
WORK=${WORK:-/tmp/megatrain-e2e}
CORPUS=${CORPUS:-.deps/e2e/corpus.txt.gz}
STEPS=${STEPS:-300}
MICRO_BATCH=${MICRO_BATCH:-8}
SEQ_LEN=${SEQ_LEN:-1024}
VOCAB=${VOCAB:-16384}
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
t0=$(date +%s)
log() { echo "[e2e +$(( $(date +%s) - t0 ))s] $*"; }
failures=()
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" = 0 ]; then log "PASS $1: $3"; else log "FAIL $1: $3"; failures+=("$1"); fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader | tee "$OUT/device.txt"
echo "cpus=$(nproc) mem_gib=$(free -g | awk '/Mem:/{print $2}')" | tee -a "$OUT/device.txt"

# ---- 1. build ---------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MEGATRAIN_BUILD_SERVER=ON bash deploy/gpu-build.sh build-gpu megatraind megatrain megatrain-tokenize \
    megatrain_sentencepiece megatrain-logits training_job_test > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
  log "build done"
fi
prefix=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=$prefix/usr/bin:$PATH
build-gpu/tests/training_job_test --gtest_filter='*Cuda*' > "$OUT/training_job_cuda.log" 2>&1
check training_job_cuda_test $? "$(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/training_job_cuda.log" | tr '\n' ' ')"

# ---- 2. data ----------------------------------------------------------------
[ -f "$CORPUS" ] || { echo "no corpus at $CORPUS: run deploy/fetch-e2e-corpus.sh on a Debian machine"; exit 1; }
zcat "$CORPUS" > "$WORK/corpus.txt"
spm_train --input="$WORK/corpus.txt" --model_prefix="$WORK/spm" --vocab_size="$VOCAB" \
  --character_coverage=0.9995 --byte_fallback=true --input_sentence_size=300000 \
  --shuffle_input_sentence=true --max_sentence_length=8192 --num_threads="$(nproc)" \
  > "$OUT/spm_train.log" 2>&1 || { tail "$OUT/spm_train.log"; exit 1; }
log "spm_train: $(grep -c . "$WORK/spm.vocab") pieces"
cli_bin=build-gpu/client/megatrain
"$cli_bin" tokenize "$WORK/corpus.txt" --tokenizer "$WORK/spm.model" --out "$WORK/data/train" \
  --eval_fraction 0.03 --eval_out "$WORK/data/eval" --add_bos --json > "$OUT/tokenize.json" \
  || { echo "tokenize failed"; exit 1; }
log "tokenize: $(cat "$OUT/tokenize.json")"

# ---- 3. model ---------------------------------------------------------------
python3 - "$WORK/hf-init" "$VOCAB" > "$OUT/hf-init.log" 2>&1 <<'PY' || { cat "$OUT/hf-init.log"; exit 1; }
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, vocab = sys.argv[1], int(sys.argv[2])
# Llama-3.2-1B's config.json except vocab_size (ours is the tokenizer's).
cfg = LlamaConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, hidden_act="silu",
                  max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
                  rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print(sum(p.numel() for p in model.parameters()), "parameters")
PY
log "hf-init: $(tail -1 "$OUT/hf-init.log"); files: $(ls "$WORK/hf-init" | tr '\n' ' ')"

# ---- 4. the daemon ----------------------------------------------------------
state="$WORK/state"
mkdir -p "$state"
mkfifo "$WORK/ready"
build-gpu/server/megatraind --state_dir="$state" --device=cuda:0 --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 ${DAEMON_ARGS:-} >"$WORK/ready" 2>"$OUT/megatraind.log" &
daemon=$!
IFS= read -r -t 180 line <"$WORK/ready" || { echo "daemon did not start"; tail "$OUT/megatraind.log"; exit 1; }
[[ "$line" =~ grpc=([^ ]+)\ metrics=([^ ]+) ]] || { echo "bad ready line: $line"; exit 1; }
grpc=${BASH_REMATCH[1]}; metrics=${BASH_REMATCH[2]}
log "megatraind: $line"
cli() { "$cli_bin" --server "$grpc" "$@"; }
cli status --json > "$OUT/status.json"

cat > "$WORK/job.yaml" <<EOF
name: e2e-llama-3.2-1b-shape
model:
  hf_dir: $WORK/hf-init
data:
  tokens: $WORK/data/train
  eval_tokens: $WORK/data/eval
train:
  micro_batch: $MICRO_BATCH
  seq_len: $SEQ_LEN
  max_steps: $STEPS
  compute_dtype: bf16
  max_grad_norm: 1.0
optimizer:
  lr: 6.0e-4
  weight_decay: 0.1
  warmup_steps: 30
  schedule: cosine
  min_lr_ratio: 0.1
eval:
  every_steps: 25
  batches: 8
checkpoint:
  every_steps: $(( STEPS / 2 ))
  keep_last: 2
output_dir: $WORK/out
labels:
  run: e2e-gpu
EOF
cp "$WORK/job.yaml" "$OUT/job.yaml"
job=$(cli submit "$WORK/job.yaml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
[ -n "$job" ] || { echo "submit failed"; tail "$OUT/megatraind.log"; exit 1; }
log "submitted $job"
cli watch "$job" > "$OUT/watch.log" 2>&1 &
watcher=$!

# /metrics every 3 s while the job runs (timestamped, the families of interest).
(
  while kill -0 $daemon 2>/dev/null; do
    ts=$(date +%s.%N)
    env -u LD_LIBRARY_PATH curl -s --max-time 2 "http://$metrics/metrics" \
      | grep -E '^megatrain_(tokens_total|pcie_|nvml_|phase_seconds_total|gpu_memory|mfu|tokens_per_second|training_loss|eval_loss|step_seconds_(sum|count))' \
      | sed "s/^/$ts /"
    sleep 3
  done
) > "$OUT/metrics-series.txt" &
scraper=$!

# A checkpoint on request in the middle of the run.
mid=$(( STEPS / 3 ))
for _ in $(seq 300); do
  step=$(cli get "$job" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["progress"]["step"] if j["state"]=="RUNNING" else -1)')
  [ "$step" -ge "$mid" ] 2>/dev/null && break
  if [ "$step" = -1 ] && [ "$(cli get "$job" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" != QUEUED ]; then break; fi
  sleep 2
done
cli checkpoint "$job" --json > "$OUT/checkpoint-request.json" 2>&1
check checkpoint_on_request $? "$(tr -d '\n ' < "$OUT/checkpoint-request.json")"
env -u LD_LIBRARY_PATH curl -s "http://$metrics/metrics" > "$OUT/metrics-mid.txt"

wait $watcher
check job_succeeded $? "$(tail -1 "$OUT/watch.log")"
env -u LD_LIBRARY_PATH curl -s "http://$metrics/metrics" > "$OUT/metrics-end.txt"
cli get "$job" --json > "$OUT/job.json"
cli watch "$job" --json > "$OUT/events.jsonl" 2>/dev/null
cli checkpoints "$job" --json > "$OUT/checkpoints.json"
cli status --json > "$OUT/status-end.json"
last_ckpt=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["checkpoints"]; print(max(c, key=lambda x: x["step"])["id"])' "$OUT/checkpoints.json")
log "checkpoints: $(python3 -c 'import json,sys; print([c["id"] for c in json.load(open(sys.argv[1]))["checkpoints"]])' "$OUT/checkpoints.json")"

# ---- 5. export and transformers ---------------------------------------------
for dtype in bf16 fp32; do
  cli export "$last_ckpt" --out "$WORK/export-$dtype" --dtype "$dtype" > "$OUT/export-$dtype.log" 2>&1
  check "export_$dtype" $? "$(ls "$WORK/export-$dtype" 2>/dev/null | tr '\n' ' ')"
done
kill $scraper 2>/dev/null
kill -TERM $daemon; wait $daemon; daemon_rc=$?
check daemon_sigterm_exit "$daemon_rc" "exit code $daemon_rc"

eval_shard=$(ls "$WORK"/data/eval/*.mtt | head -1)
for dtype in fp32 bf16; do
  tol=1e-4; [ "$dtype" = bf16 ] && tol=2e-2
  for model in export-fp32 export-bf16; do
    build-gpu/engine/megatrain-logits --model "$WORK/$model" --tokens "$eval_shard" --seq_len "$SEQ_LEN" \
      --device cuda --compute_dtype "$dtype" --out "$WORK/logits-$model-$dtype" > /dev/null 2>>"$OUT/logits.log"
    python3 deploy/check-hf-export.py --model "$WORK/$model" --engine "$WORK/logits-$model-$dtype" \
      --dtype "$dtype" --tolerance "$tol" | tee -a "$OUT/hf-check.jsonl"
    check "transformers_logits_${model}_$dtype" "${PIPESTATUS[0]}" "tolerance $tol"
  done
done

# ---- summary ----------------------------------------------------------------
# Held-out loss of the initial model (one window, engine, fp32) for the
# "eval loss falls" check; the daemon's first eval is after eval.every_steps.
build-gpu/engine/megatrain-logits --model "$WORK/hf-init" --tokens "$eval_shard" --seq_len "$SEQ_LEN" \
  --device cuda --compute_dtype fp32 --out "$WORK/logits-init" > /dev/null 2>>"$OUT/logits.log"
cp "$WORK/logits-init.json" "$OUT/init-eval.json" 2>/dev/null
python3 - "$OUT" > "$OUT/summary.txt" <<'PY'
import json, sys, collections
out = sys.argv[1]
events = [json.loads(l) for l in open(f"{out}/events.jsonl") if l.strip()]
steps = [e for e in events if e.get("kind") == "step"]
evals = [e for e in events if e.get("kind") == "eval"]
ckpts = [e for e in events if e.get("kind") == "checkpoint"]
job = json.load(open(f"{out}/job.json"))
init_loss = json.load(open(f"{out}/init-eval.json")).get("loss")
tail = steps[5:]
tps = sorted(s["tokens_per_s"] for s in tail)
series = collections.defaultdict(list)
for line in open(f"{out}/metrics-series.txt"):
    parts = line.rstrip("\n").split(" ")
    if len(parts) >= 3:
        series[" ".join(parts[1:-1])].append((float(parts[0]), float(parts[-1])))
def span(name, *must):
    keys = [k for k in series if k.split("{")[0] == name and all(m in k for m in must)]
    s = series[keys[0]] if keys else []
    return [s[0][1], s[-1][1], s[-1][0] - s[0][0]] if s else None
hf = [json.loads(l) for l in open(f"{out}/hf-check.jsonl") if l.strip()]
summary = {
  "job": job["id"], "state": job["state"], "steps": len(steps),
  "first_loss": steps[0]["loss"] if steps else None,
  "last_loss": steps[-1]["loss"] if steps else None,
  "initial_heldout_loss": init_loss,
  "evals": [[e["step"], e["eval_loss"]] for e in evals],
  "checkpoints": [[e["checkpoint_id"], e["seconds"]] for e in ckpts],
  "median_tokens_per_s": tps[len(tps) // 2] if tps else None,
  "median_mfu": sorted(s["mfu"] for s in tail)[len(tail) // 2] if tail else None,
  "median_step_seconds": sorted(s["step_seconds"] for s in tail)[len(tail) // 2] if tail else None,
  "wall_seconds": (steps[-1]["time_unix_ms"] - steps[0]["time_unix_ms"]) / 1e3 if steps else None,
  "metrics_tokens_total": span("megatrain_tokens_total"),
  "metrics_pcie_h2d_bytes_total": span("megatrain_pcie_bytes_total", 'direction="h2d"'),
  "metrics_pcie_d2h_bytes_total": span("megatrain_pcie_bytes_total", 'direction="d2h"'),
  "hf_checks": hf,
  "metric_names": sorted(series),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k not in ("metric_names", "hf_checks")}))
ok_eval = len(evals) >= 2 and init_loss is not None and evals[-1]["eval_loss"] < init_loss - 2.0 \
    and evals[-1]["eval_loss"] < evals[0]["eval_loss"]
print("CHECK eval_loss_falls", "PASS" if ok_eval else "FAIL")
g, h = summary["metrics_tokens_total"], summary["metrics_pcie_h2d_bytes_total"]
print("CHECK metrics_grow", "PASS" if g and h and g[1] > g[0] and h[1] > h[0] else "FAIL")
PY
cat "$OUT/summary.txt"
while read -r _ name verdict; do
  [ "$verdict" = PASS ]; check "$name" $? "see summary.json"
done < <(grep '^CHECK' "$OUT/summary.txt")
log "done; failures: ${failures[*]:-none}"
[ ${#failures[@]} -eq 0 ]
