// SoftcappedAttention (Note [Soft-capped attention] in engine/model/layers.h)
// against a plain monolithic soft-capped attention that holds the whole
// [B, H, T, T] score matrix in fp32: forward and backward, fp32 and bf16,
// causal and with a sliding window, with blocks small enough that the
// sequence spans several of them (the last one partial).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
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

// HF Gemma 2's eager attention in its own order of roundings, over the
// whole [B, H, T, T] matrix in q's dtype: matmul, * scaling, / softcap,
// tanh, * softcap, mask, softmax(dtype=float32) cast back, PV. Under
// autograd its backward is the one SoftcappedAttention's replaced.
at::Tensor HfEagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, double cap, int64_t window) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  scores = at::tanh(scores / cap) * cap;
  const int64_t t = q.size(2);
  at::Tensor qi = at::arange(t).unsqueeze(1), ki = at::arange(t).unsqueeze(0);
  at::Tensor blocked = ki > qi;
  if (window > 0) blocked = blocked.logical_or(qi - ki >= window);
  scores = scores.masked_fill(blocked, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
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
    at::Tensor hf = HfEagerAttention(q, k, v, kScale, kFoldCap, /*window=*/0);
    at::Tensor ours = SoftcappedAttention(q, k, v, kScale, kFoldCap, /*window=*/0,
                                          kAttentionChunkBytes, kRecompute);
    EXPECT_TRUE(at::equal(ours, hf)) << dtype;
  }
}

// Note [Soft-capped attention backward]: the hand-written backward against
// autograd over HF's eager ops in the same dtype (what SoftcappedAttention
// differentiated before) and against the fp32 monolithic reference, over
// dtypes, windows (none, one key: every query sees only itself, and 9),
// kept or recomputed intermediates, blocks of 1 query, 10 queries (the last
// block partial) and all T, and a power-of-two scale (the folded division)
// or not (1 / sqrt(24), Gemma 2's query_pre_attn_scalar form).
class SoftcappedAttentionBackwardTest
    : public ::testing::TestWithParam<
          std::tuple<at::ScalarType, int64_t, int64_t, int64_t, double>> {};

TEST_P(SoftcappedAttentionBackwardTest, MatchesAutogradOfHfEagerOps) {
  const auto [dtype, window, max_kept_bytes, queries_per_block, scale] = GetParam();
  at::manual_seed(11);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh}), grad_out = at::randn({kB, kH, kT, kDh});
  const int64_t chunk_bytes = 4 * kB * kH * kT * queries_per_block;
  Result ours = RunAttention(
      [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
        return SoftcappedAttention(a, b, c, scale, kCap, window, chunk_bytes, max_kept_bytes);
      },
      q, k, v, grad_out, dtype);
  Result autograd = RunAttention(
      [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
        return HfEagerAttention(a, b, c, scale, kCap, window);
      },
      q, k, v, grad_out, dtype);
  Result exact = RunAttention(
      [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
        return HfEagerAttention(a, b, c, scale, kCap, window);
      },
      q.to(dtype), k.to(dtype), v.to(dtype), grad_out, at::kFloat);
  // The forward rounds as HF's (the softmax reduces over fewer keys, in
  // another order: not bit for bit).
  EXPECT_LT(RelativeError(ours.out, autograd.out), dtype == at::kFloat ? 1e-6 : 1e-2);
  // Errors relative to the reference gradient's norm, or to dV's where the
  // reference is exactly zero (window 1: every query sees only itself, so
  // dS, dQ and dK vanish; bf16 rounding leaves ours a residue).
  const double dv_norm = exact.grad_v.norm().item<double>();
  auto error = [&](const at::Tensor& a, const at::Tensor& b) {
    const double ref = b.to(at::kDouble).norm().item<double>();
    const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
    return diff / (ref > 0 ? ref : dv_norm);
  };
  const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
  const std::vector<std::tuple<const char*, at::Tensor, at::Tensor, at::Tensor>> grads = {
      {"dQ", ours.grad_q, autograd.grad_q, exact.grad_q},
      {"dK", ours.grad_k, autograd.grad_k, exact.grad_k},
      {"dV", ours.grad_v, autograd.grad_v, exact.grad_v}};
  for (const auto& [name, mine, theirs, fp32] : grads) {
    const double ours_error = error(mine, fp32), autograd_error = error(theirs, fp32);
    EXPECT_LT(error(mine, theirs), tolerance) << name;
    EXPECT_LT(ours_error, tolerance) << name;
    // bf16: about as far from the fp32 gradients as autograd's roundings
    // (measured: at most 1.25x; ours round three times per score and
    // autograd four, but rowsum(dO * O) reads the rounded output where
    // autograd's rowsum(dP * P) cancels dP's own rounding). Not with blocks
    // of one query: this CPU's bf16 matmul of a single row rounds the
    // forward's output twice as coarsely (0.005 against 0.0025, the same
    // before this backward), and O enters the gradient through the rowsum.
    // Nor where the reference is zero (window 1), autograd's being exact.
    if (dtype == at::kBFloat16 && queries_per_block > 1 && autograd_error > 0) {
      EXPECT_LT(ours_error, 1.5 * autograd_error) << name << " autograd's " << autograd_error;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WindowsBlocksAndScales, SoftcappedAttentionBackwardTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{9}),
                                            ::testing::Values(kKeepAll, kRecompute),
                                            ::testing::Values(int64_t{1}, int64_t{10}, kT),
                                            ::testing::Values(kScale, 1.0 / std::sqrt(24.0))),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == at::kFloat ? "Fp32"
                                                                                    : "Bf16") +
                                  "Window" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) > 0 ? "Kept" : "Recomputed") + "Blocks" +
                                  std::to_string(std::get<3>(info.param)) +
                                  (std::get<4>(info.param) == kScale ? "Pow2Scale" : "OtherScale");
                         });

