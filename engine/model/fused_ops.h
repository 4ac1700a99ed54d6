// ATen-facing wrappers of the fused kernels (Note [Fused kernels] in
// fused_math.h): tensor checks, the current CUDA stream, autograd. The
// definitions (fused_ops.cc) are compiled only in CUDA builds configured
// with -DMEGATRAIN_FUSED_KERNELS=ON (the macro MEGATRAIN_FUSED_KERNELS);
// callers test FusedGatedProductApplies first and keep the ATen path
// otherwise.
#ifndef MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_
#define MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_

#include <ATen/ATen.h>

#include <utility>

#include "engine/model/model_config.h"

namespace megatrain::engine {

// True when this build has the fused kernels (a CUDA build configured
// with -DMEGATRAIN_FUSED_KERNELS=ON).
constexpr bool FusedKernelsCompiled() {
#ifdef MEGATRAIN_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

// Whether FusedGatedProduct takes gate and up: a CUDA build, both CUDA
// bf16 tensors of one shape. Other dtypes (fp32 / tf32 compute) keep the
// ATen ops.
bool FusedGatedProductApplies(const at::Tensor& gate, const at::Tensor& up);

// act(gate) * up [..., F] bf16 as one kernel, differentiable: its backward
// is one kernel producing d_gate and d_up; it saves gate and up only (the
// ATen path also keeps act(gate)). Precondition: FusedGatedProductApplies.
// Throws c10::Error on a CUDA launch error (as ATen ops do).
at::Tensor FusedGatedProduct(const at::Tensor& gate, const at::Tensor& up, MlpActivation a);

// Whether FusedAddRmsNorm takes these: a CUDA build, residual fp32 and
// delta bf16 [..., C] of one shape on one CUDA device, weight [C] bf16,
// C <= 16384.
bool FusedAddRmsNormApplies(const at::Tensor& residual, const at::Tensor& delta,
                            const at::Tensor& weight);

// hidden = residual + delta (fp32 [..., C]) and normed = RMSNorm(hidden)
// in bf16 ([..., C]; weight scale w or 1 + w by `kind`), as one kernel,
// differentiable in residual, delta and weight: its backward is one kernel
// for the residual's gradient (hidden's own gradient plus the norm's) and
// the weight gradient's partial sums, then one sum over row blocks.
// Saves hidden and the per-row inverse RMS ([rows] fp32). Precondition:
// FusedAddRmsNormApplies. Throws c10::Error on a CUDA launch error.
std::pair<at::Tensor, at::Tensor> FusedAddRmsNorm(const at::Tensor& residual,
                                                  const at::Tensor& delta, const at::Tensor& weight,
                                                  double eps, NormKind kind);

// Whether FusedRotateInto takes these: a CUDA build; x [B, T, heads, Dh]
// bf16 or fp32 on a CUDA device (any strides); cos, sin fp32 on x's
// device, [T, Dr] or [B, T, Dr], Dr even and <= Dh; out contiguous, x's
// shape, dtype and device.
bool FusedRotaryApplies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& out);

// out = x rotated (adjoint false) or x's gradient from y's (adjoint true)
// as one kernel (fused::LaunchRotaryBf16: Note [RoPE kernels] in
// layers.cc), bit for bit the ATen composite's values; not differentiable
// itself (RopeFunction in layers.cc is the autograd node). Enqueued on
// the current stream. Precondition: FusedRotaryApplies. Throws c10::Error
// on a launch error.
void FusedRotateInto(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     bool adjoint, const at::Tensor& out);

// The L2 norm of x (fp32, contiguous, on a CUDA device; any shape) as a
// 0-dim fp64 tensor on x's device, accumulated in fp64 in one read of x
// (fused::LaunchNormFp64; deterministic for a given numel). Agrees with
// linalg_vector_norm(x, 2, dtype=fp64) to fp64 rounding (~1e-15
// relative), not bit for bit: another summation order. Enqueued on the
// current stream. Precondition: FusedKernelsCompiled(), x as said.
// Throws c10::Error on a launch error.
at::Tensor FusedNormFp64(const at::Tensor& x);

// Whether FusedCrossEntropyInPlace takes these: a CUDA build; logits
// contiguous bf16 [rows, vocab] on a CUDA device, rows < 2^31; labels
// contiguous int64 [rows] on the same device.
bool FusedCrossEntropyApplies(const at::Tensor& logits, const at::Tensor& labels);

// Token cross-entropy of each row with its gradient written over the
// logits (fused::LaunchCrossEntropyInPlace; Note [Fused cross-entropy] in
// layers.cc): afterwards `logits` holds bf16 d(scale * sum of row
// losses)/d logits, and the result is the row losses, fp32 [rows] (nats;
// 0 where the label is -100, NaN for a label outside [0, vocab)). Within
// fp32 rounding of ATen's cross_entropy_loss and its backward, not bit
// for bit. Enqueued on the current stream. Precondition:
// FusedCrossEntropyApplies. Throws c10::Error on a launch error.
at::Tensor FusedCrossEntropyInPlace(const at::Tensor& logits, const at::Tensor& labels,
                                    double scale);

// Whether FusedAddBf16IntoFp32 takes these: a CUDA build; dst contiguous
// fp32 and src contiguous bf16 of one numel on one CUDA device.
bool FusedAddIntoFp32Applies(const at::Tensor& dst, const at::Tensor& src);

// dst += src widened to fp32, one kernel (fused::LaunchAddBf16IntoFp32):
// bit for bit dst.add_(src.to(at::kFloat)). Enqueued on the current
// stream. Precondition: FusedAddIntoFp32Applies. Throws c10::Error on a
// launch error.
void FusedAddBf16IntoFp32(const at::Tensor& dst, const at::Tensor& src);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_
