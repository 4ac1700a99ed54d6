#!/usr/bin/env bash
# Checks of a running megatraind on a GPU, sourced by deploy/gpu-server-check.sh
# (which sets cli, metrics, state and OUT):
#   * GPU out of memory (issue #7): a llama-1b job at micro-batch 64 x 8192
#     fails with a message suggesting a smaller micro-batch; the daemon then
#     runs the next job;
#   * the daemon's PCIe byte counters against NVML's PCIe byte counters over
#     a llama-1b job (issue #6: within 10%): the growth of
#     megatrain_pcie_link_estimate_bytes_total (the engine's copies as link
#     bytes, server/core/pcie_link_model.h) against that of
#     megatrain_nvml_pcie_bytes_total, rx and tx, between the job's first and
#     last scrape; the payload counters (megatrain_pcie_bytes_total h2d
#     against rx, d2h against tx) for reference; also, for reference only, the
#     old comparison with NVML's 20 ms throughput gauge (server/core/nvml.h,
#     Note [NVML PCIe counters]).
#   * a llama-1b job with train.offload_activations (1 x 8192) trains;
# Prints OOM_CHECK / AFTER_OOM_JOB / OFFLOAD_JOB / PCIE_CHECK / PCIE_GAUGE lines. Needs
# bash, curl and python3 only.

data_abs=$PWD/examples/jobs/data/tiny
cat > "$state/oom.yaml" <<YAML
name: oom-check
model: {preset: llama-1b}
data: {tokens: $data_abs}
train: {micro_batch: 64, seq_len: 8192, max_steps: 2, compute_dtype: bf16}
optimizer: {lr: 1.0e-5}
YAML
cli submit "$state/oom.yaml" --wait > "$OUT/oom-submit.log" 2>&1
echo "oom job: submit --wait exit $? (non-zero expected)"
job_named() {
  cli list --json | python3 -c 'import json,sys; print([j["id"] for j in json.load(sys.stdin)["jobs"] if j["name"]==sys.argv[1]][0])' "$1"
}
oom_job=$(job_named oom-check)
cli get "$oom_job" --json > "$OUT/oom-job.json"
python3 - "$OUT/oom-job.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
msg = j["error_message"]
ok = j["state"] == "FAILED" and "out of memory" in msg and "micro_batch" in msg
print("OOM_CHECK", "PASS" if ok else "FAIL", j["state"], j["error_code"], msg[:700])
PY
cli submit examples/jobs/tiny-gpu.yaml --wait > "$OUT/after-oom.log" 2>&1
echo "AFTER_OOM_JOB exit $? (0 expected): $(tail -1 "$OUT/after-oom.log")"

# A job with train.offload_activations on the GPU (micro-batch 1 x 8192):
# it must train, and its stored spec must keep the field.
cat > "$state/offload.yaml" <<YAML
name: offload-check
model: {preset: llama-1b}
data: {tokens: $data_abs}
train: {micro_batch: 1, seq_len: 8192, max_steps: 3, compute_dtype: bf16, offload_activations: true}
optimizer: {lr: 1.0e-5}
YAML
cli submit "$state/offload.yaml" --wait > "$OUT/offload-submit.log" 2>&1
offload_rc=$?
cli get "$(job_named offload-check)" --json > "$OUT/offload-job.json"
python3 - "$OUT/offload-job.json" "$offload_rc" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
spec = j.get("spec", {}).get("train", {})
ok = sys.argv[2] == "0" and j["state"] == "SUCCEEDED" and spec.get("offload_activations") is True
print("OFFLOAD_JOB", "PASS" if ok else "FAIL", j["state"], "offload_activations =",
      spec.get("offload_activations"), (j.get("error_message") or "")[:300])
PY

