// Parity of the streaming executor with the monolithic reference model
// (tests/testing/reference_llama.h) for every supported variant on the CPU
// runtime (CI); executor_parity_cuda_test.cc does the same on CUDA.
#include "engine/step/executor.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/model/layers.h"
#include "engine/runtime/device_runtime.h"
#include "engine/store/host_store.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::RelativeError;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::ParityMode;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::Variant;

// testing::ParityModes, with one micro-batch in the plain modes.

class ExecutorParityTest : public ::testing::TestWithParam<std::tuple<Variant, ParityMode>> {};

TEST_P(ExecutorParityTest, MatchesReferenceOnCpu) {
  ::megatrain::testing::ExpectParity(std::get<0>(GetParam()), "cpu", std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Variants, ExecutorParityTest,
                         ::testing::Combine(::testing::ValuesIn(testing::Variants()),
                                            ::testing::ValuesIn(testing::ParityModes(1))),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
                         });

// Note [Layer-major schedule]: the layer-major plan against the monolithic
// reference in every kind of mode.
class LayerMajorParityTest : public ::testing::TestWithParam<std::tuple<Variant, ParityMode>> {};

TEST_P(LayerMajorParityTest, MatchesReferenceOnCpu) {
  ::megatrain::testing::ExpectParity(std::get<0>(GetParam()), "cpu", std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Variants, LayerMajorParityTest,
                         ::testing::Combine(::testing::ValuesIn(testing::Variants()),
                                            ::testing::ValuesIn(testing::LayerMajorParityModes())),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
                         });

// Note [Layer-major schedule]: every block receives its contributions in
// micro-batch order, so fp32 gradients and loss are bit for bit those of
// micro-batch-major; a tied embedding (lm_head and row parts summed in
// another order) only to rounding.
// ~10 s on 2 cores: 8 variants x 6 cases x both schedules, the point of
// the test being that no variant or mode breaks the summation order.
TEST(LayerMajorTest, Fp32IsBitIdenticalToMicroBatchMajor) {
  struct Case {
    int micro_batches, wave;
    bool offload;
    int resident_layers;
    bool device_grad_accumulation;
  };
  const std::vector<Case> cases = {
      {1, 1, false, 0, false}, {3, 3, false, 0, false}, {4, 4, true, 0, false},
      {4, 2, false, 1, false}, {3, 2, true, 0, true},   {4, 3, false, 2, true},
  };
  for (const Variant& variant : testing::Variants()) {
    const ModelLayout layout = ModelLayout::Create(variant.config);
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(variant.name, " micro-batches ", c.micro_batches, " wave ", c.wave,
                                " offload ", c.offload, " resident ", c.resident_layers,
                                " device accumulation ", c.device_grad_accumulation));
      auto run = [&](StepSchedule schedule) {
        return testing::RunGradients(variant.config, "cpu", ComputeDtype::kFp32, 0.2,
                                     c.micro_batches, 2, 12, c.offload, c.resident_layers, false,
                                     c.device_grad_accumulation, schedule, c.wave);
      };
      const testing::GradientRun mbm = run(StepSchedule::kMicroBatchMajor);
      const testing::GradientRun lm = run(StepSchedule::kLayerMajor);
      ASSERT_FALSE(mbm.grads.empty());
      ASSERT_EQ(mbm.grads.size(), lm.grads.size());
      EXPECT_EQ(mbm.loss, lm.loss);
      const int64_t emb_numel = layout.blocks[layout.embedding_block()].numel;
      const bool tied_exception = variant.config.tie_word_embeddings && c.micro_batches > 1;
      // RunGradients concatenates the blocks in order: the embedding first.
      const int64_t exact_from = tied_exception ? emb_numel : 0;
      EXPECT_EQ(std::memcmp(mbm.grads.data() + exact_from, lm.grads.data() + exact_from,
                            (mbm.grads.size() - exact_from) * 4),
                0);
      if (tied_exception) {
        at::Tensor a = at::from_blob(const_cast<float*>(mbm.grads.data()), {emb_numel});
        at::Tensor b = at::from_blob(const_cast<float*>(lm.grads.data()), {emb_numel});
        EXPECT_LT(RelativeError(b, a), 1e-6);  // fp32 sums in another order
      }
      // The streamed weights cross the link once per wave, not once per
      // micro-batch (the only other H2D is the same input rows and
      // offloaded activations). With resident layers the few streamed
      // blocks of these 3-layer models stay in the 3 weight slots anyway.
      if (c.micro_batches > 1 && !c.offload && c.resident_layers == 0) {
        EXPECT_LT(lm.stats.h2d_bytes, mbm.stats.h2d_bytes);
      }
    }
  }
}

