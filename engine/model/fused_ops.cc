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

// hidden = residual + delta, normed = RMSNorm(hidden) (fused_ops.h).
// Inputs residual fp32 [N, C], delta bf16 [N, C], weight bf16 [C], eps,
// one_plus.
struct AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& residual, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps,
                                                bool one_plus) {
    const at::Tensor res = residual.contiguous(), del = delta.contiguous();
    const at::Tensor w = weight.contiguous();
    const int64_t width = res.size(-1), rows = res.numel() / width;
    at::Tensor hidden = at::empty_like(res, at::MemoryFormat::Contiguous);    // fp32
    at::Tensor normed = at::empty_like(del, at::MemoryFormat::Contiguous);    // bf16
    at::Tensor inv_rms = at::empty({rows}, res.options().dtype(at::kFloat));  // [N]
    CheckLaunch(
        fused::LaunchAddRmsNormForward(
            res.data_ptr<float>(), Bf16(del), Bf16(w), hidden.data_ptr<float>(),
            MutableBf16(normed), inv_rms.data_ptr<float>(), rows, static_cast<int>(width),
            static_cast<float>(eps), one_plus, at::cuda::getCurrentCUDAStream(res.get_device())),
        "fused add + RMSNorm forward");
    ctx->save_for_backward({hidden, inv_rms, w});
    ctx->saved_data["one_plus"] = one_plus;
    return {hidden, normed};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &inv_rms = saved[1], &w = saved[2];
    const int64_t width = hidden.size(-1), rows = hidden.numel() / width;
    // An output without a gradient arrives undefined: zeros stand in.
    const at::Tensor d_hidden_in = grad_outputs[0].defined()
                                       ? grad_outputs[0].to(at::kFloat).contiguous()
                                       : at::zeros_like(hidden);
    const at::Tensor d_normed = grad_outputs[1].defined()
                                    ? grad_outputs[1].to(at::kBFloat16).contiguous()
                                    : at::zeros(hidden.sizes(), w.options());
    at::Tensor d_hidden = at::empty_like(hidden, at::MemoryFormat::Contiguous);
    at::Tensor partial = at::empty({fused::FusedRmsNormBackwardBlocks(rows), width},
                                   hidden.options());  // fp32 [blocks, C]
    CheckLaunch(fused::LaunchAddRmsNormBackward(
                    hidden.data_ptr<float>(), inv_rms.data_ptr<float>(), Bf16(d_normed),
                    d_hidden_in.data_ptr<float>(), Bf16(w), d_hidden.data_ptr<float>(),
                    partial.data_ptr<float>(), rows, static_cast<int>(width),
                    ctx->saved_data["one_plus"].toBool(),
                    at::cuda::getCurrentCUDAStream(hidden.get_device())),
                "fused add + RMSNorm backward");
    // residual (fp32) and delta (bf16) get hidden's gradient, as autograd's
    // add does; the weight its summed partials in its dtype.
    at::Tensor d_delta = d_hidden.to(at::kBFloat16);
    return {d_hidden, d_delta, partial.sum(0).to(w.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FusedAddRmsNormApplies(const at::Tensor& residual, const at::Tensor& delta,
                            const at::Tensor& weight) {
  return residual.is_cuda() && delta.is_cuda() && weight.is_cuda() &&
         residual.scalar_type() == at::kFloat && delta.scalar_type() == at::kBFloat16 &&
         weight.scalar_type() == at::kBFloat16 && residual.sizes() == delta.sizes() &&
         residual.device() == delta.device() && weight.dim() == 1 &&
         weight.size(0) == residual.size(-1) && residual.size(-1) <= 16384;
}

std::pair<at::Tensor, at::Tensor> FusedAddRmsNorm(const at::Tensor& residual,
                                                  const at::Tensor& delta, const at::Tensor& weight,
                                                  double eps, NormKind kind) {
  const auto outs =
      AddRmsNormFunction::apply(residual, delta, weight, eps, kind == NormKind::kRmsOnePlusWeight);
  return {outs[0], outs[1]};
}

bool FusedGatedProductApplies(const at::Tensor& gate, const at::Tensor& up) {
  return gate.is_cuda() && up.is_cuda() && gate.scalar_type() == at::kBFloat16 &&
         up.scalar_type() == at::kBFloat16 && gate.sizes() == up.sizes() &&
         gate.device() == up.device();
}

at::Tensor FusedGatedProduct(const at::Tensor& gate, const at::Tensor& up, MlpActivation a) {
  return GatedProductFunction::apply(gate, up, static_cast<int64_t>(a));
}

bool FusedRotaryApplies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& out) {
  const bool dtype_ok = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat;
  if (!x.is_cuda() || !dtype_ok || x.dim() != 4 || !out.is_contiguous() ||
      out.sizes() != x.sizes() || out.scalar_type() != x.scalar_type() ||
      out.device() != x.device()) {
    return false;
  }
  const bool table_dims = (cos.dim() == 2 && cos.size(0) == x.size(1)) ||
                          (cos.dim() == 3 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1));
  const int64_t rotary = cos.size(-1);
  return table_dims && cos.sizes() == sin.sizes() && cos.scalar_type() == at::kFloat &&
         sin.scalar_type() == at::kFloat && cos.device() == x.device() &&
         sin.device() == x.device() && rotary > 0 && rotary % 2 == 0 && rotary <= x.size(3);
}

void FusedRotateInto(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     bool adjoint, const at::Tensor& out) {
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  fused::RotaryShape shape{x.size(0),   x.size(1),   x.size(2),
                           x.size(3),   x.stride(0), x.stride(1),
                           x.stride(2), x.stride(3), static_cast<int>(c.size(-1)),
                           c.dim() == 3};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.get_device());
  if (x.scalar_type() == at::kBFloat16) {
    CheckLaunch(fused::LaunchRotaryBf16(Bf16(x), c.data_ptr<float>(), s.data_ptr<float>(),
                                        MutableBf16(out), shape, adjoint, stream),
                "fused rotary embedding");
  } else {
    CheckLaunch(
        fused::LaunchRotaryFp32(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(),
                                out.data_ptr<float>(), shape, adjoint, stream),
        "fused rotary embedding");
  }
}

