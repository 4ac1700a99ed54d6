#!/usr/bin/env bash
# Integration: every query of the Grafana dashboard
# (deploy/grafana/dashboards/megatrain.json) against a real Prometheus that
# scrapes the real megatraind with deploy/prometheus.yml and its recording
# rules, while the daemon trains the tiny model and has a second job queued.
#
# Checks, without Grafana (not packaged in Debian):
#   - structure: unique panel ids, gridPos inside 24 columns and no two
#     panels overlapping, every panel on the ${DS_PROMETHEUS} data source
#     with targets (rows excepted: they hold no query), unique refIds,
#     template variables defined, the provisioning files agreeing with the
#     dashboard's data source uid;
#   - names: every megatrain_ metric is registered in server/core/metrics.cc and
#     every megatrain: series recorded in deploy/prometheus-rules.yml;
#   - live: the template variables resolve to this daemon; every target expr,
#     with $job, $instance, $__rate_interval, $__interval and $__range
#     substituted as Grafana would, parses (status success) and returns at
#     least one series -- except the metrics a CPU daemon cannot have (listed
#     below with the reason), which must parse; a few panels also show the
#     values a training daemon must have (loss > 0, one job running and one
#     queued, ...).
source "$(dirname "$0")/lib.sh"

for tool in prometheus promtool python3 curl; do
  command -v "$tool" >/dev/null || fail "$tool is required (deploy/install-deps.sh)"
done
DASHBOARD="$SOURCE_DIR/deploy/grafana/dashboards/megatrain.json"
[[ -f "$DASHBOARD" ]] || fail "missing $DASHBOARD"

# The checker (python3 standard library only): `static` needs no server,
# `live PROMETHEUS_URL` queries Prometheus.
cat >"$WORK/check_dashboard.py" <<'PY'
import json
import re
import sys
import time
import urllib.parse
import urllib.request

mode, dashboard_path, source_dir = sys.argv[1:4]

NVML_CPU = "NVML is sampled for CUDA devices only; this daemon runs --device=cpu"
# Metrics that stay empty on a CPU-only daemon. Their exprs must parse; an
# empty result is expected and is not a failure. Nothing here is faked.
PARSE_ONLY_ON_CPU = {
    "megatrain_pcie_link_bandwidth_bytes_per_second":
        "link bandwidth is measured at start-up for CUDA devices only (server/rpc/daemon.cc)",
    "megatrain_pcie_utilization_ratio":
        "needs the measured link bandwidth, which only CUDA devices have",
    "megatrain_nvml_pcie_bytes_total": NVML_CPU,
    "megatrain_nvml_pcie_throughput_bytes_per_second": NVML_CPU,
    "megatrain_gpu_memory_used_bytes": NVML_CPU,
    "megatrain_gpu_memory_total_bytes": NVML_CPU,
    "megatrain_gpu_memory_peak_bytes":
        "the CPU runtime reports no device peak (set only when > 0)",
    "megatrain_mfu_ratio": "not applicable on the CPU: no series (server/core/metrics.h)",
    "megatrain_pcie_bytes_total": "not applicable on the CPU: no series (server/core/metrics.h)",
    "megatrain_pcie_bandwidth_bytes_per_second":
        "not applicable on the CPU: no series (server/core/metrics.h)",
    "megatrain:pcie_h2d_bytes_per_second:rate5m":
        "recorded from megatrain_pcie_bytes_total (deploy/prometheus-rules.yml), which the CPU lacks",
}
# Grafana's built-in variables, substituted in the live check. The values
# mirror Grafana's rules for this test's Prometheus (scrape interval 1 s):
# $__rate_interval = max($__interval + scrape, 4 x scrape) = 4 s, raised to
# 15 s so that a loaded 2-core machine with late scrapes still has the two
# samples rate() needs; $__range is longer than the whole test.
BUILTINS = {"__rate_interval": "15s", "__interval": "2s", "__range": "10m"}
# Metrics from outside megatraind that the dashboard may use.
FOREIGN_METRICS = {"up"}
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def finish():
    if failures:
        for message in failures:
            print("FAIL:", message, file=sys.stderr)
        sys.exit(1)


