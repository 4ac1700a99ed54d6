// AdamW on ATen tensors, on the device they live on: the optimizer of the
// decoder layers that stay on the GPU (Note [Resident layers] in
// executor.h). Same arithmetic as the CPU kernels (Note [AdamW update] in
// adamw.h): the same fp32 factors (MakeAdamWCoefficients), applied in the
// same order, one elementwise op at a time, so results agree with
// AdamWUpdate to a few ulp (FMA contraction on the GPU), not bit for bit.
#ifndef MEGATRAIN_ENGINE_TENSOR_ADAMW_H_
#define MEGATRAIN_ENGINE_TENSOR_ADAMW_H_

#include <ATen/ATen.h>

#include <vector>

#include "engine/optim/adamw.h"

namespace megatrain::engine {

// One AdamW update of `params` ([n] fp32, contiguous), in place, with
// `grads`, `exp_avg` (m) and `exp_avg_sq` (v) ([n] fp32, same device).
// `grads` is scaled in place by hp.grad_scale when that is not 1 (its
// values are spent: the next step overwrites them). `compute_copy`, when
// defined and not `params` itself, receives the updated parameters in its
// dtype (bf16: rounded to nearest even, as FloatToBf16). Enqueued on the
// device's current stream without a host synchronisation; about 10
// elementwise kernels (timing in docs/performance.md). Throws
// c10::Error on a device failure (the caller converts it). Not
// thread-safe for the same tensors.
void TensorAdamWStep(const AdamWStepParams& hp, const at::Tensor& params, const at::Tensor& grads,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                     const at::Tensor& compute_copy);

// Note [Fused device AdamW]
// The resident blocks are updated together, in one multi-tensor call
// (MultiTensorAdamWStep), where torch has one: on CUDA with torch >= 2.1,
// ATen's _fused_adamw_ (compat::FusedAdamW, the kernel of
// torch.optim.AdamW(fused=True)) reads p, g, m, v once and writes p, m, v
// (and g when it scales it) once: 32 bytes per parameter against about 100
// for TensorAdamWStep's ten passes, plus 6 for the bf16 copy either way.
//
// Numerics: Note [AdamW update]'s formula, but the kernel's own rounding:
// it derives the bias corrections from a fp32 step count, divides by
// sqrt(1-beta2^t) where the CPU kernels multiply by its fp32 reciprocal,
// and its moment update behaves as if beta2 were rounded to fp32 first
// (the measured error below is exactly that rounding's). exp_avg agrees
// with AdamWUpdate within 1e-6 (norm-relative), exp_avg_sq only within
// 1.3e-5 (measured on an H200, torch 2.11, tests/engine/optim/adamw_test.cc):
// the relative error of 1 - beta2 with beta2 rounded to fp32 (1.29e-5 for
// 0.999), i.e. the kernel runs with beta2 = fp32(0.999). So the resident
// layers follow torch.optim.AdamW(fused=True)'s arithmetic, not the CPU
// kernels' to a few ulp; MEGATRAIN_DEBUG_UNFUSED_DEVICE_ADAMW=1 restores
// the unfused path (a few ulp from AdamWUpdate).
// The clip factor c (hp.grad_scale) reaches the kernel as its grad_scale
// s = fp32(1/c), which it divides by: g/s is within an ulp of g*c, not
// equal to it. When 1/c is not a normal fp32 (c = 0, or c below 2^-126),
// the gradients are multiplied by c first (_foreach_mul_, fp32(g*c) as
// TensorAdamWStep) and the kernel gets no scale. The step count goes to
// the kernel as fp32, exact up to 2^24 updates.
//
// Elsewhere (CPU; torch 1.13, which has no _fused_adamw_; a tensor that is
// not fp32) each set runs TensorAdamWStep. ATen's _foreach_* ops (in 1.13
// too) would make that path one call per operation instead of one per
// tensor and operation, with the same arithmetic on the CPU (there they are
// a loop of the same ops), but they save launches only (the resident
// blocks are one large tensor per layer, so launches are not the cost),
// and _foreach_sqrt would hold sqrt(v) for every block at once, 4 bytes per
// resident parameter of device memory where TensorAdamWStep holds one
// block's: not used.

// One AdamW update of a tensor set, the arguments of TensorAdamWStep.
struct AdamWTensorSet {
  at::Tensor params;        // [n] fp32, contiguous, updated in place
  at::Tensor grads;         // [n] fp32, spent: scaled in place (any value after)
  at::Tensor exp_avg;       // [n] fp32 m, in place
  at::Tensor exp_avg_sq;    // [n] fp32 v, in place
  at::Tensor compute_copy;  // receives the updated params in its dtype, or
                            // undefined, or `params` itself (no copy)
};

// Debug knob for A/B measurements (megatrain-bench in one call):
// MEGATRAIN_DEBUG_UNFUSED_DEVICE_ADAMW=1 in the environment makes
// MultiTensorAdamWStep run TensorAdamWStep per set even where it would
// fuse (read at every call; announced once on stderr).
inline constexpr char kUnfusedDeviceAdamWEnv[] = "MEGATRAIN_DEBUG_UNFUSED_DEVICE_ADAMW";
// Whether the knob is set to 1. Thread-safe.
bool UnfusedDeviceAdamWForced();

// One AdamW update (the same `hp`, step count included) of every set in
// `sets`, all on one device: Note [Fused device AdamW] (one fused
// multi-tensor call on CUDA with torch >= 2.1 unless the knob above is
// set, TensorAdamWStep per set elsewhere), then each compute copy from
// its updated params (bf16: round to nearest even). Results agree with
// AdamWUpdate as the Note says (fused: exp_avg_sq within ~1.3e-5). Enqueued on the device's current
// stream, no host synchronisation. Throws c10::Error on a device failure (the caller converts it).
// Not thread-safe for the same tensors. Empty `sets`: nothing.
void MultiTensorAdamWStep(const AdamWStepParams& hp, const std::vector<AdamWTensorSet>& sets);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TENSOR_ADAMW_H_
