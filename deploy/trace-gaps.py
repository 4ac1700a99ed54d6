#!/usr/bin/env python3
"""Where the compute stream waits between kernels, from a Chrome trace of
megatrain-bench --kernel_trace (or deploy/torch-trace.py): the gaps between
consecutive kernels of the busiest stream, by size, and what the thread
that launched the kernel after each gap was doing in the CUDA runtime
meanwhile (a blocking call such as cudaStreamSynchronize or a pageable
cudaMemcpyAsync, a launch, or none: host code). Also lists the copies to
pageable host memory (each blocks its calling thread) with the ATen op
that issued them.

  python3 deploy/trace-gaps.py trace.json[.gz] [--min_gap_us 2] [--top 15]
"""
import argparse
import bisect
import collections
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def complete(events, cats):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats]


def busiest_stream(kernels):
    busy = collections.Counter()
    for k in kernels:
        busy[k.get("args", {}).get("stream", k.get("tid"))] += float(k.get("dur", 0))
    return busy.most_common(1)[0][0]


def enclosing(spans, starts, t):
    """The innermost span of `spans` (sorted by start) that contains t."""
    best = None
    i = bisect.bisect_right(starts, t)
    for e in reversed(spans[max(0, i - 64):i]):
        if e["ts"] <= t <= e["ts"] + e.get("dur", 0):
            if best is None or e.get("dur", 0) < best.get("dur", 0):
                best = e
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min_gap_us", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    events = load(args.trace)
    kernels = complete(events, {"kernel"})
    runtime = complete(events, {"cuda_runtime", "cuda_driver"})
    cpu_ops = sorted(complete(events, {"cpu_op"}), key=lambda e: e["ts"])
    by_corr = {e.get("args", {}).get("correlation"): e for e in runtime}
    stream = busiest_stream(kernels)
    ks = sorted((k for k in kernels if k.get("args", {}).get("stream", k.get("tid")) == stream),
                key=lambda k: k["ts"])
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    busy = sum(k["dur"] for k in ks)
    rt_by_tid = collections.defaultdict(list)
    for e in runtime:
        rt_by_tid[e["tid"]].append(e)
    for v in rt_by_tid.values():
        v.sort(key=lambda e: e["ts"])
    rt_starts = {t: [e["ts"] for e in v] for t, v in rt_by_tid.items()}
    sizes = collections.Counter()
    cause = collections.Counter()
    total_gap = 0.0
    for prev, k in zip(ks, ks[1:]):
        gap = k["ts"] - (prev["ts"] + prev["dur"])
        if gap < args.min_gap_us:
            continue
        total_gap += gap
        bucket = next(b for b in (5, 10, 20, 50, 100, 1000, 1e12) if gap < b)
        sizes[bucket] += gap
        launch = by_corr.get(k.get("args", {}).get("correlation"))
        if launch is None:
            cause["(launch not in trace)"] += gap
            continue
        # The runtime call of the launching thread in progress in the gap's
        # middle, or none.
        tid = launch["tid"]
        mid = prev["ts"] + prev["dur"] + gap / 2
        call = enclosing(rt_by_tid[tid], rt_starts[tid], mid)
        cause[call["name"] if call else "(host code, no CUDA call)"] += gap
    print(f"stream {stream}: {len(ks)} kernels over {span / 1e3:.1f} ms, busy {busy / 1e3:.1f} ms, "
          f"gaps >= {args.min_gap_us} us: {total_gap / 1e3:.1f} ms ({100 * total_gap / span:.1f}%)")
    print("gap time by gap size (us): " + ", ".join(
        f"<{int(b) if b < 1e12 else 'inf'}: {v / 1e3:.1f} ms" for b, v in sorted(sizes.items())))
    print("gap time by the launching thread's CUDA call in the gap:")
    for name, v in cause.most_common(args.top):
        print(f"  {v / 1e3:9.2f} ms  {name}")
    pageable = [e for e in complete(events, {"gpu_memcpy"}) if "Pageable" in e["name"]]
    issuers = collections.Counter()
    op_starts = [c["ts"] for c in cpu_ops]
    for e in pageable:
        call = by_corr.get(e.get("args", {}).get("correlation"))
        op = enclosing(cpu_ops, op_starts, call["ts"]) if call else None
        issuers[(e["name"], op["name"] if op else "(no ATen op)",
                 e.get("args", {}).get("bytes", -1))] += 1
    print(f"copies to/from pageable memory: {len(pageable)}, "
          f"{sum(e['dur'] for e in pageable) / 1e3:.1f} ms")
    for (name, op, nbytes), n in issuers.most_common(args.top):
        print(f"  {n:6d} x {name} of {nbytes} bytes from {op}")


if __name__ == "__main__":
    main()