with open(dashboard_path) as f:
    dashboard = json.load(f)


def all_panels():
    for panel in dashboard.get("panels", []):
        yield panel
        for inner in panel.get("panels", []):  # collapsed rows keep theirs inside
            yield inner


def targets():
    for panel in all_panels():
        for target in panel.get("targets", []):
            yield panel, target


variables = dashboard.get("templating", {}).get("list", [])
variable_names = {v.get("name") for v in variables}


def static():
    check(isinstance(dashboard.get("schemaVersion"), int) and dashboard["schemaVersion"] >= 36,
          f"schemaVersion: {dashboard.get('schemaVersion')}")
    check(dashboard.get("uid") == "megatrain", f"uid: {dashboard.get('uid')}")
    ds_vars = [v for v in variables if v.get("name") == "DS_PROMETHEUS"]
    check(len(ds_vars) == 1 and ds_vars[0].get("type") == "datasource"
          and ds_vars[0].get("query") == "prometheus", "no datasource variable DS_PROMETHEUS")
    for v in variables:
        if v.get("type") != "query":
            continue
        check(v.get("datasource") == DS, f"variable {v['name']}: datasource {v.get('datasource')}")
        check(re.fullmatch(r"label_values\(megatrain_\w+(\{.*\})?, *\w+\)", v.get("definition", ""))
              is not None, f"variable {v['name']}: not label_values over a megatrain_ metric")
    check({"job", "instance"} <= variable_names, f"variables: {sorted(variable_names)}")

    ids, boxes, count = set(), [], 0
    for panel in all_panels():
        count += 1
        pid, title = panel.get("id"), panel.get("title", "?")
        check(isinstance(pid, int) and pid not in ids, f"panel '{title}': id {pid} missing or repeated")
        ids.add(pid)
        grid = panel.get("gridPos", {})
        if not check(all(isinstance(grid.get(k), int) for k in "hwxy"),
                     f"panel '{title}': gridPos {grid}"):
            continue
        check(grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24,
              f"panel '{title}': gridPos {grid} outside 24 columns")
        for other_title, o in boxes:
            overlap = (grid["x"] < o["x"] + o["w"] and o["x"] < grid["x"] + grid["w"]
                       and grid["y"] < o["y"] + o["h"] and o["y"] < grid["y"] + grid["h"])
            check(not overlap, f"panel '{title}' {grid} overlaps '{other_title}' {o}")
        boxes.append((title, grid))
        if panel.get("type") == "row":
            check("targets" not in panel, f"row '{title}' has targets")
            continue
        check(panel.get("type") in ("timeseries", "stat"), f"panel '{title}': type {panel.get('type')}")
        check(panel.get("datasource") == DS, f"panel '{title}': datasource {panel.get('datasource')}")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        check(len(refs) >= 1, f"panel '{title}': no targets")
        check(len(set(refs)) == len(refs) and None not in refs, f"panel '{title}': refIds {refs}")
        for t in panel.get("targets", []):
            check(t.get("datasource", DS) == DS, f"panel '{title}' {t.get('refId')}: datasource")
            check(isinstance(t.get("expr"), str) and t["expr"].strip(),
                  f"panel '{title}' {t.get('refId')}: no expr")
    check(count >= 10, f"only {count} panels")

    # Every variable used is defined or a Grafana built-in.
    for panel, t in targets():
        for name in re.findall(r"\$\{?(\w+)", t.get("expr", "")):
            check(name in variable_names or name in BUILTINS,
                  f"panel '{panel.get('title')}' {t.get('refId')}: unknown variable ${name}")

    # Metric names: registered by the daemon or recorded by the rules.
    with open(f"{source_dir}/server/core/metrics.cc") as f:
        # Families are registered through helpers (CounterFamily(r, "name", ...))
        # or prometheus-cpp's builders (.Name("name")): every quoted
        # megatrain_ identifier in the file.
        exported = set(re.findall(r'"(megatrain_\w+)"', f.read()))
    with open(f"{source_dir}/deploy/prometheus-rules.yml") as f:
        recorded = set(re.findall(r"record:\s*(megatrain:[\w:]+)", f.read()))
    check(len(exported) >= 20 and len(recorded) >= 3,
          f"could not read metric names: {len(exported)} exported, {len(recorded)} recorded")
    used = set()
    for panel, t in targets():
        expr = t.get("expr", "")
        # Drop label matchers and strings, then collect identifiers that name series.
        bare = re.sub(r'"[^"]*"', '""', expr)
        for name in re.findall(r"\b(megatrain[_:][\w:]*)", bare):
            used.add(name)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            check(name in exported or name in recorded or base in exported,
                  f"panel '{panel.get('title')}': {name} is neither exported (server/core/metrics.cc) "
                  f"nor recorded (deploy/prometheus-rules.yml)")
        for name in re.findall(r"\b([a-z_]+)\{", bare):
            check(name.startswith("megatrain") or name in FOREIGN_METRICS,
                  f"panel '{panel.get('title')}': foreign metric {name}")
    for name in PARSE_ONLY_ON_CPU:
        check(name in exported or name in recorded,
              f"parse-only list names {name}, which the daemon does not export or record")
    check(recorded <= used, f"recording rules unused by the dashboard: {sorted(recorded - used)}")

    # Provisioning files: the dashboard's default data source is the
    # provisioned one; the provider reads a folder.
    with open(f"{source_dir}/deploy/grafana/provisioning/datasources/prometheus.yaml") as f:
        ds_yaml = f.read()
    uid = re.search(r"^\s+uid:\s*(\S+)", ds_yaml, re.M)
    check(uid is not None and ds_vars and uid.group(1) == ds_vars[0]["current"]["value"],
          "datasource provisioning uid differs from the dashboard's DS_PROMETHEUS default")
    check(re.search(r"^\s+type:\s*prometheus\s*$", ds_yaml, re.M) is not None, "datasource type")
    check(re.search(r"^\s+url:\s*http://localhost:9090\s*$", ds_yaml, re.M) is not None, "datasource url")
    with open(f"{source_dir}/deploy/grafana/provisioning/dashboards/megatrain.yaml") as f:
        provider = f.read()
    check(re.search(r"^\s+type:\s*file\s*$", provider, re.M) is not None, "provider type file")
    check(re.search(r"^\s+path:\s*/\S+", provider, re.M) is not None, "provider path")
    finish()
    print(f"static: {count} panels, {sum(1 for _ in targets())} targets, "
          f"{len(used)} series names, structure ok")


