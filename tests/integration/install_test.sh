#!/usr/bin/env bash
# Integration (issue 20): `cmake --install` to a temporary prefix, then the
# installed programs run from there: megatraind (started from the prefix),
# megatrain (a job to SUCCEEDED), `megatrain tokenize` with the installed
# SentencePiece module (found in <prefix>/lib), and the files the systemd
# unit, Prometheus and Grafana need. Called as <megatraind> <megatrain>
# <source dir> <build dir>.
source "$(dirname "$0")/lib.sh"
BUILD_DIR=${4:?usage: $0 MEGATRAIND MEGATRAIN SOURCE_DIR BUILD_DIR}

prefix="$WORK/prefix"
log "cmake --install $BUILD_DIR --prefix $prefix"
cmake --install "$BUILD_DIR" --prefix "$prefix" >"$WORK/install.log" 2>&1 ||
  fail "cmake --install failed: $(tail -n 20 "$WORK/install.log")"
for path in bin/megatraind bin/megatrain bin/megatrain-tokenize bin/megatrain-bench \
            bin/megatrain-logits bin/megatrain-loadtest lib/libmegatrain_sentencepiece.so \
            lib/systemd/system/megatraind.service share/megatrain/prometheus/prometheus.yml \
            share/megatrain/prometheus/prometheus-rules.yml \
            share/megatrain/grafana/dashboards/megatrain.json share/doc/megatrain/README.md; do
  [[ -e "$prefix/$path" ]] || fail "not installed: $path"
done
grep -q "^ExecStart=$prefix/bin/megatraind " "$prefix/lib/systemd/system/megatraind.service" ||
  fail "unit's ExecStart does not use the prefix: $(grep ExecStart "$prefix/lib/systemd/system/megatraind.service")"
for program in megatraind megatrain megatrain-tokenize megatrain-bench megatrain-logits megatrain-loadtest; do
  "$prefix/bin/$program" --version | grep -q " [0-9]" || fail "$program --version"
done

# From here on, only the installed programs; nothing from the build tree.
DAEMON_BIN="$prefix/bin/megatraind"
CLI_BIN="$prefix/bin/megatrain"
unset MEGATRAIN_SENTENCEPIECE_MODULE

log "megatrain tokenize with the installed module"
cp -r "$SOURCE_DIR/examples/data/corpus" "$WORK/corpus"
"$CLI_BIN" tokenize "$WORK"/corpus/*.txt --tokenizer "$SOURCE_DIR/examples/data/tiny-spm.model" \
  --out "$WORK/tokens" >"$WORK/tokenize.log" 2>&1 || fail "tokenize: $(cat "$WORK/tokenize.log")"
ls "$WORK"/tokens/*.mtt >/dev/null || fail "tokenize wrote no shard"

log "the installed daemon runs a job"
start_daemon "$WORK/state" --host_memory_budget=4GiB
job_file=$(write_job installed 10)
sed -i "s|tokens: .*|tokens: $WORK/tokens|" "$job_file"
out=$(cli submit "$job_file" --wait) || fail "submit --wait: $out"
[[ "$out" == *"ended SUCCEEDED"* ]] || fail "no SUCCEEDED: $out"
stop_daemon || fail "daemon exit $?"
log "PASS"