// Note [Kept layer graphs]: backward through the forward's kept graph runs
// the operations of the recompute on the same inputs, so in fp32 on the
// CPU the gradients and loss are those of activation checkpointing bit
// for bit, in both schedules, with and without layers streamed after them.
TEST(KeptGraphTest, Fp32IsBitIdenticalToRecomputing) {
  struct Case {
    int micro_batches, resident_layers, kept;
    StepSchedule schedule;
    int wave;
  };
  const std::vector<Case> cases = {
      {2, 3, 3, StepSchedule::kMicroBatchMajor, 1},
      {2, 2, 1, StepSchedule::kMicroBatchMajor, 1},
      {3, 3, 2, StepSchedule::kLayerMajor, 3},
  };
  for (const Variant& variant : testing::Variants()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(variant.name, " micro-batches ", c.micro_batches, " resident ",
                                c.resident_layers, " kept ", c.kept, " wave ", c.wave));
      auto run = [&](int kept) {
        return testing::RunGradients(variant.config, "cpu", ComputeDtype::kFp32, 0.2,
                                     c.micro_batches, 2, 12, false, c.resident_layers, false, false,
                                     c.schedule, c.wave, false, kept);
      };
      const testing::GradientRun recomputed = run(0);
      const testing::GradientRun kept = run(c.kept);
      ASSERT_FALSE(recomputed.grads.empty());
      ASSERT_EQ(recomputed.grads.size(), kept.grads.size());
      EXPECT_EQ(recomputed.loss, kept.loss);
      EXPECT_EQ(std::memcmp(recomputed.grads.data(), kept.grads.data(),
                            recomputed.grads.size() * sizeof(float)),
                0);
    }
  }
}

// Note [Kept layer graphs]: only resident dense layers, never with
// activation offload; each refusal names the field.
TEST(KeptGraphTest, RefusesLayersItCannotKeep) {
  const ModelConfig config = SmallLlama();
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  auto runtime = DeviceRuntime::Create("cpu");
  auto pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.micro_batch = 2;
  options.seq_len = 6;
  options.resident_layers = 1;
  options.kept_graph_layers = 2;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.kept_graph_layers: must be in [0, resident_layers=1], "
                                 "got 2")));
  options.kept_graph_layers = 1;
  options.offload_activations = true;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.kept_graph_layers: not with offload_activations")));
}

TEST(ExecutorTest, LogitsMatchReference) {
  const ModelConfig config = SmallLlama();
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  (*store)->InitializeWeights(9, 0.2);
  auto runtime = DeviceRuntime::Create("cpu");
  auto pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.micro_batch = 2;
  options.seq_len = 6;
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
  ASSERT_THAT(executor, IsOk());
  const MicroBatch mb = MakeBatches(1, 2, 6, config.vocab_size, 4)[0];
  auto logits = (*executor)->Logits(mb);
  ASSERT_THAT(logits, IsOk());
  ASSERT_EQ(logits->size(), static_cast<size_t>(2 * 6 * config.vocab_size));
  testing::ReferenceParams params = testing::ParamsFromStore(**store);
  at::Tensor ids = at::tensor(mb.input_ids).to(at::kLong).view({2, 6});
  at::Tensor ref = testing::ReferenceLogits(config, params, ids, /*bf16=*/false).detach();
  at::Tensor ours = at::from_blob(logits->data(), ref.sizes(), at::kFloat);
  EXPECT_LT(RelativeError(ours, ref), 1e-5);  // fp32, summation order only
}