// Padding: queries whose upstream gradient is zero (labels -100 give them
// none) get a zero dQ exactly (dP and rowsum(dO * O) are zero on their
// rows) and add nothing to dK and dV; the others match autograd's.
TEST(SoftcappedAttentionGradientTest, PaddedQueriesGetNoGradient) {
  at::manual_seed(12);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh}), grad_out = at::randn({kB, kH, kT, kDh});
  grad_out.narrow(2, 0, 3).zero_();                // left padding
  grad_out.narrow(2, kT - 17, 17).zero_();         // right padding, across a block boundary
  grad_out.select(0, 1).narrow(1, 20, 5).zero_();  // one sequence's gap
  for (const int64_t max_kept_bytes : {kKeepAll, kRecompute}) {
    Result ours = RunAttention(
        [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
          return SoftcappedAttention(a, b, c, kScale, kCap, /*window=*/9, 4 * kB * kH * kT * 10,
                                     max_kept_bytes);
        },
        q, k, v, grad_out, at::kFloat);
    Result autograd = RunAttention(
        [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
          return HfEagerAttention(a, b, c, kScale, kCap, /*window=*/9);
        },
        q, k, v, grad_out, at::kFloat);
    EXPECT_EQ(ours.grad_q.narrow(2, 0, 3).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(ours.grad_q.narrow(2, kT - 17, 17).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(ours.grad_q.select(0, 1).narrow(1, 20, 5).abs().max().item<float>(), 0.0f);
    // Keys only the right padding sees (the last 17, window 9) get nothing.
    EXPECT_EQ(ours.grad_k.narrow(2, kT - 8, 8).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(ours.grad_v.narrow(2, kT - 8, 8).abs().max().item<float>(), 0.0f);
    EXPECT_LT(RelativeError(ours.grad_q, autograd.grad_q), 1e-5);
    EXPECT_LT(RelativeError(ours.grad_k, autograd.grad_k), 1e-5);
    EXPECT_LT(RelativeError(ours.grad_v, autograd.grad_v), 1e-5);
  }
}

// Gradient accumulation: two micro-batches' backwards into the same leaves
// (one with kept intermediates, one recomputed) sum as autograd's do; a
// retained graph's second backward (its kept intermediates are used up by
// the first, so it recomputes them) adds exactly the same gradient again.
TEST(SoftcappedAttentionGradientTest, AccumulatesOverMicroBatchesAndRetainedGraphs) {
  at::manual_seed(13);
  at::Tensor q = at::randn({kB, kH, kT, kDh}), k = at::randn({kB, kH, kT, kDh});
  at::Tensor v = at::randn({kB, kH, kT, kDh});
  at::Tensor grad_a = at::randn({kB, kH, kT, kDh}), grad_b = at::randn({kB, kH, kT, kDh});
  const int64_t chunk_bytes = 4 * kB * kH * kT * 10;
  auto leaves = [&] {
    return std::vector<at::Tensor>{q.clone().requires_grad_(true), k.clone().requires_grad_(true),
                                   v.clone().requires_grad_(true)};
  };
  std::vector<at::Tensor> ours = leaves(), autograd = leaves();
  SoftcappedAttention(ours[0], ours[1], ours[2], kScale, kCap, 9, chunk_bytes, kKeepAll)
      .backward(grad_a);
  SoftcappedAttention(ours[0], ours[1], ours[2], kScale, kCap, 9, chunk_bytes, kRecompute)
      .backward(grad_b);
  for (const at::Tensor& grad : {grad_a, grad_b}) {
    HfEagerAttention(autograd[0], autograd[1], autograd[2], kScale, kCap, 9).backward(grad);
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(RelativeError(ours[i].grad(), autograd[i].grad()), 1e-5) << i;
  }
  std::vector<at::Tensor> retained = leaves();
  at::Tensor out = SoftcappedAttention(retained[0], retained[1], retained[2], kScale, kCap, 9,
                                       chunk_bytes, kKeepAll);
  out.backward(grad_a, /*retain_graph=*/true);
  std::vector<at::Tensor> once;
  for (const at::Tensor& leaf : retained) once.push_back(leaf.grad().clone());
  out.backward(grad_a);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(retained[i].grad(), once[i] * 2)) << i;
}

}  // namespace
}  // namespace megatrain::engine
