// Note [Document attention] (engine/model/layers.h) on a CUDA device (label
// gpu; skipped, not passed, where none is visible): flash attention's
// variable-length kernel (compat::VarlenCausalAttention) against masked
// attention on the CPU, and the executor's packed documents against the
// CPU reference run on each document alone, in bf16 (the varlen kernel)
// and fp32 (SDPA with a document mask).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/model/layers.h"
#include "engine/runtime/host_buffer.h"
#include "engine/runtime/torch_compat.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::ParityResult;
using ::megatrain::testing::RelativeError;
using ::megatrain::testing::Variant;

// softmax(q k^T * scale, masked) v in fp32 on the CPU: q, k, v [N, H, Dh]
// -> [N, H, Dh], `allowed` [1, 1, N, N].
at::Tensor MaskedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& allowed, double scale) {
  const at::Tensor qh = q.transpose(0, 1), kh = k.transpose(0, 1), vh = v.transpose(0, 1);
  at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) * scale;  // [H, N, N]
  scores = scores.masked_fill(allowed[0].logical_not(), -INFINITY);
  return at::matmul(at::softmax(scores, -1), vh).transpose(0, 1);  // [N, H, Dh]
}

// The kernel is taken for bf16 packed documents, with and without a
// window, and its output and gradients are those of masked attention on the
// same (bf16-rounded) inputs within 2e-2: bf16 output and gradients (8-bit
// mantissa), fp32 accumulation inside the kernel.
TEST(VarlenAttentionCudaTest, MatchesMaskedAttentionOnTheCpu) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4,
                                          0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t n = static_cast<int64_t>(positions.size()), heads = 4, head_dim = 16;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const PackedDocuments cpu_docs = MakePackedDocuments(positions, 1, n, at::kCPU);
  const PackedDocuments cuda_docs = MakePackedDocuments(positions, 1, n, at::kCUDA);
  ASSERT_EQ(cuda_docs.max_seqlen, 9);
  for (const int64_t window : {int64_t{0}, int64_t{5}}) {
    SCOPED_TRACE(window);
    at::manual_seed(11);
    std::vector<at::Tensor> cpu, cuda;  // q, k, v
    for (int i = 0; i < 3; ++i) {
      const at::Tensor x = at::randn({n, heads, head_dim}).to(at::kBFloat16);
      cpu.push_back(x.to(at::kFloat).requires_grad_(true));
      cuda.push_back(x.to(at::kCUDA).requires_grad_(true));
    }
    const at::Tensor out = compat::VarlenCausalAttention(
        cuda[0], cuda[1], cuda[2], cuda_docs.cu_seqlens, cuda_docs.max_seqlen, scale, window);
    ASSERT_TRUE(out.defined()) << "the varlen kernel was not taken";
    const at::Tensor ref =
        MaskedAttention(cpu[0], cpu[1], cpu[2], DocumentAttentionMask(cpu_docs, window), scale);
    EXPECT_LT(RelativeError(out.to(at::kCPU).to(at::kFloat), ref.detach()), 2e-2);
    const at::Tensor grad = at::randn({n, heads, head_dim});
    out.backward(grad.to(at::kBFloat16).to(at::kCUDA));
    ref.backward(grad.to(at::kBFloat16).to(at::kFloat));
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(RelativeError(cuda[i].grad().to(at::kCPU).to(at::kFloat), cpu[i].grad()), 2e-2)
          << "input " << i;
    }
  }
}

class DocumentAttentionCudaTest : public ::testing::TestWithParam<Variant> {};

// bf16 within 2e-2 (the parity suites' bound, Note [Reference bf16
// attention] in tests/testing/reference_llama.h): the varlen kernel, or
// the soft-capped blocks for gemma2.
TEST_P(DocumentAttentionCudaTest, PackedDocumentsMatchEachDocumentAloneInBf16) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  const ParityResult r = testing::RunPackedDocumentParity(
      GetParam().config, "cuda", ComputeDtype::kBf16, 0.02, testing::PackedParityRows(), 2, 12);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 2e-2);
  EXPECT_LT(r.worst_grad_error, 2e-2) << r.worst_grad;
}

// fp32 within 1e-5 (summation order only, as executor_parity_cuda_test):
// SDPA with the [B, 1, T, T] document mask.
TEST_P(DocumentAttentionCudaTest, PackedDocumentsMatchEachDocumentAloneInFp32) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  const ParityResult r = testing::RunPackedDocumentParity(
      GetParam().config, "cuda", ComputeDtype::kFp32, 0.2, testing::PackedParityRows(), 2, 12);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 1e-5);
  EXPECT_LT(r.worst_grad_error, 1e-5) << r.worst_grad;
}

INSTANTIATE_TEST_SUITE_P(Variants, DocumentAttentionCudaTest,
                         ::testing::ValuesIn(testing::Variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace megatrain::engine