TEST(ExecutorTest, GradientAccumulationEqualsOneLargeBatch) {
  // 4 micro-batches of 2 sequences vs 1 micro-batch of 8 (same sequences).
  const ModelConfig config = SmallLlama();
  auto run = [&](int count, int64_t b, std::vector<float>* grads) {
    auto store = HostStore::Create(config, {});
    ASSERT_THAT(store, IsOk());
    (*store)->InitializeWeights(3, 0.2);
    auto runtime = DeviceRuntime::Create("cpu");
    auto pool = ThreadPool::Create(2);
    ExecutorOptions options;
    options.micro_batch = b;
    options.seq_len = 10;
    auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
    ASSERT_THAT(executor, IsOk());
    std::vector<MicroBatch> one = MakeBatches(1, 8, 10, config.vocab_size, 5);
    std::vector<MicroBatch> batches(count);
    for (int m = 0; m < count; ++m) {
      const int64_t n = b * 10;
      batches[m].input_ids.assign(one[0].input_ids.begin() + m * n,
                                  one[0].input_ids.begin() + (m + 1) * n);
      batches[m].labels.assign(one[0].labels.begin() + m * n, one[0].labels.begin() + (m + 1) * n);
    }
    auto result = (*executor)->ForwardBackward(batches);
    ASSERT_THAT(result, IsOk());
    for (int64_t blk = 0; blk < (*store)->num_blocks(); ++blk) {
      grads->insert(grads->end(), (*store)->grad(blk),
                    (*store)->grad(blk) + (*store)->block_numel(blk));
    }
  };
  std::vector<float> accumulated, whole;
  run(4, 2, &accumulated);
  run(1, 8, &whole);
  ASSERT_EQ(accumulated.size(), whole.size());
  at::Tensor a = at::from_blob(accumulated.data(), {static_cast<int64_t>(accumulated.size())});
  at::Tensor w = at::from_blob(whole.data(), {static_cast<int64_t>(whole.size())});
  // Same math, different summation order across micro-batches: 1e-5.
  EXPECT_LT(RelativeError(a, w), 1e-5);
}

// Note [Activation offload]: the saved inputs make a round trip through
// host memory unchanged, so the gradients are bit for bit those of keeping
// them on the device, and each offloaded layer input ([B, T, C] fp32) adds
// its bytes once to D2H and once to H2D per micro-batch.
TEST(ExecutorTest, ActivationOffloadIsBitIdenticalAndMovesTheInputs) {
  for (const int64_t layers : {1, 2, 3}) {
    ModelConfig config = SmallLlama();
    config.num_hidden_layers = layers;
    const int micro_batches = 3;
    const int64_t b = 2, t = 12;
    testing::GradientRun kept =
        testing::RunGradients(config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, false);
    testing::GradientRun offloaded =
        testing::RunGradients(config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, true);
    ASSERT_FALSE(kept.grads.empty());
    ASSERT_EQ(kept.grads.size(), offloaded.grads.size());
    EXPECT_EQ(std::memcmp(kept.grads.data(), offloaded.grads.data(), kept.grads.size() * 4), 0)
        << layers << " layers";
    EXPECT_EQ(kept.loss, offloaded.loss);
    const int64_t moved = (layers - 1) * b * t * config.hidden_size * 4 * micro_batches;
    EXPECT_EQ(offloaded.stats.d2h_bytes - kept.stats.d2h_bytes, moved) << layers << " layers";
    EXPECT_EQ(offloaded.stats.h2d_bytes - kept.stats.h2d_bytes, moved) << layers << " layers";
  }
}

// Note [Resident layers]: a resident layer's gradient is accumulated on
// the device with the same fp32 adds, in the same order, as on the host, so
// it is bit for bit that of streaming the layer; nothing of it crosses
// PCIe (but its squared norm).
TEST(ExecutorTest, ResidentLayersGiveBitIdenticalGradientsAndMoveLess) {
  const ModelConfig config = SmallLlama();
  const int micro_batches = 3;
  const int64_t b = 2, t = 12;
  testing::GradientRun streamed =
      testing::RunGradients(config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, false);
  testing::GradientRun resident = testing::RunGradients(
      config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, false, /*resident_layers=*/1);
  ASSERT_FALSE(streamed.grads.empty());
  ASSERT_EQ(streamed.grads.size(), resident.grads.size());
  EXPECT_EQ(std::memcmp(streamed.grads.data(), resident.grads.data(), streamed.grads.size() * 4),
            0);
  EXPECT_EQ(streamed.loss, resident.loss);
  // Layer 0's gradient no longer leaves the device (once per micro-batch),
  // nor do its weights come in (at least once per micro-batch each way of
  // the pass; the freed weight slot also keeps other blocks loaded longer).
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  const int64_t layer_bytes = (*store)->block_numel((*store)->layout().layer_block(0)) * 4;
  EXPECT_EQ(streamed.stats.d2h_bytes - resident.stats.d2h_bytes, micro_batches * layer_bytes);
  EXPECT_GE(streamed.stats.h2d_bytes - resident.stats.h2d_bytes, 2 * micro_batches * layer_bytes);
}

