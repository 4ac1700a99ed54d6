// See tensor_adamw.h.
#include "engine/optim/tensor_adamw.h"

namespace megatrain::engine {

void TensorAdamWStep(const AdamWStepParams& hp, const at::Tensor& params, const at::Tensor& grads,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                     const at::Tensor& compute_copy) {
  // Note [AdamW update], in the scalar kernel's order of operations.
  const AdamWCoefficients c = MakeAdamWCoefficients(hp);
  if (c.grad_scale != 1.0f) grads.mul_(c.grad_scale);                  // g
  params.mul_(c.decay);                                                // p * (1 - lr*wd)
  exp_avg.mul_(c.beta1).add_(grads, c.one_minus_beta1);                // m*b1 + (1-b1)*g
  exp_avg_sq.mul_(c.beta2).addcmul_(grads, grads, c.one_minus_beta2);  // v*b2 + ((1-b2)*g)*g
  const at::Tensor denom = exp_avg_sq.sqrt().mul_(c.inv_sqrt_bc2).add_(c.eps);
  params.addcdiv_(exp_avg, denom, -c.step_size);  // p - step_size * (m / denom)
  if (compute_copy.defined() && !compute_copy.is_same(params)) compute_copy.copy_(params);
}

}  // namespace megatrain::engine
