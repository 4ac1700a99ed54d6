#!/usr/bin/env python3
"""Which SDPA kernels run, and how fast, for grouped-query causal attention
with the kv heads repeated first against enable_gqa (compat::CausalGqaAttention
in engine/runtime/torch_compat.h), forward + backward, bf16, on CUDA.

  python3 deploy/gqa-probe.py
"""
import time

import torch
import torch.nn.functional as F


def probe(b, h, kv, t, d):
    dev = "cuda"
    q = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16)

    def rep(x):
        return x[:, :, None].expand(b, kv, h // kv, t, d).reshape(b, h, t, d)

    def repeated():
        return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)

    def gqa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    out = {}
    for name, f in (("repeat", repeated), ("gqa", gqa)):
        for _ in range(3):
            f().backward(g)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            f().backward(g)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / 20 * 1e3
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            f().backward(g)
            torch.cuda.synchronize()
        kernels = sorted({e.name[:48] for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA})
        q.grad = k.grad = v.grad = None
        out[name] = f().detach()
        print(f"B{b} H{h} KV{kv} T{t} D{d} {name}: {ms:.3f} ms fwd+bwd; kernels {kernels}")
    print("  max |repeat - gqa|:", (out["repeat"] - out["gqa"]).abs().max().item())


for shape in ((8, 32, 8, 2048, 64), (8, 24, 8, 2048, 128), (1, 40, 8, 2048, 128)):
    probe(*shape)