# ------------------------------------------------------------------ live
def get(url, path, **params):
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{url}{path}?{query}", timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:  # 400/422: bad query, with a JSON body
        return json.load(e)


def instant(url, expr, at):
    return get(url, "/api/v1/query", query=expr, time=f"{at:.3f}")


def regex_value(values):
    # Grafana's Prometheus data source formats a multi-value variable used
    # in =~ as the regex-escaped value, or (a|b) for several
    # (prometheusSpecialRegexEscape: the backslash is doubled inside the
    # PromQL string).
    escaped = [re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", v.replace("\\", "\\\\\\\\"))
               for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr, values):
    def one(match):
        name = match.group(1) or match.group(2)
        return values[name] if name in values else match.group(0)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def wait_for_training(url):
    # One evaluation time T at which Prometheus has scraped a daemon mid-job:
    # one job running and one queued, an eval and a checkpoint done, the
    # tokens/s recording rule evaluated. Prometheus offers no notification,
    # so this polls: at most 240 tries 0.5 s apart.
    gate = [
        'megatrain_jobs{state="running"} == 1',
        "megatrain_queue_depth == 1",
        "megatrain_eval_loss > 0",
        "megatrain_checkpoint_duration_seconds_count > 0",
        'megatrain_host_store_bytes{kind="master"} > 0',
        "megatrain:tokens_per_second:rate1m > 0",
    ]
    missing = gate
    for _ in range(240):
        at = time.time()
        missing = [q for q in gate if not instant(url, q, at).get("data", {}).get("result")]
        if not missing:
            return at
        time.sleep(0.5)
    print(f"FAIL: prometheus never showed a training daemon; missing: {missing}", file=sys.stderr)
    sys.exit(1)


