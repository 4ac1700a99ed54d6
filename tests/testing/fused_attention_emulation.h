// An attention whose bf16 rounding points are those of the fused SDPA
// kernels of torch 2.x (FlashAttention-2, Dao 2023, Algorithms 1 and 2, as
// implemented by ATen's CPU flash kernel, FlashAttentionKernel.cpp, and the
// CUDA flash / memory-efficient kernels), so that CI on LibTorch 1.13, whose
// SDPA is a plain math path, can test how the engine's bf16 numerics compare
// with the reference when the GPU build runs a fused kernel.
//
// Rounding points (everything else is fp32 accumulation of bf16 products):
//   forward:  S = q k^T * scale (fp32), E = exp(S - rowmax) (fp32),
//             O = ((bf16(E) v) / rowsum(E)) rounded to bf16, lse kept in fp32;
//   backward: P = exp(S - lse) (fp32), dV = bf16(P)^T dO,
//             dP = dO v^T (fp32), D = rowsum(dO * O) with O the rounded
//             output, dS = P * (dP - D) (fp32), rounded to bf16 for
//             dQ = bf16(dS) k * scale and dK = bf16(dS)^T q * scale;
//             dQ, dK, dV rounded to the input dtype.
#ifndef MEGATRAIN_TESTS_TESTING_FUSED_ATTENTION_EMULATION_H_
#define MEGATRAIN_TESTS_TESTING_FUSED_ATTENTION_EMULATION_H_

#include <ATen/ATen.h>

namespace megatrain::testing {

// softmax(q k^T * scale, masked) v with the fused kernels' rounding points.
// q, k, v [B, H, T, Dh] in one dtype (bf16 or fp32; kv heads already
// repeated); `allowed` boolean [T, T] (true = attend, every row has at
// least one true). Returns [B, H, T, Dh] in q's dtype. Differentiable with
// respect to q, k and v (a custom backward with the rounding points above).
at::Tensor FusedAttentionEmulation(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& allowed, double scale);

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_FUSED_ATTENTION_EMULATION_H_
