// The fused kernels' ATen wrappers (fused_ops.h); CUDA builds only.
#include "engine/model/fused_ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <torch/autograd.h>

#include "engine/model/fused_kernels.h"
#include "engine/model/fused_math.h"

namespace megatrain::engine {
namespace {

static_assert(static_cast<int>(MlpActivation::kSilu) ==
                      static_cast<int>(fused::GatedActivation::kSilu) &&
                  static_cast<int>(MlpActivation::kGeluTanh) ==
                      static_cast<int>(fused::GatedActivation::kGeluTanh) &&
                  static_cast<int>(MlpActivation::kGelu) ==
                      static_cast<int>(fused::GatedActivation::kGelu),
              "fused::GatedActivation numbers MlpActivation's values");

const __nv_bfloat16* Bf16(const at::Tensor& t) {
  return reinterpret_cast<const __nv_bfloat16*>(t.data_ptr());
}
__nv_bfloat16* MutableBf16(const at::Tensor& t) {
  return reinterpret_cast<__nv_bfloat16*>(t.data_ptr());
}

void CheckLaunch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

// act(g) * u with a one-kernel backward. Inputs gate, up bf16 [..., F]
// (same shape), the activation as int64.
struct GatedProductFunction : public torch::autograd::Function<GatedProductFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up, int64_t activation) {
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    ctx->save_for_backward({g, u});
    ctx->saved_data["activation"] = activation;
    at::Tensor p = at::empty_like(g, at::MemoryFormat::Contiguous);  // [..., F] bf16
    CheckLaunch(fused::LaunchGatedForward(Bf16(g), Bf16(u), MutableBf16(p), g.numel(),
                                          static_cast<int>(activation),
                                          at::cuda::getCurrentCUDAStream(g.get_device())),
                "fused gated product forward");
    return p;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const at::Tensor dp = grad_outputs[0].to(at::kBFloat16).contiguous();
    at::Tensor dg = at::empty_like(g, at::MemoryFormat::Contiguous);
    at::Tensor du = at::empty_like(u, at::MemoryFormat::Contiguous);
    CheckLaunch(fused::LaunchGatedBackward(Bf16(g), Bf16(u), Bf16(dp), MutableBf16(dg),
                                           MutableBf16(du), g.numel(),
                                           static_cast<int>(ctx->saved_data["activation"].toInt()),
                                           at::cuda::getCurrentCUDAStream(g.get_device())),
                "fused gated product backward");
    return {dg, du, at::Tensor()};
  }
};

}  // namespace

bool FusedGatedProductApplies(const at::Tensor& gate, const at::Tensor& up) {
  return gate.is_cuda() && up.is_cuda() && gate.scalar_type() == at::kBFloat16 &&
         up.scalar_type() == at::kBFloat16 && gate.sizes() == up.sizes() &&
         gate.device() == up.device();
}

at::Tensor FusedGatedProduct(const at::Tensor& gate, const at::Tensor& up, MlpActivation a) {
  return GatedProductFunction::apply(gate, up, static_cast<int64_t>(a));
}

}  // namespace megatrain::engine
