#!/usr/bin/env bash
# Checks of a running megatraind on a GPU, sourced by deploy/gpu-server-check.sh
# (which sets cli, metrics, state and OUT):
#   * GPU out of memory (issue #7): a llama-1b job at micro-batch 64 x 8192
#     fails with a message suggesting a smaller micro-batch; the daemon then
#     runs the next job;
#   * the daemon's PCIe byte counters against NVML's PCIe throughput counters
#     over the steady state of a llama-1b job (issue #6: within 10%).
# Prints OOM_CHECK / AFTER_OOM_JOB / PCIE_CHECK lines.

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
    | grep -E '^megatrain_(pcie_bytes_total|nvml_pcie_throughput|tokens_total|pcie_utilization)' \
    | sed "s/^/$ts /" >> "$OUT/pcie-scrapes.txt"
  now=$(cli get "$pcie_job" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  if [ "$now" = SUCCEEDED ] || [ "$now" = FAILED ]; then break; fi
  sleep 1
done
echo "pcie job: $now"
python3 - "$OUT/pcie-scrapes.txt" <<'PY'
import collections, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.rstrip("\n").split(" ")
    rows[" ".join(p[1:-1])].append((float(p[0]), float(p[-1])))
def find(name, *must):
    for k, v in rows.items():
        if k.split("{")[0] == name and all(m in k for m in must):
            return v
    return []
def compare(label, counter, nvml):
    # Steady state: intervals in which the counter grew, minus the first and
    # last (partial) ones; NVML's gauge is sampled at the end of each.
    pairs = [((c1 - c0) / (t1 - t0), n1)
             for (t0, c0), (t1, c1), (_, n1) in zip(counter, counter[1:], nvml[1:]) if c1 > c0]
    pairs = pairs[1:-1]
    if len(pairs) < 3:
        print("PCIE_CHECK", label, "no data"); return
    ours = sum(p[0] for p in pairs) / len(pairs)
    theirs = sum(p[1] for p in pairs) / len(pairs)
    print(f"PCIE_CHECK {label}: daemon {ours / 1e9:.2f} GB/s, NVML {theirs / 1e9:.2f} GB/s, "
          f"ratio {ours / theirs if theirs else float('nan'):.3f} over {len(pairs)} scrapes")
compare("h2d vs NVML rx", find("megatrain_pcie_bytes_total", 'direction="h2d"'),
        find("megatrain_nvml_pcie_throughput_bytes_per_second", 'direction="rx"'))
compare("d2h vs NVML tx", find("megatrain_pcie_bytes_total", 'direction="d2h"'),
        find("megatrain_nvml_pcie_throughput_bytes_per_second", 'direction="tx"'))
PY
