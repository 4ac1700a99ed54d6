// ATen-facing wrappers of the fused kernels (Note [Fused kernels] in
// fused_math.h): tensor checks, the current CUDA stream, autograd. The
// definitions (fused_ops.cc) are compiled only in CUDA builds
// (MEGATRAIN_WITH_CUDA); callers test FusedGatedProductApplies first and
// keep the ATen path otherwise.
#ifndef MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_
#define MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_

#include <ATen/ATen.h>

#include "engine/model/model_config.h"

namespace megatrain::engine {

// True when this build has the fused kernels (a CUDA build).
constexpr bool FusedKernelsCompiled() {
#ifdef MEGATRAIN_WITH_CUDA
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

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_FUSED_OPS_H_