// Note [Resident embedding]: the table's gradient is summed on the device
// (fp32, possibly in another order than the host's scatter-add, so equal
// to rounding); only token ids and labels cross PCIe for it: no [B*T, C]
// fp32 rows up, no dx down.
TEST(ExecutorTest, ResidentEmbeddingMatchesTheHostPathAndMovesOnlyTokenIds) {
  ModelConfig odd = SmallLlama();  // V * C not a multiple of 64: the block ends in padding
  odd.vocab_size = 97;
  odd.hidden_size = 72;
  for (const ModelConfig& config : {SmallLlama(), odd}) {
    SCOPED_TRACE(
        absl::StrCat("vocab_size ", config.vocab_size, ", hidden_size ", config.hidden_size));
    const int micro_batches = 3;
    const int64_t b = 2, t = 12;
    testing::GradientRun streamed =
        testing::RunGradients(config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, false);
    testing::GradientRun resident =
        testing::RunGradients(config, "cpu", ComputeDtype::kFp32, 0.2, micro_batches, b, t, false,
                              /*resident_layers=*/0, /*resident_embedding=*/true);
    ASSERT_FALSE(streamed.grads.empty());
    ASSERT_EQ(streamed.grads.size(), resident.grads.size());
    EXPECT_EQ(streamed.loss, resident.loss);  // the forward is the same arithmetic
    const int64_t n = static_cast<int64_t>(streamed.grads.size());
    EXPECT_LT(RelativeError(at::from_blob(resident.grads.data(), {n}, at::kFloat),
                            at::from_blob(streamed.grads.data(), {n}, at::kFloat)),
              1e-6);
    const int64_t rows = b * t;
    EXPECT_EQ(streamed.stats.d2h_bytes - resident.stats.d2h_bytes,
              micro_batches * rows * config.hidden_size * 4);
    EXPECT_EQ(streamed.stats.h2d_bytes - resident.stats.h2d_bytes,
              micro_batches * (rows * (config.hidden_size * 4 + 8) - rows * 16));
  }
}

// Note [Device gradient accumulation]: the same fp32 adds in the same
// order as the host's, so bit for bit the same gradient; each streamed
// dense block (layers, head) leaves the device once per pass instead of
// once per micro-batch.
TEST(ExecutorTest, DeviceAccumulationGivesBitIdenticalGradientsAndMovesLess) {
  for (const ComputeDtype dtype : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    SCOPED_TRACE(dtype == ComputeDtype::kBf16 ? "bf16" : "fp32");
    const ModelConfig config = SmallLlama();
    const int micro_batches = 3;
    const int64_t b = 2, t = 12;
    testing::GradientRun host =
        testing::RunGradients(config, "cpu", dtype, 0.2, micro_batches, b, t, false);
    testing::GradientRun device =
        testing::RunGradients(config, "cpu", dtype, 0.2, micro_batches, b, t, false,
                              /*resident_layers=*/1, /*resident_embedding=*/false,
                              /*device_grad_accumulation=*/true);
    ASSERT_FALSE(host.grads.empty());
    ASSERT_EQ(host.grads.size(), device.grads.size());
    EXPECT_EQ(std::memcmp(host.grads.data(), device.grads.data(), host.grads.size() * 4), 0);
    EXPECT_EQ(host.loss, device.loss);
    auto store = HostStore::Create(config, {});
    ASSERT_THAT(store, IsOk());
    const ModelLayout& layout = (*store)->layout();
    int64_t streamed_bytes = (*store)->block_numel(layout.head_block()) * 4;
    for (int64_t l = 1; l < layout.num_layers(); ++l) {
      streamed_bytes += (*store)->block_numel(layout.layer_block(l)) * 4;
    }
    const int64_t layer0_bytes = (*store)->block_numel(layout.layer_block(0)) * 4;
    // Less: layer 0 (resident) every micro-batch, the other layers and the
    // head all but once.
    EXPECT_EQ(host.stats.d2h_bytes - device.stats.d2h_bytes,
              micro_batches * layer0_bytes + (micro_batches - 1) * streamed_bytes);
  }
}

