// GatedMlp (Note [Chunked MLP] in engine/model/layers.h) in chunks of rows
// against the plain monolithic ops (HF LlamaMLP: down(act(gate(x)) *
// up(x)) on the whole [B, T, F]): forward and backward (x and the three
// weights, with the gate and up weights as row views of one fused
// parameter as for Phi-3), fp32 and bf16, every MLP activation, chunks
// that divide the rows and a partial last one; and the chunk-size rule.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "engine/model/layers.h"
#include "tests/testing/reference_llama.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::RelativeError;

constexpr int64_t kB = 2, kT = 9, kC = 24, kF = 40;  // 18 rows

struct Result {
  at::Tensor out, grad_x, grad_gate_up, grad_down;  // fp32
};

// The plain HF expression, whatever the size.
at::Tensor MonolithicMlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                         const at::Tensor& down, MlpActivation a) {
  at::Tensor g = at::linear(x, gate);
  g = a == MlpActivation::kSilu       ? at::silu(g)
      : a == MlpActivation::kGeluTanh ? at::gelu(g, "tanh")
                                      : at::gelu(g);
  return at::linear(g * at::linear(x, up), down);
}

// Output and gradients of `mlp` on leaves of `dtype` made from the fp32
// inputs; gate and up are the two halves of one fused [2F, C] leaf.
template <typename Fn>
Result RunMlp(Fn mlp, const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down,
              const at::Tensor& grad_out, at::ScalarType dtype) {
  at::Tensor xl = x.to(dtype).requires_grad_(true);
  at::Tensor gul = gate_up.to(dtype).requires_grad_(true);
  at::Tensor dl = down.to(dtype).requires_grad_(true);
  at::Tensor out = mlp(xl, gul.narrow(0, 0, kF), gul.narrow(0, kF, kF), dl);
  out.backward(grad_out.to(out.scalar_type()));
  return {out.to(at::kFloat), xl.grad().to(at::kFloat), gul.grad().to(at::kFloat),
          dl.grad().to(at::kFloat)};
}

class ChunkedMlpTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, MlpActivation, int64_t>> {};

TEST_P(ChunkedMlpTest, MatchesTheMonolithicMlp) {
  const auto [dtype, activation, chunk_rows] = GetParam();
  at::manual_seed(5);
  const at::Tensor x = at::randn({kB, kT, kC});
  const at::Tensor gate_up = at::randn({2 * kF, kC}) * 0.2;
  const at::Tensor down = at::randn({kC, kF}) * 0.2;
  const at::Tensor grad_out = at::randn({kB, kT, kC});
  const int64_t esize = dtype == at::kBFloat16 ? 2 : 4;
  const int64_t chunk_bytes = chunk_rows * kF * esize;  // exactly chunk_rows rows
  ASSERT_EQ(MlpChunkRows(kB * kT, kF, esize, chunk_bytes), chunk_rows);
  Result chunked =
      RunMlp([&](const at::Tensor& xl, const at::Tensor& g, const at::Tensor& u,
                 const at::Tensor& d) { return GatedMlp(xl, g, u, d, activation, chunk_bytes); },
             x, gate_up, down, grad_out, dtype);
  Result whole = RunMlp([&](const at::Tensor& xl, const at::Tensor& g, const at::Tensor& u,
                            const at::Tensor& d) { return MonolithicMlp(xl, g, u, d, activation); },
                        x, gate_up, down, grad_out, dtype);
  EXPECT_EQ(chunked.out.sizes(), whole.out.sizes());
  // Each row's forward is the same arithmetic; the gradients differ only in
  // how the rows' contributions are grouped (fp32 sums) and rounded (bf16:
  // once per chunk and once at the end, against once).
  const double forward_tol = dtype == at::kBFloat16 ? 1e-2 : 1e-6;
  const double grad_tol = dtype == at::kBFloat16 ? 2e-2 : 1e-5;
  EXPECT_LT(RelativeError(chunked.out, whole.out), forward_tol);
  EXPECT_LT(RelativeError(chunked.grad_x, whole.grad_x), grad_tol);
  EXPECT_LT(RelativeError(chunked.grad_gate_up, whole.grad_gate_up), grad_tol);
  EXPECT_LT(RelativeError(chunked.grad_down, whole.grad_down), grad_tol);
}

INSTANTIATE_TEST_SUITE_P(All, ChunkedMlpTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values(MlpActivation::kSilu,
                                                              MlpActivation::kGeluTanh,
                                                              MlpActivation::kGelu),
                                            // 18 rows: one row a chunk, 6 whole chunks, 4 and a
                                            // partial last chunk of 2.
                                            ::testing::Values(int64_t{1}, int64_t{3}, int64_t{4})),
                         [](const auto& info) {
                           const MlpActivation a = std::get<1>(info.param);
                           return std::string(std::get<0>(info.param) == at::kFloat ? "Fp32"
                                                                                    : "Bf16") +
                                  (a == MlpActivation::kSilu       ? "Silu"
                                   : a == MlpActivation::kGeluTanh ? "GeluTanh"
                                                                   : "Gelu") +
                                  "_" + std::to_string(std::get<2>(info.param)) + "Rows";
                         });

// Under the threshold GatedMlp is the plain ops, bit for bit (speed at
// usual lengths unchanged); a gradient-free call (the streamed forward)
// gives the chunked forward's values too.
TEST(ChunkedMlpTest, PlainBelowTheThresholdAndTheSameWithoutAutograd) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({kB, kT, kC}), gate = at::randn({kF, kC});
  const at::Tensor up = at::randn({kF, kC}), down = at::randn({kC, kF});
  const at::Tensor plain = MonolithicMlp(x, gate, up, down, MlpActivation::kSilu);
  EXPECT_TRUE(at::equal(GatedMlp(x, gate, up, down, MlpActivation::kSilu), plain));
  at::NoGradGuard no_grad;
  const at::Tensor chunked = GatedMlp(x, gate, up, down, MlpActivation::kSilu, 5 * kF * 4);
  EXPECT_LT(RelativeError(chunked, plain), 1e-6);
}

TEST(ChunkedMlpTest, ChunkRows) {
  // llama-8b (F = 14336) in bf16 at the default: 128k rows go in chunks of
  // 37,449; 8 x 2048 rows stay whole.
  EXPECT_EQ(MlpChunkRows(131072, 14336, 2, kMlpChunkBytes), 37449);
  EXPECT_EQ(MlpChunkRows(8 * 2048, 14336, 2, kMlpChunkBytes), 8 * 2048);
  EXPECT_EQ(MlpChunkRows(10, 4, 4, 40), 2);    // 16 bytes a row: 2 rows of 40 bytes
  EXPECT_EQ(MlpChunkRows(10, 4, 4, 160), 10);  // exactly fits: whole
  EXPECT_EQ(MlpChunkRows(10, 4, 4, 3), 1);     // less than a row: one row at a time
}

}  // namespace
}  // namespace megatrain::engine
