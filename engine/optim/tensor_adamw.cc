// See tensor_adamw.h.
#include "engine/optim/tensor_adamw.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

// Whether every tensor of `sets` is fp32 on a device where
// compat::FusedAdamW runs (the device of the first).
bool CanFuse(const std::vector<AdamWTensorSet>& sets) {
  const at::Device device = sets.front().params.device();
  if (!compat::FusedAdamWSupported(device)) return false;
  for (const AdamWTensorSet& s : sets) {
    for (const at::Tensor* t : {&s.params, &s.grads, &s.exp_avg, &s.exp_avg_sq}) {
      if (t->scalar_type() != at::kFloat || t->device() != device || !t->is_contiguous()) {
        return false;
      }
    }
  }
  return true;
}

// Note [Fused device AdamW]: one compat::FusedAdamW over all sets.
void FusedStep(const AdamWStepParams& hp, const std::vector<AdamWTensorSet>& sets) {
  const auto fp32 = sets.front().params.options().dtype(at::kFloat);
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
  for (const AdamWTensorSet& s : sets) {
    params.push_back(s.params);
    grads.push_back(s.grads);
    exp_avg.push_back(s.exp_avg);
    exp_avg_sq.push_back(s.exp_avg_sq);
  }
  // One fill for all step counts; each set reads its own element.
  const at::Tensor step_counts =
      at::full({static_cast<int64_t>(sets.size())}, static_cast<double>(hp.step), fp32);
  for (int64_t i = 0; i < step_counts.numel(); ++i) steps.push_back(step_counts[i]);
  at::Tensor grad_scale;  // undefined: no scaling
  if (hp.grad_scale != 1.0f) {
    const float inverse = static_cast<float>(1.0 / static_cast<double>(hp.grad_scale));
    if (std::isnormal(inverse)) {
      grad_scale = at::full({}, inverse, fp32);
    } else {
      at::_foreach_mul_(grads, static_cast<double>(hp.grad_scale));
    }
  }
  compat::FusedAdamW(params, grads, exp_avg, exp_avg_sq, steps, hp.lr, hp.beta1, hp.beta2,
                     hp.weight_decay, hp.eps, grad_scale);
  for (const AdamWTensorSet& s : sets) {
    if (s.compute_copy.defined() && !s.compute_copy.is_same(s.params)) {
      s.compute_copy.copy_(s.params);
    }
  }
}

}  // namespace

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

bool UnfusedDeviceAdamWForced() {
  const char* value = std::getenv(kUnfusedDeviceAdamWEnv);
  const bool forced = value != nullptr && std::string_view(value) == "1";
  static std::atomic<bool> announced{false};
  if (forced && !announced.exchange(true)) {
    std::fprintf(stderr, "megatrain: debug knob %s=1: the resident blocks' AdamW runs unfused\n",
                 kUnfusedDeviceAdamWEnv);
  }
  return forced;
}

void MultiTensorAdamWStep(const AdamWStepParams& hp, const std::vector<AdamWTensorSet>& sets) {
  if (sets.empty()) return;
  if (!UnfusedDeviceAdamWForced() && CanFuse(sets)) {
    FusedStep(hp, sets);
    return;
  }
  for (const AdamWTensorSet& s : sets) {
    TensorAdamWStep(hp, s.params, s.grads, s.exp_avg, s.exp_avg_sq, s.compute_copy);
  }
}

}  // namespace megatrain::engine