cat > "$state/pcie.yaml" <<YAML
name: pcie-check
model: {preset: llama-1b}
data: {tokens: $data_abs}
train: {micro_batch: 8, seq_len: 2048, max_steps: ${PCIE_STEPS:-60}, compute_dtype: bf16, max_grad_norm: 0}
optimizer: {lr: 1.0e-5}
YAML
cli submit "$state/pcie.yaml" > /dev/null
pcie_job=$(job_named pcie-check)
: > "$OUT/pcie-scrapes.txt"
for _ in $(seq 150); do
  ts=$(date +%s.%N)
  env -u LD_LIBRARY_PATH curl -s "http://$metrics/metrics" \
    | grep -E '^megatrain_(pcie_bytes_total|nvml_pcie_|tokens_total|pcie_utilization|pcie_link_)' \
    | sed "s/^/$ts /" >> "$OUT/pcie-scrapes.txt"
  now=$(cli get "$pcie_job" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  if [ "$now" = SUCCEEDED ] || [ "$now" = FAILED ]; then break; fi
  sleep 1
done
echo "pcie job: $now"
python3 - "$OUT/pcie-scrapes.txt" <<'PY'
import collections, sys
# Lines: "<unix time> <series> <value>", one scrape after another.
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.rstrip("\n").split(" ")
    rows[" ".join(p[1:-1])].append((float(p[0]), float(p[-1])))
def find(name, *must):
    for k, v in rows.items():
        if k.split("{")[0] == name and all(m in k for m in must):
            return v
    return []
def growth(series):
    # Counter growth between the job's first and last scrape.
    return series[-1][1] - series[0][1] if len(series) >= 2 else None
def common(a, b):
    # The scrapes that have both series, so that both growths span one interval.
    times = {t for t, _ in a} & {t for t, _ in b}
    return [x for x in a if x[0] in times], [x for x in b if x[0] in times]
def compare_counters(label, ours, nvml):
    ours, nvml = common(ours, nvml)
    d, n = growth(ours), growth(nvml)
    if d is None or n is None or n <= 0:
        print(f"PCIE_CHECK {label}: no data (daemon {d}, NVML {n}; "
              "megatrain_nvml_pcie_bytes_total needs NVML_FI_DEV_PCIE_COUNT_*_BYTES, R550+)")
        return
    ratio = d / n
    verdict = "within 10%" if abs(ratio - 1) <= 0.10 else "NOT within 10%"
    seconds = ours[-1][0] - ours[0][0]
    print(f"PCIE_CHECK {label}: daemon {d:.0f} B, NVML {n:.0f} B over {seconds:.1f} s "
          f"({len(ours)} scrapes), ratio daemon/NVML {ratio:.3f}: {verdict}")
h2d = find("megatrain_pcie_bytes_total", 'direction="h2d"')
d2h = find("megatrain_pcie_bytes_total", 'direction="d2h"')
rx = find("megatrain_nvml_pcie_bytes_total", 'direction="rx"')
tx = find("megatrain_nvml_pcie_bytes_total", 'direction="tx"')
compare_counters("h2d vs NVML rx", h2d, rx)
compare_counters("d2h vs NVML tx", d2h, tx)
late = find("megatrain_nvml_pcie_counter_late_reads_total")
if late:
    print(f"PCIE_CHECK NVML counter late reads during the job: {growth(late) or 0:.0f} "
          "(each may hide a 4 GiB wrap)")
# NVML counts link-level bytes: payload plus packet headers, and its TX also
# carries the read requests of H2D copies. The daemon's link estimate
# (Note [PCIe link model], calibrated at start-up on the probe's copies)
# turns its payload counts into the same link-level bytes: the check.
model = {k: find("megatrain_pcie_link_model_ratio", f'kind="{k}"')
         for k in ("rx_per_h2d_byte", "tx_per_h2d_byte", "tx_per_d2h_byte", "rx_per_d2h_byte")}
calibrated = find("megatrain_pcie_link_model_calibrated")
print("PCIE_LINK_MODEL", "measured at start-up" if calibrated and calibrated[-1][1] == 1 else
      "defaults", {k: (v[-1][1] if v else None) for k, v in model.items()})
compare_counters("link estimate rx vs NVML rx",
                 find("megatrain_pcie_link_estimate_bytes_total", 'direction="rx"'), rx)
compare_counters("link estimate tx vs NVML tx",
                 find("megatrain_pcie_link_estimate_bytes_total", 'direction="tx"'), tx)

def compare_gauge(label, counter, nvml):
    # Reference only: the old comparison. Intervals in which the counter
    # grew, minus the first and last (partial) ones; NVML's gauge, one 20 ms
    # window, is sampled at the end of each.
    pairs = [((c1 - c0) / (t1 - t0), n1)
             for (t0, c0), (t1, c1), (_, n1) in zip(counter, counter[1:], nvml[1:]) if c1 > c0]
    pairs = pairs[1:-1]
    if len(pairs) < 3:
        print("PCIE_GAUGE", label, "no data"); return
    ours = sum(p[0] for p in pairs) / len(pairs)
    theirs = sum(p[1] for p in pairs) / len(pairs)
    print(f"PCIE_GAUGE {label} (20 ms samples, reference only): daemon {ours / 1e9:.2f} GB/s, "
          f"NVML gauge {theirs / 1e9:.2f} GB/s, ratio {ours / theirs if theirs else float('nan'):.3f} "
          f"over {len(pairs)} scrapes")
compare_gauge("h2d vs NVML rx", h2d,
              find("megatrain_nvml_pcie_throughput_bytes_per_second", 'direction="rx"'))
compare_gauge("d2h vs NVML tx", d2h,
              find("megatrain_nvml_pcie_throughput_bytes_per_second", 'direction="tx"'))
PY