# Panels whose values a training daemon must show (not just "non-empty"):
# (title, refId, predicate over [(labels, value)], what it means).
VALUE_CHECKS = [
    ("Tokens/s", "A", lambda r: all(v > 0 for _, v in r), "1 min average > 0"),
    ("Tokens/s", "B", lambda r: any(v > 0 for _, v in r), "latest step > 0"),
    ("Training and eval loss", "A", lambda r: all(v > 0 for _, v in r), "training loss > 0"),
    ("Training and eval loss", "B", lambda r: all(v > 0 for _, v in r), "eval loss > 0"),
    ("Jobs by state", "A",
     lambda r: {l["state"]: v for l, v in r}.get("running") == 1
     and {l["state"]: v for l, v in r}.get("queued") == 1, "running 1, queued 1"),
    ("Queue depth", "A", lambda r: [v for _, v in r] == [1], "1 queued"),
    ("Host model store by kind vs budget", "A",
     lambda r: all(v > 0 for l, v in r if l["kind"] in ("master", "grad", "exp_avg", "exp_avg_sq")),
     "fp32 master, grad, AdamW moments > 0"),
    ("Host model store by kind vs budget", "B", lambda r: all(v > 0 for _, v in r), "budget > 0"),
    ("Step time by phase", "A",
     lambda r: {l["phase"] for l, _ in r} >= {"h2d", "compute", "d2h", "optimizer", "gpu_idle"},
     "h2d, compute, d2h, optimizer, gpu_idle present"),
    ("Checkpoint duration", "A", lambda r: all(v > 0 for _, v in r), "mean > 0"),
    ("RPC errors by method and code", "A",
     lambda r: any(l.get("method") == "GetJob" and l.get("code") == "NOT_FOUND" for l, _ in r),
     "the test's GetJob NOT_FOUND"),
    ("Daemons up", "A", lambda r: [v for _, v in r] == [1], "1 target up"),
]


def series_name(labels):
    keys = ("device", "direction", "state", "kind", "phase", "method", "code")
    return "/".join(labels[k] for k in keys if k in labels) or "value"


def live(url):
    at = wait_for_training(url)
    values = dict(BUILTINS)
    for v in variables:  # in order: later variables use earlier ones
        if v.get("type") != "query":
            continue
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", v["definition"])
        selector = substitute(m.group(1), values)
        series = get(url, "/api/v1/series", **{"match[]": selector, "start": f"{at - 600:.3f}",
                                               "end": f"{at:.3f}"})
        found = sorted({s[m.group(2)] for s in series.get("data", []) if m.group(2) in s})
        if not check(series.get("status") == "success" and found,
                     f"variable {v['name']}: {v['definition']} -> {series}"):
            finish()
        values[v["name"]] = regex_value(found)
        print(f"variable ${v['name']} = {found}")

    rows = []
    results = {}
    for panel, t in targets():
        title, ref = panel.get("title"), t.get("refId")
        expr = substitute(t["expr"], values)
        check("$" not in expr, f"'{title}' {ref}: unsubstituted variable in {expr}")
        answer = instant(url, expr, at)
        ok = answer.get("status") == "success"
        result = answer.get("data", {}).get("result", []) if ok else []
        results[(title, ref)] = [(s["metric"], float(s["value"][1])) for s in result]
        reasons = [r for name, r in PARSE_ONLY_ON_CPU.items() if name in t["expr"]]
        if not ok:
            note = f"ERROR {answer.get('errorType')}: {answer.get('error')}"
            check(False, f"'{title}' {ref}: {note}\n  {expr}")
        elif reasons:
            note = "parse-only on CPU: " + reasons[0]
        else:
            note = "ok" if result else "EMPTY"
            check(bool(result), f"'{title}' {ref}: no series\n  {expr}")
        rows.append((len(result) if ok else "-", title, ref, note, t["expr"]))

    print(f"\n{'series':>6}  {'panel / refId':<45} {'check':<10} expr")
    for count, title, ref, note, expr in rows:
        print(f"{count!s:>6}  {title + ' / ' + ref:<45} {note.split(':')[0]:<10} {expr}")
    print("\nparse-only on CPU (must parse; empty without a GPU):")
    for name, reason in PARSE_ONLY_ON_CPU.items():
        print(f"  {name}: {reason}")

    print("\nvalues:")
    for title, ref, predicate, meaning in VALUE_CHECKS:
        result = results.get((title, ref))
        good = result is not None and len(result) > 0 and predicate(result)
        check(good, f"'{title}' {ref}: expected {meaning}, got {result}")
        shown = ", ".join(f"{series_name(labels)}={value:.4g}" for labels, value in result or [])
        print(f"  {'ok  ' if good else 'FAIL'} {title} / {ref}: {meaning}: {shown}")
    finish()
    print(f"\nlive: {len(rows)} exprs parse; "
          f"{sum(1 for r in rows if r[3] == 'ok')} return series, "
          f"{sum(1 for r in rows if r[3].startswith('parse-only'))} parse-only on CPU")


