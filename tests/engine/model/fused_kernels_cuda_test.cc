// The fused kernels (engine/model/fused_kernels.cu, Note [Fused kernels] in
// engine/model/fused_math.h) on a CUDA device against the ATen path, on
// random inputs of llama-1b widths (C 2048, F 8192) and 2 x 2048 tokens:
// the gated product forward and backward (FusedGatedProduct, and GatedMlp
// with fused_kernels on, plain and chunked, against fused_kernels off), and
// residual add + RMSNorm forward and backward (both norm kinds; the raw
// launchers against ATen's composite ops, FusedAddRmsNorm against the
// layer's unfused path), and the rotary embedding (ApplyRotaryEmbedding
// with fused_kernels on against off: the same bits, Note [RoPE kernels]),
// the fp64 gradient norm, the head's fused cross-entropy (Note [Fused
// cross-entropy] in layers.cc) against ATen's and the one-pass bf16 ->
// fp32 gradient add (bit for bit).
// Built only in CUDA builds; skipped without a device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/model/fused_kernels.h"
#include "engine/model/fused_math.h"
#include "engine/model/fused_ops.h"
#include "engine/model/layers.h"

namespace megatrain::engine {
namespace {

constexpr int64_t kRows = 2 * 2048;  // B x T
constexpr int64_t kHidden = 2048;    // llama-1b C
constexpr int64_t kInter = 8192;     // llama-1b F
// bf16 outputs: both paths compute in fp32 and round to bf16; the ATen
// path rounds act(g) to bf16 before the product (and autograd rounds its
// intermediates), the fused one once, so they differ by up to about two
// bf16 steps (2^-8 relative each): 2e-2 relative.
constexpr double kBf16Rtol = 2e-2;
constexpr double kBf16Atol = 2e-2;

bool HasCuda() { return at::hasCUDA(); }

at::Tensor RandnBf16(std::vector<int64_t> shape, double scale = 1.0) {
  return (at::randn(shape, at::TensorOptions().device(at::kCUDA)) * scale).to(at::kBFloat16);
}

// Fraction of elements outside the tolerance: a rounding flip can put a
// few single elements past it; a wrong formula puts most of them there.
double MismatchFraction(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  const at::Tensor bad = (af - bf).abs() > (bf.abs() * rtol + atol);
  return bad.to(at::kFloat).mean().item<double>();
}

// At most 1e-4 of the elements may sit past the bf16 tolerance (values near
// 0 after cancellation in the product's gradient).
constexpr double kMaxMismatch = 1e-4;

class FusedGatedCudaTest : public ::testing::TestWithParam<MlpActivation> {};

TEST_P(FusedGatedCudaTest, ForwardAndBackwardMatchAtenWhenLlama1bWidths) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(11);
  const MlpActivation a = GetParam();
  const at::Tensor g = RandnBf16({kRows, kInter}, 2.0).requires_grad_(true);
  const at::Tensor u = RandnBf16({kRows, kInter}).requires_grad_(true);
  const at::Tensor dp = RandnBf16({kRows, kInter});
  ASSERT_TRUE(FusedGatedProductApplies(g, u));

  const at::Tensor p = FusedGatedProduct(g, u, a);
  const auto grads = torch::autograd::grad({p}, {g, u}, {dp});
  at::Tensor act;
  switch (a) {
    case MlpActivation::kSilu:
      act = at::silu(g);
      break;
    case MlpActivation::kGeluTanh:
      act = at::gelu(g, "tanh");
      break;
    case MlpActivation::kGelu:
      act = at::gelu(g);
      break;
  }
  const at::Tensor ref = act * u;
  const auto ref_grads = torch::autograd::grad({ref}, {g, u}, {dp});

  EXPECT_LE(MismatchFraction(p, ref, kBf16Rtol, kBf16Atol), kMaxMismatch);
  EXPECT_LE(MismatchFraction(grads[0], ref_grads[0], kBf16Rtol, kBf16Atol), kMaxMismatch);
  EXPECT_LE(MismatchFraction(grads[1], ref_grads[1], kBf16Rtol, kBf16Atol), kMaxMismatch);
}

// Norm-relative difference ||a - b|| / ||b||, in fp32.
double NormRelative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  return ((af - bf).norm() / bf.norm()).item<double>();
}