TEST(ExecutorTest, RefusesTokenOutsideVocabularyNamingThePosition) {
  const ModelConfig config = SmallLlama();
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  auto runtime = DeviceRuntime::Create("cpu");
  auto pool = ThreadPool::Create(1);
  ExecutorOptions options;
  options.micro_batch = 1;
  options.seq_len = 4;
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
  ASSERT_THAT(executor, IsOk());
  std::vector<MicroBatch> batches(1);
  batches[0].input_ids = {1, 2, 96, 3};
  batches[0].labels = {2, 3, 4, 5};
  EXPECT_THAT((*executor)->ForwardBackward(batches),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input_ids[2] = 96")));
  batches[0].input_ids = {1, 2, 3};
  EXPECT_THAT((*executor)->ForwardBackward(batches),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected 4 input_ids")));
}

TEST(ExecutorTest, RefusesBadOptionsNamingTheField) {
  auto store = HostStore::Create(SmallLlama(), {});
  ASSERT_THAT(store, IsOk());
  auto runtime = DeviceRuntime::Create("cpu");
  auto pool = ThreadPool::Create(1);
  ExecutorOptions options;
  options.micro_batch = 0;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.micro_batch")));
  options.micro_batch = 1;
  options.resident_layers = 4;  // SmallLlama has 3
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.resident_layers: must be in [0, num_hidden_layers=3]")));
  options.resident_layers = 0;
  options.schedule = StepSchedule::kLayerMajor;
  options.wave = 0;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.wave: must be in [1, 4096] with the layer-major "
                                 "schedule, got 0")));
  options.schedule = StepSchedule::kMicroBatchMajor;
  options.wave = 1;
  options.mlp_chunk_bytes = 0;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.mlp_chunk_bytes: must be >= 1, got 0")));
  options.mlp_chunk_bytes = kMlpChunkBytes;
  options.compute_dtype = ComputeDtype::kBf16;  // store has no bf16 copy
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bf16")));
}

TEST(DeviceRuntimeTest, RefusesUnknownDevice) {
  EXPECT_THAT(DeviceRuntime::Create("tpu"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device")));
}

}  // namespace
}  // namespace megatrain::engine

namespace megatrain::engine {
namespace {

// Note [Executor memory plan]: what the executor's parts hold equals the
// plan admission reads, in every mode (the accumulation buffers once a
// pass with several micro-batches allocated them).
TEST(ExecutorTest, HoldsExactlyItsMemoryPlan) {
  std::vector<ParityMode> modes = testing::ParityModes(2);
  for (const ParityMode& mode : testing::LayerMajorParityModes()) modes.push_back(mode);
  for (const Variant& variant : testing::Variants()) {
    for (const ParityMode& mode : modes) {
      // The layer-major modes' buffers do not depend on the family: an
      // untied and a tied variant keep the test short.
      if (mode.schedule == StepSchedule::kLayerMajor && variant.name != "llama" &&
          variant.name != "llama3_tied_bias") {
        continue;
      }
      SCOPED_TRACE(variant.name + " " + mode.name);
      const ModelConfig& config = variant.config;
      HostStoreOptions store_options;
      store_options.streaming_bf16 = mode.dtype == ComputeDtype::kBf16;
      auto store = HostStore::Create(config, store_options);
      ASSERT_THAT(store, IsOk());
      auto runtime = DeviceRuntime::Create("cpu");
      ASSERT_THAT(runtime, IsOk());
      auto pool = ThreadPool::Create(2);
      ExecutorOptions options;
      options.compute_dtype = mode.dtype;
      options.micro_batch = 2;
      options.seq_len = 6;
      options.offload_activations = mode.offload_activations;
      options.resident_layers = mode.resident_layers;
      options.resident_embedding = mode.resident_embedding;
      options.device_grad_accumulation = mode.device_grad_accumulation;
      options.schedule = mode.schedule;
      options.wave = mode.wave;
      options.kept_graph_layers = mode.kept_graph_layers;
      auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
      ASSERT_THAT(executor, IsOk());
      const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options);
      EXPECT_EQ((*executor)->staging_host_bytes(), plan.pinned_bytes());
      EXPECT_EQ((*executor)->slot_device_bytes(),
                plan.device_bytes() - plan.grad_accumulation_bytes);
      ASSERT_THAT(
          (*executor)->ForwardBackward(MakeBatches(mode.micro_batches, 2, 6, config.vocab_size, 9)),
          IsOk());
      // Layer-major with one wave sums in the gradient slots instead.
      const bool slot_sum =
          mode.schedule == StepSchedule::kLayerMajor && mode.wave >= mode.micro_batches;
      const bool accumulated = mode.device_grad_accumulation && mode.micro_batches > 1 && !slot_sum;
      EXPECT_EQ((*executor)->slot_device_bytes(),
                plan.device_bytes() - (accumulated ? 0 : plan.grad_accumulation_bytes));
      if (mode.offload_activations) EXPECT_GT(plan.activation_offload_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
