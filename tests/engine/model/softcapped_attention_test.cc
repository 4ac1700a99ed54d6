// SoftcappedAttention (Note [Soft-capped attention] in engine/model/layers.h)
// against a plain monolithic soft-capped attention that holds the whole
// [B, H, T, T] score matrix in fp32: forward and backward, fp32 and bf16,
// causal and with a sliding window, with blocks small enough that the
// sequence spans several of them (the last one partial).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "engine/model/layers.h"
#include "tests/testing/reference_llama.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::RelativeError;

constexpr int64_t kB = 2, kH = 3, kT = 64, kDh = 16;
constexpr double kScale = 0.25;  // 1 / sqrt(kDh)
constexpr double kCap = 2.0;     // scores have std ~1: the cap bends them

// cap * tanh(q k^T * scale / cap), masked causal (and to `window` keys),
// softmax, PV: all in fp32 from q, k, v's values (HF eager_attention_forward
// of Gemma 2 without its intermediate roundings). [B, H, T, Dh] fp32.
at::Tensor MonolithicAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               int64_t window) {
  at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * kScale;
  scores = kCap * at::tanh(scores / kCap);  // [B, H, T, T]
  at::Tensor qi = at::arange(kT).unsqueeze(1), ki = at::arange(kT).unsqueeze(0);
  at::Tensor allowed = ki <= qi;
  if (window > 0) allowed = allowed.logical_and(qi - ki < window);
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v.to(at::kFloat));
}

struct Result {
  at::Tensor out, grad_q, grad_k, grad_v;  // fp32
};

// Output and input gradients of `attention` on leaves of dtype `dtype`
// made from `q`, `k`, `v`, with upstream gradient `grad_out` (fp32).
template <typename Fn>
Result RunAttention(Fn attention, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& grad_out, at::ScalarType dtype) {
  at::Tensor ql = q.to(dtype).requires_grad_(true), kl = k.to(dtype).requires_grad_(true);
  at::Tensor vl = v.to(dtype).requires_grad_(true);
  at::Tensor out = attention(ql, kl, vl);
  out.backward(grad_out.to(out.scalar_type()));
  return {out.to(at::kFloat), ql.grad().to(at::kFloat), kl.grad().to(at::kFloat),
          vl.grad().to(at::kFloat)};
}

// Kept block graphs (a gradient follows and they fit) or a backward that
// recomputes each block (Note [Soft-capped attention]).
constexpr int64_t kKeepAll = int64_t{1} << 40, kRecompute = 0;

class SoftcappedAttentionTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t>> {};

TEST_P(SoftcappedAttentionTest, MatchesMonolithicAttentionOverSeveralBlocks) {
  const auto [dtype, window, max_kept_bytes] = GetParam();
  at::manual_seed(5);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh}), grad_out = at::randn({kB, kH, kT, kDh});
  // 10 queries per block: 7 blocks, the last of 4; with the window a block
  // reads only the keys [start - window + 1, start + 10).
  const int64_t chunk_bytes = 4 * kB * kH * kT * 10;
  Result ours = RunAttention(
      [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
        return SoftcappedAttention(a, b, c, kScale, kCap, window, chunk_bytes, max_kept_bytes);
      },
      q, k, v, grad_out, dtype);
  // The reference reads the same (rounded) inputs, in fp32 throughout.
  Result ref =
      RunAttention([&](const at::Tensor& a, const at::Tensor& b,
                       const at::Tensor& c) { return MonolithicAttention(a, b, c, window); },
                   q.to(dtype), k.to(dtype), v.to(dtype), grad_out, at::kFloat);
  // fp32: only the summation order differs (1e-5 relative, the project's
  // fp32 bound). bf16: scores, cap and PV in bf16 on our side (HF eager
  // rounding), 8-bit mantissas: the project's bf16 bound 2e-2.
  const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
  EXPECT_EQ(ours.out.sizes(), ref.out.sizes());
  EXPECT_LT(RelativeError(ours.out, ref.out), tolerance);
  EXPECT_LT(RelativeError(ours.grad_q, ref.grad_q), tolerance);
  EXPECT_LT(RelativeError(ours.grad_k, ref.grad_k), tolerance);
  EXPECT_LT(RelativeError(ours.grad_v, ref.grad_v), tolerance);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndWindows, SoftcappedAttentionTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(int64_t{0}, int64_t{9}),
                                            ::testing::Values(kKeepAll, kRecompute)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == at::kFloat ? "Fp32"
                                                                                    : "Bf16") +
                                  (std::get<1>(info.param) > 0 ? "SlidingWindow" : "Causal") +
                                  (std::get<2>(info.param) > 0 ? "KeptGraphs" : "Recomputed");
                         });