// The layer's outputs and gradients with the fused product against the
// unfused bf16 path, both measured against the same layer in fp32 (the
// reference arithmetic). The weight gradient sums 4,096 rows of products,
// so its elements near 0 carry an absolute rounding noise of about
// sqrt(rows) bf16 steps that no element-wise tolerance separates from a
// wrong formula: the comparison is norm-relative (the project's bf16
// bound, 2e-2), and the fused path may not be less exact than the unfused
// one by more than half again.
TEST_P(FusedGatedCudaTest, GatedMlpMatchesUnfusedWhenPlainAndChunked) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(12);
  const MlpActivation a = GetParam();
  const at::Tensor x = RandnBf16({kRows, kHidden});
  const at::Tensor gate = RandnBf16({kInter, kHidden}, 0.02);
  const at::Tensor up = RandnBf16({kInter, kHidden}, 0.02);
  const at::Tensor down = RandnBf16({kHidden, kInter}, 0.02);
  const at::Tensor dy = RandnBf16({kRows, kHidden});
  // Plain, and chunked into 4 chunks of rows (Note [Chunked MLP]).
  for (const int64_t chunk_bytes : {kMlpChunkBytes, kRows / 4 * kInter * 2}) {
    // Runs 0 (unfused bf16), 1 (fused bf16), 2 (unfused fp32 reference).
    std::vector<at::Tensor> outs, dxs, dgates;
    for (const int run : {0, 1, 2}) {
      const at::ScalarType dtype = run == 2 ? at::kFloat : at::kBFloat16;
      const at::Tensor xl = x.to(dtype).requires_grad_(true);
      const at::Tensor gl = gate.to(dtype).requires_grad_(true);
      const at::Tensor y = GatedMlp(xl, gl, up.to(dtype), down.to(dtype), a, chunk_bytes,
                                    /*fused_kernels=*/run == 1);
      const auto grads = torch::autograd::grad({y}, {xl, gl}, {dy.to(dtype)});
      outs.push_back(y);
      dxs.push_back(grads[0]);
      dgates.push_back(grads[1]);
    }
    for (const auto* t : {&outs, &dxs, &dgates}) {
      const double fused_error = NormRelative((*t)[1], (*t)[2]);
      const double unfused_error = NormRelative((*t)[0], (*t)[2]);
      EXPECT_LE(fused_error, kBf16Rtol);
      EXPECT_LE(fused_error, 1.5 * unfused_error + 1e-4)
          << "unfused bf16 error " << unfused_error << " (chunk bytes " << chunk_bytes << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, FusedGatedCudaTest,
                         ::testing::Values(MlpActivation::kSilu, MlpActivation::kGeluTanh,
                                           MlpActivation::kGelu));

const __nv_bfloat16* Bf16(const at::Tensor& t) {
  return reinterpret_cast<const __nv_bfloat16*>(t.data_ptr());
}
__nv_bfloat16* Bf16Out(const at::Tensor& t) {
  return reinterpret_cast<__nv_bfloat16*>(t.data_ptr());
}

// Residual add + RMSNorm against ATen's composite ops (the engine's
// RmsNorm: fp32 statistics, weight in fp32, output rounded to bf16), and
// its backward against autograd of the same, with the residual gradient.
void CheckAddRmsNorm(bool one_plus) {
  at::manual_seed(13);
  constexpr float kEps = 1e-5f;
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor residual = at::randn({kRows, kHidden}, f32).requires_grad_(true);
  const at::Tensor delta = RandnBf16({kRows, kHidden}).requires_grad_(true);
  const at::Tensor weight = (RandnBf16({kHidden}, 0.1).to(at::kFloat) + (one_plus ? 0.0 : 1.0))
                                .to(at::kBFloat16)
                                .requires_grad_(true);
  const at::Tensor d_normed = RandnBf16({kRows, kHidden});
  const at::Tensor d_hidden_later = at::randn({kRows, kHidden}, f32);

  // Reference: hidden = residual + delta; normed = (hidden * r * scale).bf16.
  const at::Tensor hidden_ref = residual + delta;
  const at::Tensor scale = one_plus ? weight.to(at::kFloat) + 1.0 : weight.to(at::kFloat);
  const at::Tensor normed_ref =
      (hidden_ref * at::rsqrt(hidden_ref.pow(2).mean(-1, true) + kEps) * scale).to(at::kBFloat16);
  // The residual's total gradient: through the norm and from later layers.
  const auto ref = torch::autograd::grad({normed_ref, hidden_ref}, {residual, weight},
                                         {d_normed, d_hidden_later});

  at::Tensor hidden = at::empty({kRows, kHidden}, f32);
  at::Tensor normed = at::empty({kRows, kHidden}, f32.dtype(at::kBFloat16));
  at::Tensor inv_rms = at::empty({kRows}, f32);
  const at::Tensor res = residual.detach(), del = delta.detach(), w = weight.detach();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  ASSERT_EQ(fused::LaunchAddRmsNormForward(
                res.data_ptr<float>(), Bf16(del), Bf16(w), hidden.data_ptr<float>(),
                Bf16Out(normed), inv_rms.data_ptr<float>(), kRows, kHidden, kEps, one_plus, stream),
            cudaSuccess);
  const int64_t blocks = fused::FusedRmsNormBackwardBlocks(kRows);
  at::Tensor d_hidden = at::empty({kRows, kHidden}, f32);
  at::Tensor partial = at::empty({blocks, kHidden}, f32);
  ASSERT_EQ(fused::LaunchAddRmsNormBackward(
                hidden.data_ptr<float>(), inv_rms.data_ptr<float>(), Bf16(d_normed),
                d_hidden_later.data_ptr<float>(), Bf16(w), d_hidden.data_ptr<float>(),
                partial.data_ptr<float>(), kRows, kHidden, one_plus, stream),
            cudaSuccess);

  // hidden: one fp32 add each side, bit for bit.
  EXPECT_TRUE(at::equal(hidden, hidden_ref.detach()));
  EXPECT_LE(MismatchFraction(normed, normed_ref, kBf16Rtol, kBf16Atol), kMaxMismatch);
  // fp32 row sums in another order: 1e-4 relative over 2048 terms.
  EXPECT_TRUE(at::allclose(d_hidden, ref[0], 1e-4, 1e-5));
  // The weight gradient: 4096 rows summed in fp32 in another order; the
  // reference rounds it to bf16 (weight's dtype), hence bf16's tolerance.
  EXPECT_TRUE(at::allclose(partial.sum(0), ref[1].to(at::kFloat), kBf16Rtol, 1e-2));
}

TEST(FusedAddRmsNormCudaTest, MatchesAtenWhenWeightScale) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckAddRmsNorm(/*one_plus=*/false);
}

