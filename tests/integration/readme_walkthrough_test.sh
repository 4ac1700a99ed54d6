#!/usr/bin/env bash
# Integration (issue 35, "every command in README and docs/ run by a
# test"): the README's "From nothing to your first job" walkthrough, steps
# 3 to 5, run as written against the real megatraind (real engine, CPU).
# The commands are read out of README.md's first ```sh block, from
# `megatrain tokenize` to its end, and run by bash with `megatrain` on
# PATH and MEGATRAIN_SERVER pointing at the daemon. Only what a CPU test
# cannot take is replaced, each replacement required to match (a README
# edit that breaks one fails here, naming it):
#   - the paths /models/my-llama, /data/my-corpus, my-corpus.jsonl and
#     my-job.yaml, into the test's directory; the model is a tiny Llama
#     written here in the HF format (config.json, model.safetensors) with
#     the Qwen2 byte-level BPE tokenizer of tests/testdata beside it, and
#     the corpus is 600 lines of {"text": ...};
#   - the job's sizes: seq_len 2048 -> 32, micro_batch 4 -> 2, max_steps
#     1000 -> 6, warmup 50 -> 1, eval every 100 -> 3, checkpoints every
#     200 -> 3 (and step-1000 -> step-6 in the export).
# Steps 1 and 2 (build, install, systemd) are install_test.sh's and the
# set-up scripts'. Then checks: the job SUCCEEDED with an eval loss, and
# the export is a model directory with the source's tokenizer.
# Second, docs/data-format.md's "Walkthrough with a released template"
# (chat SFT: render with a template that has no generation blocks, then
# tokenize), run as written with /tmp/chat moved into the test's
# directory: each output its `#` comments show (up to a "...") must be
# what the commands print.
# Third, the README's "Using it" block against a fresh daemon, from the
# repository root, each line as written but for: megatraind (the test
# starts it) and megatrain-bench (GPU) are not run; /tmp/tiny-hf, the
# tokenize line's corpus.txt, spm.model and data/ go to the test's
# directory and examples/; `megatrain checkpoint` ("now, for a running
# job") of the job `--wait` already finished must fail with
# FAILED_PRECONDITION, every other line must succeed.
source "$(dirname "$0")/lib.sh"

QWEN="$SOURCE_DIR/tests/testdata/tokenizers/qwen2-bpe"

# The walkthrough's shell block, from `megatrain tokenize` to the block's end.
awk '/^```sh$/ && !done {on = 1; next} on && /^```$/ {on = 0; done = 1} on' \
  "$SOURCE_DIR/README.md" | sed -n '/^megatrain tokenize/,$p' >"$WORK/walkthrough.sh"
[[ -s "$WORK/walkthrough.sh" ]] || fail "README.md: no \`megatrain tokenize\` in its first sh block"

# replace FROM TO: every FROM in the walkthrough becomes TO; FROM must occur.
replace() {
  grep -qF -- "$1" "$WORK/walkthrough.sh" || fail "README walkthrough no longer has '$1'"
  local from to
  from=$(printf '%s' "$1" | sed 's/[][\.*^$|/]/\\&/g')
  to=$(printf '%s' "$2" | sed 's/[\&|]/\\&/g')
  sed -i "s|$from|$to|g" "$WORK/walkthrough.sh"
}
replace /models/my-llama-tuned "$WORK/my-llama-tuned"
replace /models/my-llama "$WORK/my-llama"
replace /data/my-corpus "$WORK/data/my-corpus"
replace my-corpus.jsonl "$WORK/my-corpus.jsonl"
replace my-job.yaml "$WORK/my-job.yaml"
replace "seq_len: 2048" "seq_len: 32"
replace "micro_batch: 4" "micro_batch: 2"
replace "max_steps: 1000" "max_steps: 6"
replace "warmup_steps: 50" "warmup_steps: 1"
replace "{every_steps: 100}" "{every_steps: 3}"
replace "{every_steps: 200}" "{every_steps: 3}"
replace step-1000 step-6

log "a tiny Llama in the HF format, with the Qwen2 BPE tokenizer"
mkdir -p "$WORK/my-llama"
cp "$QWEN/tokenizer.json" "$QWEN/tokenizer_config.json" "$WORK/my-llama/"
python3 - "$WORK/my-llama" <<'PY' || fail "writing the model"
import array, json, random, struct, sys
out = sys.argv[1]
c = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 2048,
     "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
     "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
     "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
json.dump(c, open(f"{out}/config.json", "w"), indent=1)
V, C, F, H, K = 2048, 32, 64, 4, 2
D = C // H
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for i in range(2):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                   p + "self_attn.q_proj.weight": [H * D, C], p + "self_attn.k_proj.weight": [K * D, C],
                   p + "self_attn.v_proj.weight": [K * D, C], p + "self_attn.o_proj.weight": [C, H * D],
                   p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                   p + "mlp.down_proj.weight": [C, F]})
rng = random.Random(7)
header, blobs, offset = {}, [], 0
for name, shape in sorted(shapes.items()):
    n = 1
    for d in shape:
        n *= d
    values = [1.0] * n if name.endswith("norm.weight") else [rng.gauss(0, 0.02) for _ in range(n)]
    blob = array.array("f", values).tobytes()
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
PY

log "the corpus"
python3 - "$WORK/my-corpus.jsonl" <<'PY' || fail "writing the corpus"
import json, random, sys
rng = random.Random(3)
words = "the cat sat on a mat while data streams through host memory to the GPU".split()
with open(sys.argv[1], "w") as f:
    for _ in range(600):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(40))}) + "\n")
