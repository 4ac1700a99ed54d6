#!/usr/bin/env bash
# Integration: Debian's `prometheus` scrapes megatraind with the scrape
# configuration shipped in deploy/prometheus.yml (target and interval
# rewritten for this run) and returns megatrain_tokens_total > 0 through its
# HTTP API.
source "$(dirname "$0")/lib.sh"

command -v prometheus >/dev/null || fail "prometheus is required (apt-get install prometheus)"
start_daemon "$WORK/state"
# A 10-step job: the scrape needs tokens counted, not the whole example job.
cli submit "$(write_job scraped 10)" --wait >/dev/null || fail "the 10-step job did not succeed"

start_prometheus

# Prometheus offers no notification of a finished scrape, so this polls its
# query API: at most 120 tries 0.5 s apart (scrape interval 1 s; the first
# scrape comes within a second or two of start-up).
query='megatrain_tokens_total > 0'
value=""
for attempt in $(seq 1 120); do
  result=$(curl -sf --get "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$query" || true)
  value=$(jq -r '.data.result[0].value[1] // empty' <<<"$result" 2>/dev/null || true)
  if [[ -n "$value" ]]; then break; fi
  sleep 0.5
done
[[ -n "$value" ]] || fail "prometheus never returned $query; log: $(tail -n 20 "$WORK/prometheus.log")"
log "prometheus: megatrain_tokens_total = $value"
jq -en "$value > 0" >/dev/null || fail "megatrain_tokens_total = $value"

# The target is healthy and carries the job label from deploy/.
targets=$(curl -sf "http://127.0.0.1:$PROM_PORT/api/v1/targets")
[[ $(jq -r '.data.activeTargets[0].health' <<<"$targets") == up ]] || fail "target: $targets"
[[ $(jq -r '.data.activeTargets[0].labels.job' <<<"$targets") == megatraind ]] || fail "job label"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
