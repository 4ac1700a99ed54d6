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

With --source SRC (the HF directory the model was trained or loaded from),
it also checks that the export is a model directory people can use (Note
[Export copies] in engine/formats/hf_export.h): config.json has every key of
SRC's with the same value (the dtype aside), the tokenizer and generation
files SRC has are there byte for byte, and AutoTokenizer loads the export
and encodes and applies the chat template as it does from SRC. Without
--engine only the loads are checked.

  python3 deploy/check-hf-export.py --model DIR [--engine PREFIX] [--dtype bf16|fp32] [--source SRC]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


# The files an export copies from its source (kExportCopiedFiles).
COPIED = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
          "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
          "chat_template.json", "generation_config.json"]
SAMPLE_TEXT = "w1 w2 w3 hello world"
SAMPLE_CHAT = [{"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3"}]


def check_source(export_dir, source_dir):
    """Problems of export_dir as a copy of source_dir's files and config."""
    problems = []
    with open(os.path.join(source_dir, "config.json")) as f:
        source = json.load(f)
    with open(os.path.join(export_dir, "config.json")) as f:
        exported = json.load(f)
    for key in sorted(set(source) | set(exported)):
        if key not in ("dtype", "torch_dtype") and source.get(key, "<absent>") != exported.get(key, "<absent>"):
            problems.append(f"config.json {key}: {source.get(key, '<absent>')!r} -> "
                            f"{exported.get(key, '<absent>')!r}")
    present = [n for n in COPIED if os.path.isfile(os.path.join(source_dir, n))]
    for name in present:
        path = os.path.join(export_dir, name)
        if not os.path.isfile(path) or open(path, "rb").read() != open(os.path.join(source_dir, name), "rb").read():
            problems.append(f"{name}: not copied byte for byte")
    tokenizer = None
    if any(n in present for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        from transformers import AutoTokenizer
        theirs, ours = AutoTokenizer.from_pretrained(source_dir), AutoTokenizer.from_pretrained(export_dir)
        tokenizer = type(ours).__name__
        if theirs(SAMPLE_TEXT).input_ids != ours(SAMPLE_TEXT).input_ids:
            problems.append("tokenizer: encodes the sample text differently")
        if theirs.chat_template != ours.chat_template:
            problems.append("tokenizer: another chat template")
        elif theirs.chat_template and (theirs.apply_chat_template(SAMPLE_CHAT, tokenize=False) !=
                                       ours.apply_chat_template(SAMPLE_CHAT, tokenize=False)):
            problems.append("tokenizer: renders the sample chat differently")
    return {"copied": present, "tokenizer": tokenizer, "problems": problems}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", help="prefix written by megatrain-logits --out")
    ap.add_argument("--source", help="the HF directory the export came from")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--tolerance", type=float, default=2e-2)
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # bf16 is compared as the engine computes it and as PyTorch users train:
    # fp32 weights under bf16 autocast (fp32 residual stream), not a model
    # cast to bf16 wholesale.
    model, info = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model = model.to(device).eval()
    key_problems = {k: sorted(map(str, info.get(k, []))) for k in
                    ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    out = {"model": args.model, "model_type": model.config.model_type,
           "key_problems": key_problems, "tolerance": args.tolerance}
    ok = not key_problems
    if args.engine:
        meta = json.load(open(args.engine + ".json"))
        t, v = meta["shape"]
        ours = np.fromfile(args.engine + ".logits.f32", dtype=np.float32).reshape(t, v)
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
        out.update({"tokens": t, "vocab": v, "relative_error": diff, "argmax_agreement": agree,
                    "engine_loss": meta.get("loss"), "transformers_loss": their_loss})
        ok = ok and diff <= args.tolerance
    if args.source:
        out["source"] = check_source(args.model, args.source)
        ok = ok and not out["source"]["problems"]
    out["ok"] = ok
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
