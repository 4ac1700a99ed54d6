// ApplyRotaryEmbedding (Note [RoPE kernels] in engine/model/layers.cc)
// against the plain HF expression it replaces, (x * cos + rotate_half(x) *
// sin) in fp32 on the transposed [B, heads, T, Dh] view and rounded once,
// with autograd through it: output and input gradient bit for bit, for
// fp32 and bf16 inputs, full rotary (Llama) and partial rotary (Dr < Dh),
// and a gradient that arrives as a non-contiguous (transposed) view as it
// does from attention's backward. On CUDA too where a device is present
// (the GPU machines' suites).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <tuple>

#include "engine/model/layers.h"

namespace megatrain::engine {
namespace {

constexpr int64_t kB = 2, kT = 7, kHeads = 3, kDh = 16;

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// HF apply_rotary_pos_emb (with Phi-3's partial rotary) on x [B, heads, T,
// Dh], computed in fp32 and rounded to x's dtype (Note [RoPE precision]).
at::Tensor HfRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor c = cos.unsqueeze(0).unsqueeze(0), s = sin.unsqueeze(0).unsqueeze(0);
  const at::Tensor xf = x.to(at::kFloat);
  const int64_t rotary = cos.size(-1);
  const at::Tensor x_rot = xf.narrow(-1, 0, rotary);
  const at::Tensor rot = (x_rot * c + RotateHalf(x_rot) * s).to(x.scalar_type());
  if (rotary == x.size(-1)) return rot;
  return at::cat({rot, x.narrow(-1, rotary, x.size(-1) - rotary)}, -1);
}

struct RopeResult {
  at::Tensor y;       // [B, heads, T, Dh], the input's dtype
  at::Tensor grad_x;  // [B, T, heads, Dh]
};

// y = rope(x) as attention sees it ([B, heads, T, Dh]) and the gradient of
// sum(y * w) in x, for x [B, T, heads, Dh] of `dtype`.
RopeResult RunRope(bool engine, at::ScalarType dtype, int64_t rotary, at::Device device) {
  at::manual_seed(7);
  const at::Tensor x0 = at::randn({kB, kT, kHeads, kDh}).to(device, dtype);
  const at::Tensor w = at::randn({kB, kHeads, kT, kDh}).to(device, dtype);
  const at::Tensor positions = at::arange(kT, at::kFloat).unsqueeze(1);
  const at::Tensor inv_freq = at::pow(10000.0, -at::arange(0, rotary, 2, at::kFloat) / rotary);
  const at::Tensor freqs = positions * inv_freq.unsqueeze(0);  // [T, Dr/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  const at::Tensor cos = emb.cos().to(device), sin = emb.sin().to(device);
  at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = engine ? ApplyRotaryEmbedding(x, cos, sin).transpose(1, 2)
                              : HfRope(x.transpose(1, 2), cos, sin);
  at::Tensor grad = torch::autograd::grad({(y * w).sum()}, {x})[0];
  return {y.detach(), grad};
}

class RotaryEmbeddingTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, bool>> {};

TEST_P(RotaryEmbeddingTest, BitIdenticalToTheHfExpressionAndItsAutograd) {
  const auto [dtype, rotary, cuda] = GetParam();
  if (cuda && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const RopeResult hf = RunRope(/*engine=*/false, dtype, rotary, device);
  const RopeResult ours = RunRope(/*engine=*/true, dtype, rotary, device);
  ASSERT_EQ(ours.y.scalar_type(), dtype);
  ASSERT_EQ(ours.grad_x.scalar_type(), dtype);
  ASSERT_EQ(ours.y.sizes(), hf.y.sizes());
  EXPECT_TRUE(at::equal(ours.y, hf.y))
      << "max |diff| " << (ours.y.to(at::kFloat) - hf.y.to(at::kFloat)).abs().max().item<float>();
  EXPECT_TRUE(at::equal(ours.grad_x, hf.grad_x))
      << "max |diff| "
      << (ours.grad_x.to(at::kFloat) - hf.grad_x.to(at::kFloat)).abs().max().item<float>();
  // Not the identity: positions > 0 rotate.
  const RopeResult again = RunRope(/*engine=*/true, dtype, rotary, device);
  EXPECT_TRUE(at::equal(again.y, ours.y));
  at::manual_seed(7);
  const at::Tensor x0 = at::randn({kB, kT, kHeads, kDh}).to(device, dtype);
  EXPECT_FALSE(at::equal(ours.y, x0.transpose(1, 2)));
}

INSTANTIATE_TEST_SUITE_P(DtypesAndRotaryDims, RotaryEmbeddingTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(kDh, kDh / 2),
                                            ::testing::Values(false, true)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == at::kFloat ? "fp32"
                                                                                    : "bf16") +
                                  (std::get<1>(info.param) == kDh ? "_full" : "_partial") +
                                  (std::get<2>(info.param) ? "_cuda" : "_cpu");
                         });

TEST(RotaryEmbeddingNoGradTest, ForwardWithoutAutogradMatches) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({kB, kT, kHeads, kDh}).to(at::kBFloat16);
  const at::Tensor emb = at::randn({kT, kDh});
  at::Tensor with_grad_mode = ApplyRotaryEmbedding(x, emb.cos(), emb.sin());
  at::NoGradGuard no_grad;
  at::Tensor without = ApplyRotaryEmbedding(x, emb.cos(), emb.sin());
  EXPECT_TRUE(at::equal(with_grad_mode, without));
  EXPECT_TRUE(without.is_contiguous());
  EXPECT_EQ(without.sizes(), x.sizes());
}

}  // namespace
}  // namespace megatrain::engine
