#!/usr/bin/env bash
# A daemon job's export and TensorBoard files against the reference tools,
# on a GPU machine (where transformers and tensorboard are installed;
# issue 35):
#   1. a small Llama written by transformers' save_pretrained (random
#      weights, the Qwen2 byte-level BPE tokenizer of tests/testdata beside
#      it, with a chat template and a generation_config.json);
#   2. megatraind on cuda:0: `megatrain tokenize`, a bf16 job of that
#      directory (the README's job file, sizes reduced) with `submit
#      --wait`, then `megatrain export`;
#   3. deploy/check-hf-export.py on the export: AutoModelForCausalLM loads
#      it with no missing or unexpected keys, its logits match
#      megatrain-logits' on the same tokens, config.json keeps every key of
#      the source, the tokenizer files are copied byte for byte and
#      AutoTokenizer encodes and renders the chat template as the source
#      does (EXPORT PASS);
#   4. tensorboard's EventAccumulator reads the job's event files
#      (<output_dir>/metrics): train/loss has one scalar per step, equal to
#      the losses in the job's CSV (TB PASS).
#
#   deploy/gpu-export-check.sh [build-dir]
# Needs megatraind, megatrain and megatrain-logits in build-dir
# (default build-gpu). Prints PASS/FAIL lines; exits non-zero on a FAIL.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
work=$(mktemp -d /tmp/megatrain-export.XXXXXX)
status=0

python3 - "$work/hf" tests/testdata/tokenizers/qwen2-bpe <<'PY' || { echo "MODEL FAIL"; exit 1; }
import json, shutil, sys, torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
out, tok = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
LlamaForCausalLM(cfg).save_pretrained(out)
GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=True, temperature=0.7).save_pretrained(out)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", f"{out}/{f}")
with open(f"{out}/chat_template.jinja", "w") as f:
    f.write("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}")
PY
python3 - "$work/corpus.jsonl" <<'PY'
import json, random, sys
rng = random.Random(3)
words = "the cat sat on a mat while data streams through host memory to the GPU".split()
with open(sys.argv[1], "w") as f:
    for _ in range(800):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))}) + "\n")
PY

mkfifo "$work/ready"
"$BUILD_DIR"/server/megatraind --state_dir="$work/state" --device=cuda:0 \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 >"$work/ready" 2>"$OUT/export-daemon.log" &
pid=$!
IFS= read -r -t 120 line <"$work/ready" || { echo "DAEMON FAIL"; tail "$OUT/export-daemon.log"; exit 1; }
[[ "$line" =~ grpc=([^ ]+) ]] || { echo "DAEMON FAIL: $line"; kill -TERM $pid; exit 1; }
grpc=${BASH_REMATCH[1]}
cli() { "$BUILD_DIR"/client/megatrain --server "$grpc" "$@"; }

cli tokenize "$work/corpus.jsonl" --tokenizer "$work/hf" --out "$work/tokens" --eval_fraction 0.05 \
  >"$OUT/export-tokenize.log" 2>&1 || { echo "TOKENIZE FAIL: $(tail -3 "$OUT/export-tokenize.log")"; status=1; }
cat >"$work/job.yaml" <<YAML
model: {hf_dir: $work/hf}
data: {tokens: $work/tokens, eval_tokens: $work/tokens/eval}
train: {micro_batch: 4, seq_len: 128, max_steps: 12, compute_dtype: bf16}
optimizer: {lr: 1.0e-3, warmup_steps: 2}
eval: {every_steps: 6}
checkpoint: {every_steps: 12}
YAML
cli submit "$work/job.yaml" --wait >"$OUT/export-job.log" 2>&1
grep -q "ended SUCCEEDED" "$OUT/export-job.log" || { echo "JOB FAIL: $(tail -5 "$OUT/export-job.log")"; status=1; }
tail -3 "$OUT/export-job.log"
cli export job-000001/step-12 --out "$work/export" >"$OUT/export-export.log" 2>&1 ||
  { echo "EXPORT FAIL: $(tail -3 "$OUT/export-export.log")"; status=1; }

"$BUILD_DIR"/engine/megatrain-logits --model "$work/export" \
  --tokens "$work/tokens/$(ls "$work/tokens" | grep -m1 '\.mtt$')" --seq_len 96 --device cuda \
  --compute_dtype fp32 --out "$work/engine-export" >/dev/null || status=1
if python3 deploy/check-hf-export.py --model "$work/export" --engine "$work/engine-export" \
  --source "$work/hf" --dtype fp32 --tolerance 1e-4; then echo "EXPORT PASS"; else echo "EXPORT FAIL"; status=1; fi

# The job's output directory holds metrics/ (Note [Event file format]).
metrics=$(find "$work/state" -type d -name metrics | head -1)
python3 - "$metrics" <<'PY' && echo "TB PASS" || { echo "TB FAIL"; status=1; }
import csv, glob, math, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
d = sys.argv[1]
acc = EventAccumulator(d, size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
print("event files:", [os.path.basename(p) for p in glob.glob(f"{d}/events.out.tfevents.*")])
print("tags:", tags)
loss = acc.Scalars("train/loss")
print("train/loss:", [(e.step, round(e.value, 4)) for e in loss])
assert [e.step for e in loss] == list(range(1, 13)), "one train/loss per step 1..12"
assert all(math.isfinite(e.value) for e in loss)
for tag in ("train/grad_norm", "train/learning_rate", "train/tokens_per_s", "eval/loss"):
    assert tag in tags, f"no {tag}"
csv_loss = [float(r["loss"]) for r in csv.DictReader(open(f"{d}/steps.csv"))]
# The event file stores float32; the CSV prints the double.
worst = max(abs(a - e.value) / abs(a) for a, e in zip(csv_loss, loss))
print(f"event file vs steps.csv losses: worst relative difference {worst:.2e}")
assert len(csv_loss) == 12 and worst < 1e-6
PY
kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
exit $status
