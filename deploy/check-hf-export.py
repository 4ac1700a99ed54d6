#!/usr/bin/env python3
"""Checks an exported HF model directory against the engine.

Loads DIR with transformers' AutoModelForCausalLM, runs the token window that
megatrain-logits scored (PREFIX.json) and compares the logits with the
engine's (PREFIX.logits.f32, fp32 [T, V]). Prints one JSON line and exits 1
when the norm-relative difference exceeds --tolerance (default 2e-2, the
project's bf16 tolerance; an fp32 export scored in fp32 on both sides agrees
to ~1e-5). The load must report no missing, unexpected or mismatched keys
(transformers' output_loading_info); attention is eager, the reference
arithmetic (soft-capped Gemma 2 needs it).

  python3 deploy/check-hf-export.py --model DIR --engine PREFIX [--dtype bf16|fp32]
"""
import argparse
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", required=True, help="prefix written by megatrain-logits --out")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--tolerance", type=float, default=2e-2)
    args = ap.parse_args()

    meta = json.load(open(args.engine + ".json"))
    t, v = meta["shape"]
    ours = np.fromfile(args.engine + ".logits.f32", dtype=np.float32).reshape(t, v)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # bf16 is compared as the engine computes it and as PyTorch users train:
    # fp32 weights under bf16 autocast (fp32 residual stream), not a model
    # cast to bf16 wholesale.
    model, info = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model = model.to(device).eval()
    key_problems = {k: sorted(map(str, info.get(k, []))) for k in
                    ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    ids = torch.tensor([meta["input_ids"]], device=device)
    with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16,
                                         enabled=args.dtype == "bf16"):
        theirs = model(input_ids=ids).logits[0].float().cpu().numpy()
    diff = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))
    agree = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    # Next-token cross-entropy of transformers' logits on the same window.
    logp = torch.log_softmax(torch.from_numpy(theirs[:-1]).double(), dim=-1)
    targets = torch.tensor(meta["input_ids"][1:])
    their_loss = float(-logp[torch.arange(t - 1), targets].mean())
    out = {"model": args.model, "tokens": t, "vocab": v, "relative_error": diff,
           "argmax_agreement": agree, "engine_loss": meta.get("loss"),
           "transformers_loss": their_loss,
           "model_type": model.config.model_type, "key_problems": key_problems,
           "tolerance": args.tolerance, "ok": diff <= args.tolerance and not key_problems}
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