TEST(FusedAddRmsNormCudaTest, MatchesAtenWhenOnePlusWeightScale) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckAddRmsNorm(/*one_plus=*/true);
}

// FusedAddRmsNorm (the autograd function DecoderLayerForward uses with
// fused_kernels) against the layer's unfused path: x + delta, RmsNorm, cast.
void CheckFusedAddRmsNormAutograd(NormKind kind) {
  at::manual_seed(14);
  constexpr double kEps = 1e-5;
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor x = at::randn({2, 2048, kHidden}, f32);
  const at::Tensor delta = RandnBf16({2, 2048, kHidden});
  const at::Tensor weight =
      (RandnBf16({kHidden}, 0.1).to(at::kFloat) + (kind == NormKind::kRms ? 1.0 : 0.0))
          .to(at::kBFloat16);
  const at::Tensor d_hidden = at::randn({2, 2048, kHidden}, f32);
  const at::Tensor d_normed = RandnBf16({2, 2048, kHidden});
  std::vector<std::vector<at::Tensor>> results;
  for (const bool fused : {false, true}) {
    const at::Tensor xl = x.clone().requires_grad_(true);
    const at::Tensor dl = delta.clone().requires_grad_(true);
    const at::Tensor wl = weight.clone().requires_grad_(true);
    at::Tensor hidden, normed;
    if (fused) {
      ASSERT_TRUE(FusedAddRmsNormApplies(xl, dl, wl));
      std::tie(hidden, normed) = FusedAddRmsNorm(xl, dl, wl, kEps, kind);
    } else {
      hidden = xl + dl;
      normed = RmsNorm(hidden, wl, kEps, kind).to(at::kBFloat16);
    }
    auto grads = torch::autograd::grad({hidden, normed}, {xl, dl, wl}, {d_hidden, d_normed});
    results.push_back({hidden, normed, grads[0], grads[1], grads[2]});
  }
  EXPECT_TRUE(at::equal(results[1][0], results[0][0]));  // one fp32 add each
  EXPECT_LE(MismatchFraction(results[1][1], results[0][1], kBf16Rtol, kBf16Atol), kMaxMismatch);
  // fp32 row reductions in another order: 1e-4 relative.
  EXPECT_TRUE(at::allclose(results[1][2], results[0][2], 1e-4, 1e-5));
  EXPECT_LE(MismatchFraction(results[1][3], results[0][3], kBf16Rtol, kBf16Atol), kMaxMismatch);
  EXPECT_LE(MismatchFraction(results[1][4], results[0][4], kBf16Rtol, 1e-2), 0.0);
}

