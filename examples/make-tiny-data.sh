#!/usr/bin/env bash
# Remakes the example token shards of examples/jobs/tiny.yaml from the
# licence-text corpus (examples/data/README.md): examples/jobs/data/tiny/
# (training) and examples/jobs/data/tiny-eval/ (about 10% of the documents
# held out), tokenized with examples/data/tiny-spm.model (vocab 512, the
# `tiny` preset's). Gives the committed shards byte for byte (checked with
# cmp on Debian 12's SentencePiece).
#
#   examples/make-tiny-data.sh [OUT_DIR]   # default: examples/jobs/data
#
# Needs a build with megatrain-tokenize (cmake --build build --target
# megatrain megatrain-tokenize megatrain_sentencepiece), or MEGATRAIN_BIN
# pointing at the directory of an installed `megatrain`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-examples/jobs/data}
bin=${MEGATRAIN_BIN:-build/client}
"$bin/megatrain" tokenize examples/data/corpus/*.txt \
  --tokenizer examples/data/tiny-spm.model \
  --out "$out/tiny" --eval_out "$out/tiny-eval" --eval_fraction 0.1 \
  --prefix train --overwrite
ls -l "$out/tiny" "$out/tiny-eval"
