// Fused-kernel rounding emulation (see fused_attention_emulation.h).
#include "tests/testing/fused_attention_emulation.h"

#include <torch/csrc/autograd/custom_function.h>

#include <limits>

namespace megatrain::testing {
namespace {

// a @ b^T of two tensors in the input dtype, accumulated in fp32 (the
// products of bf16 values are exact in fp32).
at::Tensor MatmulFp32(const at::Tensor& a, const at::Tensor& b_t) {
  return at::matmul(a.to(at::kFloat), b_t.to(at::kFloat));
}

// Rounds x (fp32) to `dtype` and back: the value a kernel stores in a
// reduced-precision register tile.
at::Tensor Round(const at::Tensor& x, at::ScalarType dtype) { return x.to(dtype).to(at::kFloat); }

struct FusedAttentionFunction : public torch::autograd::Function<FusedAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                            double scale) {
    const at::ScalarType dtype = q.scalar_type();
    at::Tensor s = MatmulFp32(q, k.transpose(-2, -1)) * scale;  // [B, H, T, T] fp32
    s = s.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    at::Tensor row_max = std::get<0>(s.max(-1, /*keepdim=*/true));
    at::Tensor e = at::exp(s - row_max);               // unnormalised, fp32
    at::Tensor row_sum = e.sum(-1, /*keepdim=*/true);  // [B, H, T, 1]
    at::Tensor out = (at::matmul(Round(e, dtype), v.to(at::kFloat)) / row_sum).to(dtype);
    at::Tensor lse = row_max + at::log(row_sum);  // fp32
    ctx->save_for_backward({q, k, v, allowed, out, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &allowed = saved[3];
    const at::Tensor &out = saved[4], &lse = saved[5];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::ScalarType dtype = q.scalar_type();
    const at::Tensor grad_out = grad_outputs[0].to(dtype);  // the kernel's input dtype
    at::Tensor s = MatmulFp32(q, k.transpose(-2, -1)) * scale;
    s = s.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    at::Tensor p = at::exp(s - lse);  // [B, H, T, T] fp32, normalised
    at::Tensor grad_v = at::matmul(Round(p, dtype).transpose(-2, -1), grad_out.to(at::kFloat));
    at::Tensor grad_p = MatmulFp32(grad_out, v.transpose(-2, -1));
    at::Tensor d = (grad_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1, /*keepdim=*/true);
    at::Tensor grad_s = Round(p * (grad_p - d), dtype);
    at::Tensor grad_q = at::matmul(grad_s, k.to(at::kFloat)) * scale;
    at::Tensor grad_k = at::matmul(grad_s.transpose(-2, -1), q.to(at::kFloat)) * scale;
    return {grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor FusedAttentionEmulation(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& allowed, double scale) {
  return FusedAttentionFunction::apply(q, k, v, allowed, scale);
}

}  // namespace megatrain::testing