// The block size changes nothing but the summation order: one block and
// seven give the same output and gradients within fp32 rounding.
TEST(SoftcappedAttentionBlocksTest, OneBlockAndManyBlocksAgree) {
  at::manual_seed(6);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh}), grad_out = at::randn({kB, kH, kT, kDh});
  auto with_chunk = [&](int64_t chunk_bytes) {
    return RunAttention(
        [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
          return SoftcappedAttention(a, b, c, kScale, kCap, /*window=*/5, chunk_bytes, kRecompute);
        },
        q, k, v, grad_out, at::kFloat);
  };
  Result one = with_chunk(kAttentionChunkBytes), many = with_chunk(4 * kB * kH * kT * 3);
  EXPECT_LT(RelativeError(many.out, one.out), 1e-6);
  EXPECT_LT(RelativeError(many.grad_q, one.grad_q), 1e-6);
  EXPECT_LT(RelativeError(many.grad_k, one.grad_k), 1e-6);
  EXPECT_LT(RelativeError(many.grad_v, one.grad_v), 1e-6);
}

// Keeping the blocks' graphs changes where backward gets its intermediates,
// not what it computes: bit-identical outputs and gradients in fp32 and
// bf16, several blocks and one. A budget smaller than the graphs falls
// back to recomputation (also bit-identical).
TEST(SoftcappedAttentionBlocksTest, KeptGraphsAndRecomputationAreBitIdentical) {
  at::manual_seed(7);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh}), grad_out = at::randn({kB, kH, kT, kDh});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t chunk_bytes : {kAttentionChunkBytes, 4 * kB * kH * kT * 10}) {
      auto run = [&](int64_t max_kept_bytes) {
        return RunAttention(
            [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
              return SoftcappedAttention(a, b, c, kScale, kCap, /*window=*/9, chunk_bytes,
                                         max_kept_bytes);
            },
            q.clone(), k.clone(), v.clone(), grad_out, dtype);
      };
      Result kept = run(kKeepAll), recomputed = run(kRecompute), too_small = run(64);
      for (const Result* other : {&recomputed, &too_small}) {
        EXPECT_TRUE(at::equal(kept.out, other->out)) << dtype << " " << chunk_bytes;
        EXPECT_TRUE(at::equal(kept.grad_q, other->grad_q)) << dtype << " " << chunk_bytes;
        EXPECT_TRUE(at::equal(kept.grad_k, other->grad_k)) << dtype << " " << chunk_bytes;
        EXPECT_TRUE(at::equal(kept.grad_v, other->grad_v)) << dtype << " " << chunk_bytes;
      }
    }
  }
}

// HF Gemma 2's eager attention in its own order of roundings: matmul,
// * scaling, / softcap, tanh, * softcap, mask, softmax(dtype=float32) cast
// back, PV. With a power-of-two scale, SoftcappedAttention's single division
// by cap / scale must round identically: one block holding all T queries
// (so both sides reduce over the same keys) gives bit-identical outputs.
TEST(SoftcappedAttentionBlocksTest, PowerOfTwoScaleFoldRoundsAsHfEager) {
  at::manual_seed(8);
  constexpr double kFoldCap = 3.0;  // not a power of two: the division rounds
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor q = at::randn({kB, kH, kT, kDh}).to(dtype),
               k = at::randn({kB, kH, kT, kDh}).to(dtype);
    at::Tensor v = at::randn({kB, kH, kT, kDh}).to(dtype);
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * kScale;
    scores = at::tanh(scores / kFoldCap) * kFoldCap;
    at::Tensor qi = at::arange(kT).unsqueeze(1), ki = at::arange(kT).unsqueeze(0);
    scores = scores.masked_fill(ki > qi, -std::numeric_limits<double>::infinity());
    at::Tensor hf = at::matmul(at::softmax(scores, -1, at::kFloat).to(dtype), v);
    at::Tensor ours = SoftcappedAttention(q, k, v, kScale, kFoldCap, /*window=*/0,
                                          kAttentionChunkBytes, kRecompute);
    EXPECT_TRUE(at::equal(ours, hf)) << dtype;
  }
}

}  // namespace
}  // namespace megatrain::engine