if mode == "static":
    static()
elif mode == "live":
    live(sys.argv[4])
else:
    sys.exit(f"unknown mode {mode}")
PY

log "static checks of $DASHBOARD"
python3 "$WORK/check_dashboard.py" static "$DASHBOARD" "$SOURCE_DIR" || fail "dashboard structure"

start_daemon "$WORK/state"

# Prometheus with deploy/'s scrape config and rules: target rewritten, the
# scrape and rule intervals shortened to 1 s for the test.
start_prometheus -e 's/evaluation_interval: [0-9]*s/evaluation_interval: 1s/'

# Jobs start only after Prometheus' first scrape, so every counter's rate
# starts from a scraped 0. Polls (no notification): at most 120 tries 0.5 s
# apart.
up=""
for attempt in $(seq 1 120); do
  up=$(curl -sf --get "http://127.0.0.1:$PROM_PORT/api/v1/query" \
         --data-urlencode 'query=up{job="megatraind"} == 1' | jq -r '.data.result[0].value[1] // empty' || true)
  if [[ -n "$up" ]]; then break; fi
  sleep 0.5
done
[[ -n "$up" ]] || fail "prometheus never scraped megatraind; log: $(tail -n 20 "$WORK/prometheus.log")"

# The tiny job, long enough to stay RUNNING through the checks (it is
# cancelled after them), evaluating and checkpointing every 10 steps; a
# second copy waits in the queue (one job per device).
job_file="$WORK/grafana.yaml"
sed -e "s#data/tiny#$TINY_DATA#" -e 's/max_steps: [0-9]*/max_steps: 100000/' \
    -e 's/every_steps: [0-9]*/every_steps: 10/' "$TINY_JOB" >"$job_file"
running=$(cli --json submit "$job_file" | jq -r .id)
queued=$(cli --json submit "$job_file" | jq -r .id)
log "submitted $running and $queued"
# An RPC that fails, for the errors panel.
expect_cli_error NOT_FOUND "job-999999" get job-999999

log "live checks against prometheus on 127.0.0.1:$PROM_PORT"
python3 "$WORK/check_dashboard.py" live "$DASHBOARD" "$SOURCE_DIR" "http://127.0.0.1:$PROM_PORT" ||
  fail "dashboard queries; prometheus log: $(tail -n 5 "$WORK/prometheus.log")"

cli cancel "$queued" >/dev/null
cli cancel "$running" >/dev/null
wait_for_event "$running" '.kind == "state" and .state == "CANCELLED"' 120 || fail "$running not CANCELLED"
stop_daemon TERM || fail "megatraind exited $? on SIGTERM"
log "PASS"
