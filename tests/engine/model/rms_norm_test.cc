// RmsNorm (engine/model/layers.h) against HF LlamaRMSNorm's expression,
// weight * (x_f32 * rsqrt(mean(x_f32^2, -1) + eps)).to(x.dtype), with
// autograd through it. On the CPU the engine computes exactly that
// expression: bit for bit. On CUDA with torch >= 2.9 an fp32 input (the
// residual stream) takes the fused kernel (Note [Fused RMSNorm] in
// engine/runtime/torch_compat.h), whose reduction order differs: output
// and gradients within fp32 rounding of the expression, and the same bits
// on every call.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <tuple>

#include "engine/model/layers.h"

namespace megatrain::engine {
namespace {

constexpr int64_t kRows = 3, kCols = 37, kD = 256;
constexpr double kEps = 1e-5;

at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

struct NormResult {
  at::Tensor x, y, grad_x, grad_w;
};

// y = norm(x, w) and the gradients of sum(y * g) for x [kRows, kCols, kD]
// of `x_dtype` and w [kD] of `w_dtype`.
NormResult RunNorm(bool engine, at::ScalarType x_dtype, at::ScalarType w_dtype, at::Device device) {
  at::manual_seed(11);
  at::Tensor x = (at::randn({kRows, kCols, kD}) * 3).to(device, x_dtype).requires_grad_(true);
  at::Tensor w = (at::rand({kD}) + 0.5).to(device, w_dtype).requires_grad_(true);
  const at::Tensor g = at::randn({kRows, kCols, kD}).to(device);
  const at::Tensor y = engine ? RmsNorm(x, w, kEps) : HfRmsNorm(x, w, kEps);
  const auto grads = torch::autograd::grad({(y.to(at::kFloat) * g).sum()}, {x, w});
  return {x.detach(), y.detach(), grads[0], grads[1]};
}

double MaxRelative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor af = a.to(at::kFloat).cpu(), bf = b.to(at::kFloat).cpu();
  return ((af - bf).abs().max() / bf.abs().max()).item<double>();
}

class RmsNormTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, at::ScalarType, bool>> {};

TEST_P(RmsNormTest, MatchesTheHfExpressionAndItsAutograd) {
  const auto [x_dtype, w_dtype, cuda] = GetParam();
  if (cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const NormResult hf = RunNorm(/*engine=*/false, x_dtype, w_dtype, device);
  const NormResult ours = RunNorm(/*engine=*/true, x_dtype, w_dtype, device);
  ASSERT_EQ(ours.y.scalar_type(), hf.y.scalar_type());
  ASSERT_EQ(ours.grad_w.scalar_type(), w_dtype);
  ASSERT_EQ(ours.y.sizes(), hf.y.sizes());
  const bool fused_possible = cuda && x_dtype == at::kFloat;
  if (!fused_possible) {
    EXPECT_TRUE(at::equal(ours.y, hf.y)) << "max rel " << MaxRelative(ours.y, hf.y);
    EXPECT_TRUE(at::equal(ours.grad_x, hf.grad_x)) << MaxRelative(ours.grad_x, hf.grad_x);
    EXPECT_TRUE(at::equal(ours.grad_w, hf.grad_w)) << MaxRelative(ours.grad_w, hf.grad_w);
  } else {
    // fp32 rounding of a different summation order; a bf16 weight's
    // gradient is rounded to bf16 after the fp32 sum.
    const double w_tol = w_dtype == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_LT(MaxRelative(ours.y, hf.y), 1e-6);
    EXPECT_LT(MaxRelative(ours.grad_x, hf.grad_x), 1e-5);
    EXPECT_LT(MaxRelative(ours.grad_w, hf.grad_w), w_tol);
  }
  // Deterministic: the same bits again.
  const NormResult again = RunNorm(/*engine=*/true, x_dtype, w_dtype, device);
  EXPECT_TRUE(at::equal(again.y, ours.y));
  EXPECT_TRUE(at::equal(again.grad_x, ours.grad_x));
  // Not the identity: x is scaled by about 3, the output has RMS about 1.
  EXPECT_GT(MaxRelative(ours.y, ours.x), 0.5);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RmsNormTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(false, true)),
                         [](const auto& info) {
                           const auto name = [](at::ScalarType t) {
                             return t == at::kFloat ? "fp32" : "bf16";
                           };
                           return std::string("x_") + name(std::get<0>(info.param)) + "_w_" +
                                  name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_cuda" : "_cpu");
                         });

}  // namespace
}  // namespace megatrain::engine
