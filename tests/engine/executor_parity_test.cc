// Parity of the streaming executor with the monolithic reference model
// (tests/testing/reference_llama.h) for every supported variant, on CPU
// (CI) and, where there is one, on a CUDA device (label gpu).
#include "engine/executor.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "engine/device_runtime.h"
#include "engine/host_store.h"
#include "engine/thread_pool.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::RelativeError;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// A small Llama: GQA (4 heads, 2 kv heads), 3 layers, untied.
ModelConfig SmallLlama() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 112;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-5;
  return c;
}

struct Variant {
  std::string name;
  ModelConfig config;
};

std::vector<Variant> Variants() {
  std::vector<Variant> out;
  out.push_back({"llama", SmallLlama()});
  ModelConfig llama3 = SmallLlama();  // tied, llama3 rope scaling, biases
  llama3.tie_word_embeddings = true;
  llama3.attention_bias = true;
  llama3.rope_scaling.type = RopeScalingType::kLlama3;
  llama3.rope_scaling.factor = 8;
  llama3.rope_scaling.low_freq_factor = 1;
  llama3.rope_scaling.high_freq_factor = 4;
  llama3.rope_scaling.original_max_position_embeddings = 8;
  out.push_back({"llama3_tied_bias", llama3});
  ModelConfig mistral = SmallLlama();
  mistral.model_type = "mistral";
  mistral.sliding_window = 5;  // < seq_len: the window matters
  out.push_back({"mistral_sliding_window", mistral});
  ModelConfig qwen2 = SmallLlama();
  qwen2.model_type = "qwen2";
  out.push_back({"qwen2_bias", qwen2});
  ModelConfig qwen3 = SmallLlama();
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = true;
  qwen3.head_dim = 24;  // != hidden / heads, as in real Qwen3 models
  out.push_back({"qwen3_qk_norm", qwen3});
  return out;
}

// Deterministic micro-batches with some ignored labels.
std::vector<MicroBatch> MakeBatches(int count, int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<MicroBatch> out(count);
  for (MicroBatch& mb : out) {
    for (int64_t i = 0; i < b * t; ++i) {
      mb.input_ids.push_back(token(rng));
      mb.labels.push_back(i % 7 == 3 ? kIgnoreLabel : token(rng));
    }
  }
  return out;
}

// Runs the executor and the reference on the same weights and batches and
// returns the largest relative error over the loss and every gradient.
struct ParityResult {
  double loss_error = 0;
  double worst_grad_error = 0;
  std::string worst_grad;
};

ParityResult RunParity(const ModelConfig& config, const std::string& device, ComputeDtype dtype, double init_range,
                       int micro_batches, int64_t b, int64_t t) {
  ParityResult out;
  HostStoreOptions store_options;
  store_options.streaming_bf16 = dtype == ComputeDtype::kBf16;
  store_options.pin = device != "cpu";
  auto store = HostStore::Create(config, store_options);
  EXPECT_THAT(store, IsOk());
  if (!store.ok()) return out;
  (*store)->InitializeWeights(/*seed=*/7, /*initializer_range=*/init_range);
  auto runtime = DeviceRuntime::Create(device);
  EXPECT_THAT(runtime, IsOk());
  if (!runtime.ok()) return out;
  auto pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.compute_dtype = dtype;
  options.micro_batch = b;
  options.seq_len = t;
  options.loss_chunk_tokens = 7;  // several chunks, one of them partial
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
  EXPECT_THAT(executor, IsOk());
  if (!executor.ok()) return out;
  std::vector<MicroBatch> batches = MakeBatches(micro_batches, b, t, config.vocab_size, 11);
  std::vector<int64_t> final_blocks;
  auto result = (*executor)->ForwardBackward(batches, [&](int64_t block) {
    final_blocks.push_back(block);
  });
  EXPECT_THAT(result, IsOk());
  if (!result.ok()) return out;
  EXPECT_EQ(final_blocks.size(), static_cast<size_t>((*store)->num_blocks()));

  // Reference: the whole global batch in one autograd graph.
  testing::ReferenceParams params = testing::ParamsFromStore(**store);
  std::vector<int32_t> ids, labels;
  for (const MicroBatch& mb : batches) {
    ids.insert(ids.end(), mb.input_ids.begin(), mb.input_ids.end());
    labels.insert(labels.end(), mb.labels.begin(), mb.labels.end());
  }
  const int64_t rows = static_cast<int64_t>(batches.size()) * b;
  at::Tensor ids_t = at::tensor(ids).to(at::kLong).view({rows, t});
  at::Tensor labels_t = at::tensor(labels).to(at::kLong).view({rows, t});
  at::Tensor loss = testing::ReferenceLoss(config, params, ids_t, labels_t, dtype == ComputeDtype::kBf16);
  loss.backward();
  out.loss_error = std::abs(result->loss() - loss.item<double>()) / std::abs(loss.item<double>());
  const ModelLayout& layout = (*store)->layout();
  for (size_t blk = 0; blk < layout.blocks.size(); ++blk) {
    const float* grad = (*store)->grad(static_cast<int64_t>(blk));
    // Note [Near-cancelling gradients]: softmax is invariant to a shift of
    // all keys, so the k_proj bias gradient nearly cancels (only RoPE keeps
    // it from being exactly 0); its norm-relative error measures rounding
    // noise over a near-zero value. Each tensor's error is therefore taken
    // relative to max(its norm, 5% of its block's gradient norm).
    double block_norm_sq = 0;
    for (const ParamSpec& p : layout.blocks[blk].params) {
      block_norm_sq += params.at(p.hf_name).grad().to(at::kDouble).square().sum().item<double>();
    }
    for (const ParamSpec& p : layout.blocks[blk].params) {
      at::Tensor ours = at::from_blob(const_cast<float*>(grad + p.offset), p.shape, at::kFloat);
      const at::Tensor& ref = params.at(p.hf_name).grad();
      const double floor = 0.05 * std::sqrt(block_norm_sq);
      const double err = (ours.to(at::kDouble) - ref.to(at::kDouble)).norm().item<double>() /
                         std::max({ref.to(at::kDouble).norm().item<double>(), floor, 1e-30});
      if (err > out.worst_grad_error) {
        out.worst_grad_error = err;
        out.worst_grad = p.hf_name;
      }
    }
  }
  return out;
}

class ExecutorParityTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ExecutorParityTest, Fp32MatchesReferenceOnCpu) {
  // fp32 everywhere: only summation order differs, so 1e-5 relative.
  ParityResult r = RunParity(GetParam().config, "cpu", ComputeDtype::kFp32, 0.2, 1, 2, 12);
  EXPECT_LT(r.loss_error, 1e-5);
  EXPECT_LT(r.worst_grad_error, 1e-5) << r.worst_grad;
}

TEST_P(ExecutorParityTest, Bf16MatchesReferenceOnCpu) {
  // bf16 matmuls (8-bit mantissa) on both sides, rounded at different
  // points: 2e-2 relative.
  ParityResult r = RunParity(GetParam().config, "cpu", ComputeDtype::kBf16, 0.02, 1, 2, 12);
  EXPECT_LT(r.loss_error, 2e-2);
  EXPECT_LT(r.worst_grad_error, 2e-2) << r.worst_grad;
}

TEST_P(ExecutorParityTest, Fp32MatchesReferenceOnCuda) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  // cuBLAS without TF32 and the fused attention kernel: fp32 accumulation
  // in a different order, still within 1e-5.
  ParityResult r = RunParity(GetParam().config, "cuda", ComputeDtype::kFp32, 0.2, 2, 2, 12);
  EXPECT_LT(r.loss_error, 1e-5);
  EXPECT_LT(r.worst_grad_error, 1e-5) << r.worst_grad;
}

TEST_P(ExecutorParityTest, Bf16MatchesReferenceOnCuda) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  ParityResult r = RunParity(GetParam().config, "cuda", ComputeDtype::kBf16, 0.02, 2, 2, 12);
  EXPECT_LT(r.loss_error, 2e-2);
  EXPECT_LT(r.worst_grad_error, 2e-2) << r.worst_grad;
}

INSTANTIATE_TEST_SUITE_P(Variants, ExecutorParityTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

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
      batches[m].input_ids.assign(one[0].input_ids.begin() + m * n, one[0].input_ids.begin() + (m + 1) * n);
      batches[m].labels.assign(one[0].labels.begin() + m * n, one[0].labels.begin() + (m + 1) * n);
    }
    auto result = (*executor)->ForwardBackward(batches);
    ASSERT_THAT(result, IsOk());
    for (int64_t blk = 0; blk < (*store)->num_blocks(); ++blk) {
      grads->insert(grads->end(), (*store)->grad(blk), (*store)->grad(blk) + (*store)->block_numel(blk));
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