PY

start_daemon "$WORK/state" --host_memory_budget=4GiB
mkdir -p "$WORK/bin"
ln -s "$(realpath "$CLI_BIN")" "$WORK/bin/megatrain"

log "the walkthrough: $(wc -l <"$WORK/walkthrough.sh") lines of README.md"
(cd "$WORK" && PATH="$WORK/bin:$PATH" MEGATRAIN_SERVER="$GRPC_ADDR" \
  bash -euo pipefail "$WORK/walkthrough.sh") >"$WORK/walkthrough.log" 2>&1 ||
  fail "the README walkthrough failed: $(tail -20 "$WORK/walkthrough.log")"

grep -q "job-000001 ended SUCCEEDED" "$WORK/walkthrough.log" ||
  fail "no SUCCEEDED: $(tail -20 "$WORK/walkthrough.log")"
json=$(cli get job-000001 --json)
[[ $(json_field "$json" .progress.step) == 6 ]] || fail "step: $json"
[[ $(json_field "$json" '.progress.eval_loss // empty') != "" ]] || fail "no eval loss: $json"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [[ -s "$WORK/my-llama-tuned/$f" ]] || fail "export has no $f: $(ls "$WORK/my-llama-tuned")"
done
cmp -s "$WORK/my-llama/tokenizer.json" "$WORK/my-llama-tuned/tokenizer.json" ||
  fail "the export's tokenizer.json differs from the source's"
log "$(grep -E "tokens|eval|ended" "$WORK/walkthrough.log" | tail -4)"
log "ok: README walkthrough ran (tokenize, job file, submit --wait, export)"

log "docs/data-format.md: walkthrough with a released template"
awk '/^### Walkthrough with a released template/ {on = 1} on && /^```/ {n++; if (n == 2) exit; next}
     on && n == 1' "$SOURCE_DIR/docs/data-format.md" >"$WORK/chat.sh"
grep -q /tmp/chat "$WORK/chat.sh" || fail "data-format.md walkthrough no longer writes /tmp/chat"
sed -i "s|/tmp/chat|$WORK/chat|g" "$WORK/chat.sh"
(cd "$SOURCE_DIR" && PATH="$WORK/bin:$PATH" bash -euo pipefail "$WORK/chat.sh") \
  >"$WORK/chat.log" 2>&1 || fail "the chat walkthrough failed: $(tail -20 "$WORK/chat.log")"
python3 - "$WORK/chat.sh" "$WORK/chat.log" <<'PY' || fail "the chat walkthrough's output differs"
import sys
script, log = open(sys.argv[1]).read().splitlines(), " ".join(open(sys.argv[2]).read().split())
expected, block = [], []
for line in script + [""]:
    if line.startswith("# "):
        block.append(line[2:])
    elif block:
        expected.append(" ".join(block).split(" ...")[0].rstrip("; "))
        block = []
missing = [e for e in expected if e not in log]
print(f"{len(expected)} documented outputs, {len(missing)} not printed", file=sys.stderr)
for e in missing:
    print(f"documented but not printed: {e}", file=sys.stderr)
sys.exit(1 if missing or not expected else 0)
PY
log "ok: the chat walkthrough printed what data-format.md shows"

log "README.md: Using it"
stop_daemon || true
start_daemon "$WORK/state2" --host_memory_budget=4GiB
awk '/^## Using it/ {on = 1} on && /^```/ {n++; if (n == 2) exit; next} on && n == 1' \
  "$SOURCE_DIR/README.md" | sed 's/ *# .*$//' >"$WORK/using.txt"
grep -q '^megatrain submit examples/jobs/tiny.yaml --wait' "$WORK/using.txt" ||
  fail "README.md's Using it block no longer submits examples/jobs/tiny.yaml --wait"
cp "$SOURCE_DIR/examples/data/corpus/GPL-3.txt" "$WORK/corpus.txt"
ran=0
while IFS= read -r line; do
  [[ -z "$line" || "$line" == megatraind* || "$line" == megatrain-bench* ]] && continue
  line=${line//\/tmp\/tiny-hf/$WORK/tiny-hf}
  line=${line//corpus.txt/$WORK/corpus.txt}
  line=${line//spm.model/examples/data/tiny-spm.model}
  line=${line//--out data\//--out $WORK/data/}
  rc=0
  (cd "$SOURCE_DIR" && PATH="$WORK/bin:$PATH" MEGATRAIN_SERVER="$GRPC_ADDR" \
    bash -c "$line") >"$WORK/line.log" 2>&1 || rc=$?
  if [[ "$line" == "megatrain checkpoint "* ]]; then
    [[ $rc != 0 ]] && grep -q FAILED_PRECONDITION "$WORK/line.log" ||
      fail "'$line' of a finished job: rc $rc, $(cat "$WORK/line.log")"
  else
    [[ $rc == 0 ]] || fail "README.md: '$line' failed (rc $rc): $(tail -5 "$WORK/line.log")"
  fi
  ran=$((ran + 1))
done <"$WORK/using.txt"
[[ $ran -ge 7 ]] || fail "ran $ran lines of README.md's Using it block"
[[ -s "$WORK/tiny-hf/config.json" && -s "$WORK/data/tokenize.json" ]] ||
  fail "no export or token shards from the Using it block"
log "ok: $ran lines of README.md's Using it block"