at::Tensor FusedNormFp64(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "FusedNormFp64: x must be contiguous fp32 on a CUDA device");
  const auto f64 = x.options().dtype(at::kDouble);
  at::Tensor partials = at::empty({fused::NormFp64Blocks(x.numel())}, f64);
  at::Tensor norm = at::empty({}, f64);
  CheckLaunch(fused::LaunchNormFp64(x.data_ptr<float>(), x.numel(), partials.data_ptr<double>(),
                                    norm.data_ptr<double>(),
                                    at::cuda::getCurrentCUDAStream(x.get_device())),
              "fused fp64 norm");
  return norm;
}

bool FusedCrossEntropyApplies(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.is_cuda() && logits.scalar_type() == at::kBFloat16 && logits.dim() == 2 &&
         logits.is_contiguous() && logits.size(0) <= 0x7fffffff && logits.size(1) > 0 &&
         labels.device() == logits.device() && labels.scalar_type() == at::kLong &&
         labels.dim() == 1 && labels.size(0) == logits.size(0) && labels.is_contiguous();
}

at::Tensor FusedCrossEntropyInPlace(const at::Tensor& logits, const at::Tensor& labels,
                                    double scale) {
  TORCH_CHECK(FusedCrossEntropyApplies(logits, labels),
              "FusedCrossEntropyInPlace: logits must be contiguous bf16 [rows, vocab] and labels "
              "contiguous int64 [rows] on one CUDA device");
  at::Tensor row_loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  CheckLaunch(fused::LaunchCrossEntropyInPlace(
                  MutableBf16(logits), labels.data_ptr<int64_t>(), logits.size(0), logits.size(1),
                  static_cast<float>(scale), row_loss.data_ptr<float>(),
                  at::cuda::getCurrentCUDAStream(logits.get_device())),
              "fused cross-entropy");
  return row_loss;
}

bool FusedAddIntoFp32Applies(const at::Tensor& dst, const at::Tensor& src) {
  return dst.is_cuda() && dst.scalar_type() == at::kFloat && dst.is_contiguous() &&
         src.device() == dst.device() && src.scalar_type() == at::kBFloat16 &&
         src.is_contiguous() && src.numel() == dst.numel();
}

void FusedAddBf16IntoFp32(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(FusedAddIntoFp32Applies(dst, src),
              "FusedAddBf16IntoFp32: dst contiguous fp32 and src contiguous bf16 of one numel on "
              "one CUDA device");
  CheckLaunch(fused::LaunchAddBf16IntoFp32(Bf16(src), dst.data_ptr<float>(), dst.numel(),
                                           at::cuda::getCurrentCUDAStream(dst.get_device())),
              "fused bf16 -> fp32 add");
}

}  // namespace megatrain::engine
