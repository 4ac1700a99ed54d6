#!/usr/bin/env python3
"""A torch.profiler (Kineto) trace of one training step of the resident PyTorch
baseline, the same workload as deploy/torch_baselines.py --mode resident
(transformers Llama, bf16 autocast over fp32 master weights, fused AdamW,
activation checkpointing with --ckpt, clipping at 1.0 with --clip, each
decoder layer torch.compile'd with --compile).
deploy/kernel-summary.py sums its kernels beside megatrain-bench's
--kernel_trace of the same configuration.

  python3 deploy/torch-trace.py --preset llama-1b --micro-batch 8 --clip --ckpt --out t.json
"""
import argparse
import importlib.util
import json
import pathlib
import statistics
import time

import torch


def load_baseline():
    path = pathlib.Path(__file__).resolve().parent / "torch_baselines.py"
    spec = importlib.util.spec_from_file_location("torch_baselines", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step(model, opt, x, clip, accum):
    for _ in range(accum):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--clip", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="layer.compile() each decoder layer (compiled in the warm-up steps)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-steps", type=int, default=0,
                    help="also time this many untraced steps and print their median as JSON")
    args = ap.parse_args()
    base = load_baseline()
    torch.manual_seed(0)
    cfg, model = base.build(args.preset, args.seq, args.ckpt, args.compile)
    model.to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    x = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq), device="cuda")
    for _ in range(max(args.warmup, 3) if args.compile else args.warmup):
        step(model, opt, x, args.clip, args.accum)
    torch.cuda.synchronize()
    if args.time_steps > 0:  # untraced steps, timed (median), before the traced one
        times = []
        for _ in range(args.time_steps):
            t = time.perf_counter()
            step(model, opt, x, args.clip, args.accum)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        median = statistics.median(times)
        tokens = args.micro_batch * args.seq * args.accum
        print(json.dumps({"preset": args.preset, "micro_batch": args.micro_batch,
                          "accum": args.accum, "clip": args.clip, "step_s_median": median,
                          "tokens_per_s": tokens / median}), flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        step(model, opt, x, args.clip, args.accum)
        torch.cuda.synchronize()
    prof.export_chrome_trace(args.out)


if __name__ == "__main__":
    main()
