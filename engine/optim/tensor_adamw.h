// AdamW on ATen tensors, on the device they live on: the optimizer of the
// decoder layers that stay on the GPU (Note [Resident layers] in
// executor.h). Same arithmetic as the CPU kernels (Note [AdamW update] in
// adamw.h): the same fp32 factors (MakeAdamWCoefficients), applied in the
// same order, one elementwise op at a time, so results agree with
// AdamWUpdate to a few ulp (FMA contraction on the GPU), not bit for bit.
#ifndef MEGATRAIN_ENGINE_TENSOR_ADAMW_H_
#define MEGATRAIN_ENGINE_TENSOR_ADAMW_H_

#include <ATen/ATen.h>

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

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TENSOR_ADAMW_H_