TEST(FusedAddRmsNormCudaTest, AutogradMatchesLayerPathWhenRmsNorm) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckFusedAddRmsNormAutograd(NormKind::kRms);
}

TEST(FusedAddRmsNormCudaTest, AutogradMatchesLayerPathWhenOnePlusWeight) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckFusedAddRmsNormAutograd(NormKind::kRmsOnePlusWeight);
}

// ApplyRotaryEmbedding with and without the fused kernel, forward and
// backward, on x [B, T, heads, Dh] (made by `make_x`, possibly a strided
// view), tables [T, Dr] or per token [B, T, Dr]. The kernel computes the
// ATen composite's roundings in its order: equal bit for bit.
void CheckRotaryFusedEqualsAten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor grad_y = at::randn(x.sizes(), x.options());  // dL/dy, contiguous
  std::vector<at::Tensor> results[2];
  for (bool fused : {false, true}) {
    at::Tensor leaf = x.detach().requires_grad_(true);
    at::Tensor y = ApplyRotaryEmbedding(leaf, cos, sin, fused);
    // The gradient arrives as a transposed view, as from attention.
    const at::Tensor g = grad_y.transpose(1, 2).contiguous().transpose(1, 2);
    at::Tensor gx = torch::autograd::grad({y}, {leaf}, {g})[0];
    results[fused ? 1 : 0] = {y, gx};
  }
  EXPECT_TRUE(at::equal(results[1][0], results[0][0])) << "forward";
  EXPECT_TRUE(at::equal(results[1][1], results[0][1])) << "backward";
}

at::Tensor Table(std::vector<int64_t> shape) {
  return at::randn(shape, at::TensorOptions().device(at::kCUDA));  // fp32
}

TEST(FusedRotaryCudaTest, EqualsAtenBitForBitWhenBf16Llama1bShape) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  // llama-1b: 32 query heads of 64; 2 x 2048 tokens.
  CheckRotaryFusedEqualsAten(RandnBf16({2, 2048, 32, 64}), Table({2048, 64}), Table({2048, 64}));
}

TEST(FusedRotaryCudaTest, EqualsAtenBitForBitWhenPartialRotaryAndPerTokenTables) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  // Phi-3's partial rotary (Dr < Dh) with packed documents' per-token tables.
  CheckRotaryFusedEqualsAten(RandnBf16({2, 96, 4, 48}), Table({2, 96, 32}), Table({2, 96, 32}));
}

TEST(FusedRotaryCudaTest, EqualsAtenBitForBitWhenFp32AndStridedInput) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  // A strided view [B, T, heads, Dh] of a [B, heads, T, Dh] tensor.
  const at::Tensor x = at::randn({2, 8, 80, 64}, at::TensorOptions().device(at::kCUDA));
  CheckRotaryFusedEqualsAten(x.transpose(1, 2), Table({80, 64}), Table({80, 64}));
}

