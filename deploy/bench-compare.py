#!/usr/bin/env python3
"""Prints MegaTrain's throughput beside the PyTorch baselines measured in the
same call (deploy/gpu-check.sh and deploy/gpu-speed.sh write both to one
.jsonl): tokens/s, the ratio to whole-model-in-GPU-memory PyTorch, eager and
compiled (deploy/torch_baselines.py without and with --compile; "-" where
that baseline did not run), GPU idle and exposed optimizer as shares of the
step, MFU.

  python3 deploy/bench-compare.py OUT/bench.jsonl [--markdown]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    ours, torch = [], {}
    for line in open(args.jsonl):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if "mode" in j:
            key = (j["mode"], j["preset"], j["micro_batch"], j["seq"], bool(j.get("clip")))
            torch[key + (bool(j.get("compiled")),)] = j
        elif "tokens_per_s" in j and "model" in j:
            ours.append(j)
    cols = ["model", "micro-batch x seq", "accum", "clip", "schedule", "H2D GB/step", "MegaTrain tokens/s", "model TFLOP/s",
            "eager tokens/s", "ratio vs eager", "compiled tokens/s", "ratio vs compiled", "step s", "compute s", "GPU idle %", "optimizer exposed %", "H2D GB/s busy",
            "peak GPU GB", "MFU %"]
    rows = []
    for o in ours:
        # Same micro-batch and clipping; a small-micro-batch run (gradient
        # accumulation) is compared with resident PyTorch at micro-batch 8.
        clip = bool(o.get("max_grad_norm", 0))

        def baseline(compiled):
            return torch.get(("resident", o["model"], o["micro_batch"], o["seq_len"], clip, compiled)) or \
                torch.get(("resident", o["model"], 8, o["seq_len"], clip, compiled))

        def versus(base):
            if not base:
                return ["-", "-"]
            return [f'{base["tokens_per_s"]:,.0f}', f'{o["tokens_per_s"] / base["tokens_per_s"]:.2f}']

        step = o["step_seconds"]
        rows.append([
            o["model"], f'{o["micro_batch"]} x {o["seq_len"]}', f'{o.get("gradient_accumulation_steps", 1)}',
            f'{o.get("max_grad_norm", 0):g}',
            # Issue 16: the order of work the run used (and its wave).
            (o["schedule"] + (f' w{o["wave"]}' if o["schedule"] == "layer-major" else "")
             + (" host-act" if o.get("activations") == "host" else "")) if "schedule" in o else "-",
            f'{o.get("h2d_bytes", 0) / 1e9:.1f}',
            f'{o["tokens_per_s"]:,.0f}',
            f'{o["model_tflops"]:.0f}', *versus(baseline(False)), *versus(baseline(True)),
            f'{step:.3f}', f'{o["compute_seconds"]:.3f}',
            f'{100 * o["gpu_idle_seconds"] / step:.1f}',
            f'{100 * o["optimizer_exposed_seconds"] / step:.1f}',
            f'{o.get("h2d_gb_per_s_busy", 0):.1f}', f'{o["peak_gpu_bytes"] / 1e9:.1f}',
            # megatrain-bench's mfu: on active parameters for a MoE model.
            (f'{100 * o["mfu"]:.1f}' + (" (active)" if o.get("mfu_params") == "active" else ""))
            if "mfu" in o else "-"])
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


if __name__ == "__main__":
    main()
