// Note [Document attention] (engine/model/layers.h) on the CPU runtime:
// micro-batches whose rows pack several documents, with position ids,
// against the monolithic reference run on each document alone, for every
// model variant; and what the executor does with position ids.
// document_attention_cuda_test.cc runs the same on CUDA.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/data/batch.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_layout.h"
#include "engine/runtime/device_runtime.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/executor.h"
#include "engine/store/host_store.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::ParityResult;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::Variant;
using ::testing::HasSubstr;

constexpr int64_t kRows = 2, kSeqLen = 12;

double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  return testing::RelativeError(a, b);
}

class DocumentAttentionTest : public ::testing::TestWithParam<Variant> {};

// Isolated documents compute what each document computes alone. fp32
// within 1e-5 relative: the packed rows add only keys whose probability is
// exactly 0 (masked before the softmax), so the two sides differ only in
// summation order (matmuls over longer rows, the loss summed over another
// grouping of tokens); parity's measure (Note [Near-cancelling
// gradients]).
TEST_P(DocumentAttentionTest, PackedDocumentsMatchEachDocumentAloneInFp32) {
  const ParityResult r =
      testing::RunPackedDocumentParity(GetParam().config, "cpu", ComputeDtype::kFp32, 0.2,
                                       testing::PackedParityRows(), kRows, kSeqLen);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 1e-5);
  EXPECT_LT(r.worst_grad_error, 1e-5) << r.worst_grad;
}

// bf16 within 2e-2, the parity suites' bound: 8-bit mantissa matmuls on
// both sides, rounded at different points (Note [Reference bf16
// attention] in tests/testing/reference_llama.h).
TEST_P(DocumentAttentionTest, PackedDocumentsMatchEachDocumentAloneInBf16) {
  const ParityResult r =
      testing::RunPackedDocumentParity(GetParam().config, "cpu", ComputeDtype::kBf16, 0.02,
                                       testing::PackedParityRows(), kRows, kSeqLen);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, 2e-2);
  EXPECT_LT(r.worst_grad_error, 2e-2) << r.worst_grad;
}

// One document per row, with position ids 0..T-1: the isolated path
// computes what shared packing computes for those rows (the same RoPE
// rows, the causal mask as a per-row mask). Within 1e-6: LibTorch 1.13
// masks both the same way (bit-identical); torch 2.x's SDPA may take
// another kernel for an explicit mask than for is_causal.
TEST_P(DocumentAttentionTest, OneDocumentPerRowMatchesSharedPacking) {
  const ModelConfig& config = GetParam().config;
  std::vector<MicroBatch> shared = testing::MakeBatches(2, kRows, kSeqLen, config.vocab_size, 5);
  std::vector<MicroBatch> isolated = shared;
  for (MicroBatch& mb : isolated) {
    for (int64_t i = 0; i < kRows * kSeqLen; ++i) {
      mb.position_ids.push_back(static_cast<int32_t>(i % kSeqLen));
    }
  }
  const testing::GradientRun a =
      testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, shared);
  const testing::GradientRun b =
      testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, isolated);
  ASSERT_FALSE(a.grads.empty());
  ASSERT_FALSE(b.grads.empty());
  EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-6);
  EXPECT_LT(RelativeDifference(b.grads, a.grads), 1e-6);
}

// The documents of a row do not see each other: dropping the position ids
// (shared packing of the same tokens and labels) changes the loss.
TEST_P(DocumentAttentionTest, SeveralDocumentsPerRowDifferFromSharedPacking) {
  const ModelConfig& config = GetParam().config;
  const std::vector<MicroBatch> isolated = testing::MakePackedBatches(
      testing::PackedParityRows(), kRows, kSeqLen, config.vocab_size, 13);
  std::vector<MicroBatch> shared = isolated;
  for (MicroBatch& mb : shared) mb.position_ids.clear();
  const testing::GradientRun a =
      testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, isolated);
  const testing::GradientRun b =
      testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, shared);
  ASSERT_FALSE(a.grads.empty());
  ASSERT_FALSE(b.grads.empty());
  EXPECT_GT(std::abs(a.loss - b.loss) / std::abs(b.loss), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Variants, DocumentAttentionTest, ::testing::ValuesIn(testing::Variants()),
                         [](const auto& info) { return info.param.name; });