TEST(FusedNormFp64CudaTest, MatchesAtenFp64NormAndRepeatsBitForBit) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  // A llama-1b layer's gradient size plus a ragged tail, and tiny sizes.
  for (int64_t n : {int64_t{60'817'411}, int64_t{1}, int64_t{0}, int64_t{1000}}) {
    const at::Tensor x = at::randn({n}, at::TensorOptions().device(at::kCUDA)) * 1e-3;
    const at::Tensor fused = FusedNormFp64(x);
    const at::Tensor aten = at::linalg_vector_norm(x, 2, c10::nullopt, false, at::kDouble);
    ASSERT_EQ(fused.scalar_type(), at::kDouble);
    ASSERT_EQ(fused.dim(), 0);
    // Both sum exact fp64 squares, in another order: fp64 rounding only.
    EXPECT_NEAR(fused.item<double>(), aten.item<double>(), 1e-13 * aten.item<double>()) << n;
    EXPECT_TRUE(at::equal(FusedNormFp64(x), fused)) << "not deterministic at n = " << n;
  }
}

// ATen's chunk loss and bf16 logits gradient: cross_entropy_loss (sum,
// ignore -100) of the widened logits, autograd back to the bf16 logits.
std::pair<double, at::Tensor> AtenCrossEntropy(const at::Tensor& logits_bf16,
                                               const at::Tensor& labels, double scale) {
  const at::Tensor leaf = logits_bf16.detach().requires_grad_(true);
  const at::Tensor loss = at::cross_entropy_loss(leaf.to(at::kFloat), labels, {},
                                                 at::Reduction::Sum, fused::kIgnoreIndex);
  const at::Tensor grad = torch::autograd::grad({loss * scale}, {leaf})[0];
  return {loss.item<double>(), grad};
}

// Labels in [0, vocab) with every fifth row ignored (-100).
at::Tensor LabelsWithIgnored(int64_t rows, int64_t vocab) {
  at::Tensor labels = at::randint(vocab, {rows}, at::TensorOptions().dtype(at::kLong));
  labels.slice(0, 0, rows, 5).fill_(fused::kIgnoreIndex);
  return labels.to(at::kCUDA);
}

// The fused cross-entropy (Note [Fused cross-entropy]) against ATen's: the
// loss within fp32 summation rounding, the bf16 gradient within a bf16
// step except for rare rounding flips, ignored rows exactly zero, and the
// same bits on a second run. `vocab` % 8 != 0 takes the scalar path.
void CheckCrossEntropy(int64_t rows, int64_t vocab) {
  at::manual_seed(21);
  const double scale = 1.0 / static_cast<double>(rows);
  const at::Tensor logits = RandnBf16({rows, vocab}, 3.0);
  const at::Tensor labels = LabelsWithIgnored(rows, vocab);
  const auto [aten_loss, aten_grad] = AtenCrossEntropy(logits, labels, scale);

  at::Tensor fused_grad = logits.clone();
  const at::Tensor row_loss = FusedCrossEntropyInPlace(fused_grad, labels, scale);
  ASSERT_EQ(row_loss.scalar_type(), at::kFloat);
  ASSERT_EQ(row_loss.size(0), rows);
  EXPECT_NEAR(row_loss.sum(at::kDouble).item<double>(), aten_loss, 1e-5 * aten_loss);
  const at::Tensor ignored = labels == fused::kIgnoreIndex;
  EXPECT_TRUE(at::equal(row_loss.masked_select(ignored),
                        at::zeros({ignored.sum().item<int64_t>()}, row_loss.options())));
  EXPECT_EQ(fused_grad.index({ignored}).abs().max().item<float>(), 0.0f);
  // Gradient elements are scale * (p - target); 1e-3 of the largest
  // magnitude absolute keeps the comparison to the elements that matter.
  const double atol = 1e-3 * aten_grad.abs().max().item<double>();
  EXPECT_LE(MismatchFraction(fused_grad, aten_grad, kBf16Rtol, atol), kMaxMismatch);
  // The row sums of the gradient are scale * (1 - 1) = 0 up to rounding.
  const at::Tensor row_sums = fused_grad.to(at::kFloat).sum(1);
  EXPECT_LT(row_sums.abs().max().item<double>(), 1e-2 * scale);

  at::Tensor again = logits.clone();
  const at::Tensor again_loss = FusedCrossEntropyInPlace(again, labels, scale);
  EXPECT_TRUE(at::equal(again, fused_grad)) << "gradient not deterministic";
  EXPECT_TRUE(at::equal(again_loss, row_loss)) << "loss not deterministic";
}

