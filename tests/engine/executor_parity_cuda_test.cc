// Parity of the streaming executor with the reference model on a CUDA
// device (label gpu): two micro-batches of gradient accumulation, so the
// pipeline's slot reuse, events and host accumulation are all exercised.
// Skipped (not passed) where no CUDA device is visible.
#include <gtest/gtest.h>

#include "engine/host_buffer.h"
#include "tests/testing/parity.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::ParityResult;
using ::megatrain::testing::RunParity;
using ::megatrain::testing::Variant;

class ExecutorParityCudaTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ExecutorParityCudaTest, Fp32MatchesReferenceOnCuda) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  // cuBLAS without TF32 and the fused attention kernel: fp32 accumulation
  // in a different order, still within 1e-5.
  ParityResult r = RunParity(GetParam().config, "cuda", ComputeDtype::kFp32, 0.2, 2, 2, 12);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 1e-5);
  EXPECT_LT(r.worst_grad_error, 1e-5) << r.worst_grad;
}

TEST_P(ExecutorParityCudaTest, Bf16MatchesReferenceOnCuda) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  ParityResult r = RunParity(GetParam().config, "cuda", ComputeDtype::kBf16, 0.02, 2, 2, 12);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 2e-2);
  EXPECT_LT(r.worst_grad_error, 2e-2) << r.worst_grad;
}

INSTANTIATE_TEST_SUITE_P(Variants, ExecutorParityCudaTest,
                         ::testing::ValuesIn(testing::Variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace megatrain::engine
