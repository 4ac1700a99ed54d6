#!/usr/bin/env python3
"""Sums the GPU kernels of Chrome traces (megatrain-bench --kernel_trace,
deploy/torch-trace.py) by kind, side by side, in milliseconds per step and
per 16,384 tokens, to show where one step's device time goes.

  python3 deploy/kernel-summary.py NAME=trace.json:TOKENS [NAME=trace.json:TOKENS ...]

TOKENS: tokens in the traced step (micro-batch x seq_len x accumulation).
--top N also lists each trace's N longest kernels by total time.
--by_op N lists, per trace, the N largest (kernel, ATen op) pairs: each
kernel is charged to the innermost CPU op around its launch and the
outermost one (the autograd node in backward) on the launching thread.
"""
import argparse
import bisect
import collections
import gzip
import json
import re

# First match wins; the patterns are substrings of CUDA kernel names.
KINDS = [
    ("gemm", r"gemm|sm90_xmma|cutlass|cublas|Kernel2|nvjet|splitK"),
    ("attention", r"flash|fmha|attention|sdpa|efficient"),
    ("adamw", r"adam|Adam"),
    ("norm/reduce", r"reduce|norm|Norm|sum|welford"),
    ("softmax/loss", r"softmax|Softmax|nll|cross_entropy|log_softmax|logsumexp"),
    ("copy/cast", r"copy|Copy|cast|to_copy|direct_copy"),
    ("elementwise", r"elementwise|vectorized|unrolled|Functor|pointwise|mul|add|silu|rsqrt"),
    ("memset", r"memset|Memset|fill"),
]


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def summarise(events):
    by_kind = collections.Counter()
    by_name = collections.Counter()
    copies = collections.Counter()
    count = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        dur = float(e.get("dur", 0)) / 1000.0  # us -> ms
        if cat == "kernel":
            by_kind[kind_of(e["name"])] += dur
            by_name[e["name"][:90]] += dur
            count += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies[e["name"][:40]] += dur
    return by_kind, by_name, copies, count


def by_op(events):
    """Kernel time by (kernel name, innermost CPU op, outermost CPU op)."""
    launches = {e.get("args", {}).get("correlation"): e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    ops = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops[e["tid"]].append(e)
    for v in ops.values():
        v.sort(key=lambda e: e["ts"])
    starts = {t: [e["ts"] for e in v] for t, v in ops.items()}
    out = collections.Counter()
    for k in events:
        if k.get("ph") != "X" or k.get("cat") != "kernel":
            continue
        launch = launches.get(k.get("args", {}).get("correlation"))
        inner = outer = "(no op)"
        if launch is not None and launch["tid"] in ops:
            spans, t = ops[launch["tid"]], launch["ts"]
            i = bisect.bisect_right(starts[launch["tid"]], t)
            around = [e for e in spans[max(0, i - 200):i] if e["ts"] + e.get("dur", 0) >= t]
            if around:
                inner = min(around, key=lambda e: e.get("dur", 0))["name"]
                outer = max(around, key=lambda e: e.get("dur", 0))["name"]
        out[(k["name"][:60], inner, outer[:50])] += float(k.get("dur", 0)) / 1000.0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--by_op", type=int, default=0)
    args = ap.parse_args()
    runs = []
    for spec in args.traces:
        name, rest = spec.split("=", 1)
        path, tokens = rest.rsplit(":", 1)
        runs.append((name, int(tokens)) + summarise(load(path)))
    kinds = [k for k, _ in KINDS] + ["other"]
    header = "| kind | " + " | ".join(f"{r[0]} ms (per 16k tok)" for r in runs) + " |"
    print(header)
    print("|" + "---|" * (len(runs) + 1))
    for k in kinds + ["TOTAL kernels"]:
        cells = []
        for name, tokens, by_kind, _, _, _ in runs:
            v = sum(by_kind.values()) if k == "TOTAL kernels" else by_kind.get(k, 0.0)
            cells.append(f"{v:.1f} ({v * 16384 / tokens:.1f})")
        print(f"| {k} | " + " | ".join(cells) + " |")
    for name, tokens, _, by_name, copies, count in runs:
        print(f"\n{name}: {count} kernels; copies: "
              + ", ".join(f"{n} {v:.1f} ms" for n, v in copies.most_common(4)))
        for n, v in by_name.most_common(args.top):
            print(f"  {v:9.2f} ms  {n}")
    if args.by_op:
        for spec in args.traces:
            name, rest = spec.split("=", 1)
            print(f"\n{name}: kernel time by (kernel, innermost op, outermost op)")
            for (kernel, inner, outer), v in by_op(load(rest.rsplit(":", 1)[0])).most_common(
                    args.by_op):
                print(f"  {v:9.2f} ms  {kernel} | {inner} | {outer}")


if __name__ == "__main__":
    main()
