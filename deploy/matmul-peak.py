#!/usr/bin/env python3
"""Prints the bf16 8192^3 matmul rate of the current CUDA device in TFLOP/s
(30 timed products after 5 warm-up ones): the measured peak that
deploy/gpu-8b-check.sh and deploy/gpu-8b-clip-check.sh compute MFU against
(issue 6's convention), beside the spec peak.

  python3 deploy/matmul-peak.py
"""
import time

import torch


def main():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 30
    for _ in range(n):
        a @ b
    torch.cuda.synchronize()
    print(f"{2 * 8192**3 * n / (time.perf_counter() - start) / 1e12:.1f}")


if __name__ == "__main__":
    main()
