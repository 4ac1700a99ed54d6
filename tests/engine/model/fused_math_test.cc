// The fused kernels' per-element math (engine/model/fused_math.h, Note
// [Fused kernels]) on the host against ATen's reference ops: the
// activations, their derivatives (autograd of ATen's silu / gelu), the
// gated product's gradients, RMSNorm's input gradient and the
// cross-entropy's gradient. The device
// kernels compile the same functions, so this pins their formulas on
// every build; fused_kernels_cuda_test.cc checks the kernels themselves.
#include "engine/model/fused_math.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdint>
#include <vector>

namespace megatrain::engine {
namespace {

using fused::GatedActivation;

// fp32 math against fp32 ATen: 1e-6 relative to the tensor's largest
// magnitude (about 8 ulp of fp32 at that scale). Not per element: for
// negative inputs act(x) = 0.5 x (1 + erf(x / sqrt(2))) (or 1 + tanh(...))
// cancels, and glibc's erff / tanhf and ATen's vectorised versions differ by
// an ulp of 1 there, which is a large relative error of a tiny result (e.g.
// 1.5e-5 against 0 for gelu_pytorch_tanh's gradient at x = -9) but below
// 1e-6 of the largest value. CUDA's erff / tanhf see the same cancellation
// in ATen's own kernels, so the GPU test compares like with like.
constexpr double kFp32Rtol = 1e-6;
// bf16 inputs: both sides read the same bf16 values and compute in fp32;
// ours rounds once to bf16, the reference (HF: act(gate) * up in bf16)
// rounds act(gate) to bf16 and then the product: two roundings of 2^-8
// relative each, so 2e-2 relative (and 1e-3 absolute near 0) is ample.
constexpr double kBf16Rtol = 2e-2;
constexpr double kBf16Atol = 1e-3;

// Inputs covering the activations' regions: the tails (|x| up to 8, where
// silu and gelu saturate), the knee around 0 and values in between.
at::Tensor Inputs(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn({n}, at::kFloat) * 3.0;
}

at::Tensor AtenActivation(const at::Tensor& x, GatedActivation a) {
  switch (a) {
    case GatedActivation::kGeluTanh:
      return at::gelu(x, "tanh");
    case GatedActivation::kGelu:
      return at::gelu(x);
    case GatedActivation::kSilu:
      break;
  }
  return at::silu(x);
}

// Applies f elementwise on the host to fp32 tensors of one shape.
template <typename F>
at::Tensor Map(const at::Tensor& x, F f) {
  at::Tensor xc = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = f(in[i], i);
  return out;
}

// allclose (|ours - ref| <= atol + rtol |ref| per element), with the worst
// element in the failure message.
::testing::AssertionResult AllClose(const at::Tensor& ours, const at::Tensor& ref, double rtol,
                                    double atol) {
  if (at::allclose(ours, ref, rtol, atol)) return ::testing::AssertionSuccess();
  const at::Tensor excess = (ours - ref).abs() - ref.abs() * rtol - atol;
  const int64_t worst = excess.argmax().item<int64_t>();
  return ::testing::AssertionFailure()
         << "worst element " << worst << ": ours " << ours.flatten()[worst].item<double>()
         << ", reference " << ref.flatten()[worst].item<double>();
}

// |ours - ref| <= kFp32Rtol * max |ref| everywhere (see kFp32Rtol).
::testing::AssertionResult CloseAtScale(const at::Tensor& ours, const at::Tensor& ref) {
  return AllClose(ours, ref, 0.0, kFp32Rtol * ref.abs().max().item<double>());
}

class FusedMathTest : public ::testing::TestWithParam<GatedActivation> {};

TEST_P(FusedMathTest, ActivationMatchesAtenInFp32) {
  const GatedActivation a = GetParam();
  const at::Tensor x = Inputs(4096, 1);
  const at::Tensor ours = Map(x, [a](float v, int64_t) { return fused::ActivationForward(a, v); });
  EXPECT_TRUE(CloseAtScale(ours, AtenActivation(x, a)));
}

TEST_P(FusedMathTest, GatedGradientsMatchAutogradInFp32) {
  const GatedActivation a = GetParam();
  const at::Tensor g = Inputs(4096, 2).requires_grad_(true);
  const at::Tensor u = Inputs(4096, 3).requires_grad_(true);
  const at::Tensor dp = Inputs(4096, 4);
  const at::Tensor p = AtenActivation(g, a) * u;
  const auto grads = torch::autograd::grad({p}, {g, u}, {dp});
  const at::Tensor gd = g.detach(), ud = u.detach();
  const float* gp = gd.data_ptr<float>();
  const float* up = ud.data_ptr<float>();
  const float* dpp = dp.data_ptr<float>();
  const at::Tensor dg = Map(gd, [&](float, int64_t i) {
    float dgi, dui;
    fused::GatedBackward(a, gp[i], up[i], dpp[i], &dgi, &dui);
    return dgi;
  });
  const at::Tensor du = Map(gd, [&](float, int64_t i) {
    float dgi, dui;
    fused::GatedBackward(a, gp[i], up[i], dpp[i], &dgi, &dui);
    return dui;
  });
  EXPECT_TRUE(CloseAtScale(dg, grads[0]));
  EXPECT_TRUE(CloseAtScale(du, grads[1]));
}

TEST_P(FusedMathTest, GatedProductMatchesAtenWithBf16Inputs) {
  const GatedActivation a = GetParam();
  const at::Tensor g = Inputs(4096, 5).to(at::kBFloat16);
  const at::Tensor u = Inputs(4096, 6).to(at::kBFloat16);
  // HF's act_fn(gate) * up in bf16: act computed in fp32 and rounded to
  // bf16, then the product rounded again (what ATen's CUDA kernels do). The
  // activation is ATen's fp32 op on the same bf16 values: LibTorch 1.13's
  // CPU gelu-tanh on bf16 tensors loses precision in the tails (-0.00589
  // for -0.00346 at x = -3.016), which its CUDA kernels do not.
  const at::Tensor reference =
      (AtenActivation(g.to(at::kFloat), a).to(at::kBFloat16) * u).to(at::kFloat);
  const at::Tensor uf = u.to(at::kFloat);
  const float* up = uf.data_ptr<float>();
  const at::Tensor ours =
      Map(g, [&](float gv, int64_t i) { return fused::GatedForward(a, gv, up[i]); })
          .to(at::kBFloat16)
          .to(at::kFloat);
  EXPECT_TRUE(AllClose(ours, reference, kBf16Rtol, kBf16Atol));
}

INSTANTIATE_TEST_SUITE_P(Activations, FusedMathTest,
                         ::testing::Values(GatedActivation::kSilu, GatedActivation::kGeluTanh,
                                           GatedActivation::kGelu));

// RMSNorm's input gradient from the row formulas against autograd of HF's
// composite RMSNorm (x * rsqrt(mean(x^2) + eps) * scale), both norm kinds.
void CheckRmsNormInputGrad(bool one_plus) {
  constexpr int64_t kRows = 4, kWidth = 256;
  constexpr float kEps = 1e-6f;
  at::manual_seed(7);
  const at::Tensor x = at::randn({kRows, kWidth}).requires_grad_(true);
  const at::Tensor w = at::randn({kWidth}) * 0.1 + (one_plus ? 0.0 : 1.0);
  const at::Tensor dy = at::randn({kRows, kWidth});
  const at::Tensor scale = one_plus ? w + 1.0 : w;
  const at::Tensor y = x * at::rsqrt(x.pow(2).mean(-1, true) + kEps) * scale;
  const at::Tensor reference = torch::autograd::grad({y}, {x}, {dy})[0];

  const at::Tensor xd = x.detach();
  at::Tensor ours = at::empty_like(xd);
  for (int64_t row = 0; row < kRows; ++row) {
    const at::Tensor xr = xd[row], dyr = dy[row];
    const float r =
        fused::InverseRms(xr.pow(2).sum().item<float>(), static_cast<int>(kWidth), kEps);
    float dot = 0.0f;
    for (int64_t c = 0; c < kWidth; ++c) {
      dot += dyr[c].item<float>() * fused::NormScale(one_plus, w[c].item<float>()) *
             xr[c].item<float>() * r;
    }
    const float mean_gx = dot / static_cast<float>(kWidth);
    for (int64_t c = 0; c < kWidth; ++c) {
      ours[row][c] =
          fused::RmsNormInputGrad(xr[c].item<float>(), dyr[c].item<float>(),
                                  fused::NormScale(one_plus, w[c].item<float>()), r, mean_gx);
    }
  }
  // Row sums of 256 fp32 terms in different orders: ~sqrt(256) ulp of the
  // sum, so 1e-5 relative here rather than the elementwise 1e-6.
  EXPECT_TRUE(AllClose(ours, reference, 1e-5, 1e-6));
}

TEST(FusedRmsNormMathTest, InputGradMatchesAutogradForWeight) { CheckRmsNormInputGrad(false); }

TEST(FusedRmsNormMathTest, InputGradMatchesAutogradForOnePlusWeight) {
  CheckRmsNormInputGrad(true);
}

// The cross-entropy gradient from the row's log-sum-exp against autograd
// of ATen's cross_entropy_loss (sum, ignore_index -100) times a scale, the
// path the fused kernel replaces (Note [Fused cross-entropy]).
TEST(FusedCrossEntropyMathTest, GradientMatchesAutogradOfCrossEntropy) {
  constexpr int64_t kRows = 5, kVocab = 300;
  constexpr double kScale = 1.0 / 7.0;
  at::manual_seed(3);
  const at::Tensor logits = (at::randn({kRows, kVocab}) * 4.0).requires_grad_(true);
  const at::Tensor labels =
      at::tensor({int64_t{0}, int64_t{299}, fused::kIgnoreIndex, int64_t{17}, int64_t{150}});
  const at::Tensor loss =
      at::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum, fused::kIgnoreIndex);
  const at::Tensor reference = torch::autograd::grad({loss * kScale}, {logits})[0];

  const at::Tensor x = logits.detach();
  const at::Tensor lse = at::logsumexp(x, {1});
  at::Tensor ours = at::zeros_like(x);
  double loss_sum = 0.0;
  for (int64_t row = 0; row < kRows; ++row) {
    const int64_t label = labels[row].item<int64_t>();
    if (label == fused::kIgnoreIndex) continue;  // zero gradient, no loss
    const float l = lse[row].item<float>();
    loss_sum += l - x[row][label].item<float>();
    for (int64_t j = 0; j < kVocab; ++j) {
      ours[row][j] = fused::CrossEntropyGrad(x[row][j].item<float>(), l, j == label,
                                             static_cast<float>(kScale));
    }
  }
  EXPECT_TRUE(AllClose(ours, reference, 1e-5, 1e-8));
  EXPECT_TRUE(at::equal(ours[2], at::zeros({kVocab})));
  EXPECT_NEAR(loss_sum, loss.item<double>(), 1e-5 * loss.item<double>());
}

}  // namespace
}  // namespace megatrain::engine