// Mixture-of-experts families (mixtral, qwen2/3_moe attend as the dense
// families do; gpt_oss adds sinks to a masked softmax): the engine on
// packed documents against the engine on each document in a row of its
// own, padded (shared packing), fp32 within 1e-5 (summation order only).
// Router aux loss off: it averages over every token of a micro-batch,
// padding included, so it depends on the packing.
TEST(DocumentAttentionMoeTest, PackedDocumentsMatchEachDocumentInARowOfItsOwn) {
  for (const char* family : {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"}) {
    SCOPED_TRACE(family);
    absl::StatusOr<ModelConfig> parsed =
        LoadHfConfigFile(std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family + "/config.json");
    ASSERT_THAT(parsed, IsOk());
    MoeModelConfig moe = MoeModelConfigOf(*parsed);
    moe.moe.output_router_logits = false;
    moe.moe.router_jitter_noise = 0;
    const ModelConfig config = ModelConfigOf(moe);
    const std::vector<MicroBatch> packed = testing::MakePackedBatches(
        testing::PackedParityRows(), kRows, kSeqLen, config.vocab_size, 13);
    // Each document alone: its tokens, then filler (token 0, no label).
    std::vector<MicroBatch> alone(1);
    for (const MicroBatch& mb : packed) {
      for (size_t begin = 0; begin < mb.position_ids.size();) {
        size_t end = begin + 1;
        while (end < mb.position_ids.size() && mb.position_ids[end] != 0) ++end;
        if (alone.back().input_ids.size() == static_cast<size_t>(kRows * kSeqLen)) {
          alone.emplace_back();
        }
        MicroBatch& row = alone.back();
        row.input_ids.insert(row.input_ids.end(), mb.input_ids.begin() + begin,
                             mb.input_ids.begin() + end);
        row.labels.insert(row.labels.end(), mb.labels.begin() + begin, mb.labels.begin() + end);
        row.input_ids.resize(row.input_ids.size() + kSeqLen - (end - begin), 0);
        row.labels.resize(row.labels.size() + kSeqLen - (end - begin), kIgnoreLabel);
        begin = end;
      }
    }
    ASSERT_EQ(alone.back().input_ids.size(), static_cast<size_t>(kRows * kSeqLen));
    const testing::GradientRun a =
        testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, packed);
    const testing::GradientRun b =
        testing::RunGradientsOn(config, "cpu", ComputeDtype::kFp32, 0.2, kRows, kSeqLen, alone);
    ASSERT_FALSE(a.grads.empty());
    ASSERT_FALSE(b.grads.empty());
    EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(b.loss), 1e-5);
    EXPECT_LT(RelativeDifference(a.grads, b.grads), 1e-5);
  }
}

// Position ids that do not describe documents are refused before any work.
TEST(DocumentAttentionExecutorTest, BadPositionIdsAreInvalidArgument) {
  const ModelConfig config = testing::SmallLlama();
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  (*store)->InitializeWeights(3, 0.2);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.micro_batch = 2;
  options.seq_len = 4;
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
  ASSERT_THAT(executor, IsOk());
  MicroBatch mb = testing::MakeBatches(1, 2, 4, config.vocab_size, 9)[0];
  const struct {
    std::vector<int32_t> position_ids;
    const char* message;
  } cases[] = {
      {{0, 1, 2}, "expected 8 position_ids"},
      {{0, 1, 3, 4, 0, 1, 2, 3}, "position_ids[2] = 3 must be 0"},
      {{0, 1, 2, 3, 4, 5, 6, 7}, "position_ids[4] = 4 must be 0"},  // rows begin at 0
      {{1, 2, 3, 4, 0, 1, 2, 3}, "position_ids[0] = 1"},
  };
  for (const auto& c : cases) {
    mb.position_ids = c.position_ids;
    EXPECT_THAT((*executor)->ForwardBackward({mb}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

}  // namespace
}  // namespace megatrain::engine