TEST(FusedCrossEntropyCudaTest, MatchesAtenWhenLlama3Vocabulary) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckCrossEntropy(256, 128256);  // Llama 3's vocabulary: 8-wide vectors
}

TEST(FusedCrossEntropyCudaTest, MatchesAtenWhenVocabularyNotAMultipleOf8) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  CheckCrossEntropy(97, 32001);  // scalar loads
}

TEST(FusedCrossEntropyCudaTest, LabelOutOfRangeGivesNanLoss) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  at::Tensor logits = RandnBf16({3, 64});
  const at::Tensor labels = at::tensor({int64_t{1}, int64_t{64}, int64_t{-5}},
                                       at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  const at::Tensor row_loss = FusedCrossEntropyInPlace(logits, labels, 1.0).cpu();
  EXPECT_TRUE(std::isfinite(row_loss[0].item<float>()));
  EXPECT_TRUE(std::isnan(row_loss[1].item<float>()));
  EXPECT_TRUE(std::isnan(row_loss[2].item<float>()));
}

// The whole head (final norm, lm_head, loss and their backward) with the
// fused cross-entropy against fused_kernels off, over several chunks.
TEST(FusedCrossEntropyCudaTest, HeadForwardBackwardMatchesUnfused) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(5);
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 4096;
  c.hidden_size = 256;
  c.rms_norm_eps = 1e-5;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor hidden = at::randn({2, 300, c.hidden_size}, cuda);
  const at::Tensor labels = LabelsWithIgnored(600, c.vocab_size).view({2, 300});
  const at::Tensor norm =
      (at::ones({c.hidden_size}, cuda) + at::randn({c.hidden_size}, cuda) * 0.1).to(at::kBFloat16);
  const at::Tensor lm_head = RandnBf16({c.vocab_size, c.hidden_size}, 0.05);
  const double scale = 1.0 / 480.0;
  const HeadResult off = HeadForwardBackward(c, hidden, labels, norm, lm_head, scale,
                                             /*chunk_tokens=*/128, at::kBFloat16, false);
  const HeadResult on =
      HeadForwardBackward(c, hidden, labels, norm, lm_head, scale, 128, at::kBFloat16, true);
  const double loss_off = off.loss_sum.item<double>();
  EXPECT_NEAR(on.loss_sum.item<double>(), loss_off, 1e-5 * loss_off);
  for (const auto& [name, a, b] : {std::tuple{"grad_hidden", on.grad_hidden, off.grad_hidden},
                                   std::tuple{"grad_norm", on.grad_norm, off.grad_norm},
                                   std::tuple{"grad_lm_head", on.grad_lm_head, off.grad_lm_head}}) {
    const double atol = 1e-3 * b.abs().max().item<double>();
    EXPECT_LE(MismatchFraction(a, b, kBf16Rtol, atol), 1e-3) << name;
  }
}

// The one-pass accumulation (Note [One-pass accumulation]) equals ATen's
// add_(src.to(float)) bit for bit: aligned (vector path) and offset by one
// element with an odd length (scalar path).
TEST(FusedAddBf16IntoFp32CudaTest, EqualsAtenAddBitForBit) {
  if (!HasCuda()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(9);
  for (const auto& [offset, n] :
       {std::pair<int64_t, int64_t>{0, 8'390'656}, std::pair<int64_t, int64_t>{1, 1'000'003},
        std::pair<int64_t, int64_t>{0, 5}}) {
    const at::Tensor base = at::randn({offset + n}, at::TensorOptions().device(at::kCUDA));
    const at::Tensor src = RandnBf16({offset + n}, 1e-2).narrow(0, offset, n);
    at::Tensor expected = base.narrow(0, offset, n).clone();
    expected.add_(src.to(at::kFloat));
    at::Tensor dst_storage = base.clone();
    const at::Tensor dst = dst_storage.narrow(0, offset, n);
    ASSERT_TRUE(FusedAddIntoFp32Applies(dst, src));
    FusedAddBf16IntoFp32(dst, src);
    EXPECT_TRUE(at::equal(dst, expected)) << "offset " << offset << ", n " << n;
    if (offset > 0) {
      EXPECT_TRUE(at::equal(dst_storage.narrow(0, 0, offset), base.narrow(0, 0, offset)))
          << "wrote before the view";
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
