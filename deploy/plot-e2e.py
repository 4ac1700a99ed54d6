#!/usr/bin/env python3
"""Plots the loss curve of an end-to-end run (deploy/e2e-gpu.sh) from the
events that `megatrain watch JOB --json` printed: training loss per step,
held-out eval loss, and tokens/s.

  python3 deploy/plot-e2e.py EVENTS.jsonl OUT.png [--title TEXT] [--initial-eval LOSS]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("events")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--initial-eval", type=float, default=None,
                    help="held-out loss of the initial model (plotted at step 0)")
    args = ap.parse_args()
    events = [json.loads(line) for line in open(args.events) if line.strip()]
    steps = [e for e in events if e.get("kind") == "step" and not e.get("skipped")]
    evals = [e for e in events if e.get("kind") == "eval"]
    ckpts = [e for e in events if e.get("kind") == "checkpoint"]

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([e["step"] for e in steps], [e["loss"] for e in steps], lw=1, label="training loss")
    ex = [e["step"] for e in evals]
    ey = [e["eval_loss"] for e in evals]
    if args.initial_eval is not None:
        ex, ey = [0] + ex, [args.initial_eval] + ey
    ax.plot(ex, ey, "o-", label="held-out eval loss")
    for c in ckpts:
        ax.axvline(c["step"], color="grey", ls=":", lw=0.8)
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(args.title)
    ax2.plot([e["step"] for e in steps], [e["tokens_per_s"] / 1e3 for e in steps], lw=1)
    ax2.set_ylabel("k tokens/s")
    ax2.set_xlabel("optimizer step (dotted: checkpoints)")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
