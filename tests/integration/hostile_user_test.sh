#!/usr/bin/env bash
# Issue 36 against the real daemon and engine: absurd model sizes through
# PlanJob (`megatrain plan --hf_dir`) and SubmitJob (a config.json in the
# model directory) are INVALID_ARGUMENT naming the field and the limit, at
# once and without the daemon growing; an output_dir equal to an output
# root is refused; the daemon is still there and admits an ordinary job.
source "$(dirname "$0")/lib.sh"

out_root="$WORK/out"
mkdir -p "$out_root"
start_daemon "$WORK/state" --output_roots="$out_root"

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$DAEMON_PID/status"; }
rss_before=$(rss_kib)

for layers in 2147483648 1000000; do
  hf="$WORK/model-$layers"
  mkdir -p "$hf"
  cat >"$hf/config.json" <<JSON
{"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
 "num_attention_heads": 4, "num_hidden_layers": $layers}
JSON
  start=$(date +%s)
  expect_cli_error INVALID_ARGUMENT "num_hidden_layers: must be <= 4096, got $layers" \
    plan --hf_dir "$hf"
  job=$(write_job "hostile-$layers" 5)
  sed -i "s|  preset: tiny|  hf_dir: $hf|" "$job"
  expect_cli_error INVALID_ARGUMENT "num_hidden_layers: must be <= 4096, got $layers" \
    submit "$job"
  (($(date +%s) - start < 30)) || fail "refusing $layers layers took $(($(date +%s) - start)) s"
done
rss_after=$(rss_kib)
((rss_after < rss_before + 262144)) ||
  fail "daemon RSS grew from $rss_before KiB to $rss_after KiB refusing hostile models"
log "hostile models refused; RSS $rss_before -> $rss_after KiB"

root_job=$(write_job root-dir 5 "output_dir: $out_root")
expect_cli_error INVALID_ARGUMENT "is the output root" submit "$root_job"

ok_job=$(write_job ordinary 5 "output_dir: $out_root/ordinary")
cli submit "$ok_job" >/dev/null || fail "an ordinary job was refused after the hostile ones"
kill -0 "$DAEMON_PID" || fail "the daemon is gone"
log "PASS"
