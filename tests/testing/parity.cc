// Parity harness (see parity.h).
#include "tests/testing/parity.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "engine/model/fused_ops.h"
#include "engine/runtime/device_runtime.h"
#include "engine/step/executor.h"
#include "engine/store/host_store.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::testing {

using namespace ::megatrain::engine;  // NOLINT: test harness

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
  // Gemma 2: (1 + w) norms, four per layer, embedding scale, GeGLU, soft-
  // capped attention (caps small enough to bend the scores) and logits,
  // alternating sliding layers, tied, a padding row.
  ModelConfig gemma2 = SmallLlama();
  gemma2.model_type = "gemma2";
  gemma2.norm_kind = NormKind::kRmsOnePlusWeight;
  gemma2.sandwich_norms = true;
  gemma2.scale_embeddings = true;
  gemma2.hidden_activation = MlpActivation::kGeluTanh;
  gemma2.query_pre_attn_scalar = 24;  // != head_dim
  gemma2.attn_logit_softcapping = 2.0;
  gemma2.final_logit_softcapping = 3.0;
  gemma2.sliding_window = 5;
  gemma2.layer_types = {LayerType::kSlidingAttention, LayerType::kFullAttention,
                        LayerType::kSlidingAttention};
  gemma2.tie_word_embeddings = true;
  gemma2.has_pad_token_id = true;
  gemma2.pad_token_id = 3;
  out.push_back({"gemma2_softcap_tied", gemma2});
  // Gemma 3: + (1 + w) q/k norms, local RoPE base on sliding layers and a
  // scaled global one, no soft-capping; untied.
  ModelConfig gemma3 = gemma2;
  gemma3.model_type = "gemma3_text";
  gemma3.qk_norm = true;
  gemma3.attn_logit_softcapping = 0;
  gemma3.final_logit_softcapping = 0;
  gemma3.rope_theta = 1e6;
  gemma3.rope_local_base_freq = 10000;
  gemma3.rope_scaling.type = RopeScalingType::kLinear;
  gemma3.rope_scaling.factor = 4;
  gemma3.layer_types = {LayerType::kSlidingAttention, LayerType::kSlidingAttention,
                        LayerType::kFullAttention};
  gemma3.tie_word_embeddings = false;
  out.push_back({"gemma3_local_global_rope", gemma3});
  // Phi-3: fused qkv / gate_up, half the head rotated, LongRoPE past its
  // original length (long factors, attention factor), sliding window.
  ModelConfig phi3 = SmallLlama();
  phi3.model_type = "phi3";
  phi3.fused_qkv = true;
  phi3.fused_gate_up = true;
  phi3.partial_rotary_factor = 0.5;
  phi3.max_position_embeddings = 32;
  phi3.rope_scaling.type = RopeScalingType::kLongRope;
  phi3.rope_scaling.original_max_position_embeddings = 8;  // < seq_len 12
  phi3.rope_scaling.short_factor = {1.0, 1.2, 1.4, 1.6};
  phi3.rope_scaling.long_factor = {1.5, 3.0, 6.0, 12.0};
  phi3.sliding_window = 7;
  out.push_back({"phi3_fused_longrope", phi3});
  return out;
}

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

namespace {

// The executor under test and what it needs, from weights seeded as the
// parity tests expect (seed 7). Members are destroyed executor first.
struct ExecutorUnderTest {
  std::unique_ptr<HostStore> store;
  std::unique_ptr<DeviceRuntime> runtime;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<StreamingExecutor> executor;
};

// Null (with a recorded failure) when any part cannot be created.
std::unique_ptr<ExecutorUnderTest> MakeExecutorUnderTest(
    const ModelConfig& config, const std::string& device, ComputeDtype dtype, double init_range,
    int64_t b, int64_t t, int64_t loss_chunk_tokens, bool offload_activations, int resident_layers,
    bool resident_embedding, bool device_grad_accumulation, StepSchedule schedule, int wave,
    int64_t mlp_chunk_bytes, bool cuda_graphs, bool fused_kernels = false,
    int kept_graph_layers = 0) {
  auto out = std::make_unique<ExecutorUnderTest>();
  HostStoreOptions store_options;
  store_options.streaming_bf16 = dtype == ComputeDtype::kBf16;
  store_options.pin = device != "cpu";
  auto store = HostStore::Create(config, store_options);
  EXPECT_THAT(store, IsOk());
  if (!store.ok()) return nullptr;
  out->store = std::move(*store);
  out->store->InitializeWeights(/*seed=*/7, /*initializer_range=*/init_range);
  auto runtime = DeviceRuntime::Create(device);
  EXPECT_THAT(runtime, IsOk());
  if (!runtime.ok()) return nullptr;
  out->runtime = std::move(*runtime);
  out->pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.compute_dtype = dtype;
  options.micro_batch = b;
  options.seq_len = t;
  options.loss_chunk_tokens = loss_chunk_tokens;
  options.offload_activations = offload_activations;
  options.resident_layers = resident_layers;
  options.resident_embedding = resident_embedding;
  options.device_grad_accumulation = device_grad_accumulation;
  options.schedule = schedule;
  options.wave = wave;
  if (mlp_chunk_bytes > 0) options.mlp_chunk_bytes = mlp_chunk_bytes;
  options.cuda_graphs = cuda_graphs;
  options.fused_kernels = fused_kernels;
  options.kept_graph_layers = kept_graph_layers;
  auto executor =
      StreamingExecutor::Create(out->store.get(), out->runtime.get(), out->pool.get(), options);
  EXPECT_THAT(executor, IsOk());
  if (!executor.ok()) return nullptr;
  out->executor = std::move(*executor);
  return out;
}

// Records in `out` the worst gradient error of the store's gradients
// against the reference's (`params` after backward): Note [Near-cancelling
// gradients] below.
void CompareGradients(const HostStore& store, const ReferenceParams& params, ParityResult* out) {
  const ModelLayout& layout = store.layout();
  for (size_t blk = 0; blk < layout.blocks.size(); ++blk) {
    const float* grad = store.grad(static_cast<int64_t>(blk));
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
      if (err > out->worst_grad_error) {
        out->worst_grad_error = err;
        out->worst_grad = p.hf_name;
      }
    }
  }
}

}  // namespace

ParityResult RunParity(const ModelConfig& config, const std::string& device, ComputeDtype dtype,
                       double init_range, int micro_batches, int64_t b, int64_t t,
                       bool offload_activations, int resident_layers, bool resident_embedding,
                       bool device_grad_accumulation, StepSchedule schedule, int wave,
                       int64_t mlp_chunk_bytes, bool cuda_graphs, bool fused_kernels,
                       int kept_graph_layers) {
  ParityResult out;
  std::unique_ptr<ExecutorUnderTest> under_test = MakeExecutorUnderTest(
      config, device, dtype, init_range, b, t,
      /*loss_chunk_tokens=*/7,  // several chunks, one of them partial
      offload_activations, resident_layers, resident_embedding, device_grad_accumulation, schedule,
      wave, mlp_chunk_bytes, cuda_graphs, fused_kernels, kept_graph_layers);
  if (under_test == nullptr) return out;
  HostStore* store = under_test->store.get();
  StreamingExecutor* executor = under_test->executor.get();
  std::vector<MicroBatch> batches = MakeBatches(micro_batches, b, t, config.vocab_size, 11);
  std::vector<int64_t> final_blocks;
  std::vector<double> reported_sq(store->num_blocks(), -1.0);
  auto result = executor->ForwardBackward(batches, [&](const FinalGradient& g) {
    final_blocks.push_back(g.block);
    reported_sq[g.block] = g.grad_squared_norm;
  });
  EXPECT_THAT(result, IsOk());
  if (!result.ok()) return out;
  if (cuda_graphs && schedule == StepSchedule::kLayerMajor && wave > 2 && config.moe == nullptr) {
    // A wave of 3 or more passes each layer in one weight slot: warm-up,
    // capture, replays.
    EXPECT_GT(result->stats.cuda_graph_replays, 0);
  }
  EXPECT_THAT(executor->SyncResidentToStore(/*grads=*/true), IsOk());
  EXPECT_EQ(final_blocks.size(), static_cast<size_t>(store->num_blocks()));
  // The squared norm handed to the callback is that of the final gradient
  // (device-computed for one-piece blocks, Note [Gradient landing]).
  for (int64_t blk = 0; blk < store->num_blocks(); ++blk) {
    const float* g = store->grad(blk);
    double sq = 0;
    for (int64_t i = 0; i < store->block_numel(blk); ++i) sq += static_cast<double>(g[i]) * g[i];
    EXPECT_NEAR(reported_sq[blk], sq, 1e-9 + 1e-6 * sq) << "block " << blk;
  }

  // Reference: the whole global batch in one autograd graph.
  ReferenceParams params = ParamsFromStore(*store);
  std::vector<int32_t> ids, labels;
  for (const MicroBatch& mb : batches) {
    ids.insert(ids.end(), mb.input_ids.begin(), mb.input_ids.end());
    labels.insert(labels.end(), mb.labels.begin(), mb.labels.end());
  }
  const int64_t rows = static_cast<int64_t>(batches.size()) * b;
  at::Tensor ids_t = at::tensor(ids).to(at::kLong).view({rows, t});
  at::Tensor labels_t = at::tensor(labels).to(at::kLong).view({rows, t});
  at::Tensor loss = ReferenceLoss(config, params, ids_t, labels_t, dtype == ComputeDtype::kBf16);
  loss.backward();
  out.loss_error = std::abs(result->loss() - loss.item<double>()) / std::abs(loss.item<double>());
  CompareGradients(*store, params, &out);
  out.ran = true;
  return out;
}

std::vector<MicroBatch> MakePackedBatches(const std::vector<std::vector<int64_t>>& rows, int64_t b,
                                          int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<MicroBatch> out(rows.size() / static_cast<size_t>(b));
  for (size_t r = 0; r < rows.size(); ++r) {
    MicroBatch& mb = out[r / static_cast<size_t>(b)];
    int64_t filled = 0;
    for (const int64_t length : rows[r]) {
      std::vector<int32_t> doc(static_cast<size_t>(length));
      for (int32_t& id : doc) id = token(rng);
      for (int64_t i = 0; i < length; ++i) {
        mb.input_ids.push_back(doc[i]);
        mb.labels.push_back(i + 1 < length ? doc[i + 1] : kIgnoreLabel);
        mb.position_ids.push_back(static_cast<int32_t>(i));
      }
      filled += length;
    }
    EXPECT_EQ(filled, t) << "row " << r << " of the packed layout";
  }
  return out;
}

std::vector<std::vector<int64_t>> PackedParityRows() { return {{7, 5}, {3, 9}, {12}, {4, 4, 4}}; }

ParityResult RunPackedDocumentParity(const ModelConfig& config, const std::string& device,
                                     ComputeDtype dtype, double init_range,
                                     const std::vector<std::vector<int64_t>>& rows, int64_t b,
                                     int64_t t) {
  ParityResult out;
  std::unique_ptr<ExecutorUnderTest> under_test = MakeExecutorUnderTest(
      config, device, dtype, init_range, b, t, /*loss_chunk_tokens=*/7,
      /*offload_activations=*/false, /*resident_layers=*/0, /*resident_embedding=*/false,
      /*device_grad_accumulation=*/false, StepSchedule::kMicroBatchMajor, /*wave=*/1,
      /*mlp_chunk_bytes=*/0, /*cuda_graphs=*/false);
  if (under_test == nullptr) return out;
  const std::vector<MicroBatch> batches = MakePackedBatches(rows, b, t, config.vocab_size, 13);
  auto result = under_test->executor->ForwardBackward(batches);
  EXPECT_THAT(result, IsOk());
  if (!result.ok()) return out;
  // Reference: one row per document, filler (token 0, no label) after it.
  std::vector<int32_t> ids, labels;
  for (const MicroBatch& mb : batches) {
    for (size_t begin = 0; begin < mb.position_ids.size();) {
      size_t end = begin + 1;
      while (end < mb.position_ids.size() && mb.position_ids[end] != 0) ++end;
      ids.insert(ids.end(), mb.input_ids.begin() + begin, mb.input_ids.begin() + end);
      labels.insert(labels.end(), mb.labels.begin() + begin, mb.labels.begin() + end);
      ids.resize(ids.size() + static_cast<size_t>(t) - (end - begin), 0);
      labels.resize(labels.size() + static_cast<size_t>(t) - (end - begin), kIgnoreLabel);
      begin = end;
    }
  }
  const int64_t documents = static_cast<int64_t>(ids.size()) / t;
  ReferenceParams params = ParamsFromStore(*under_test->store);
  at::Tensor loss = ReferenceLoss(
      config, params, at::tensor(ids).to(at::kLong).view({documents, t}),
      at::tensor(labels).to(at::kLong).view({documents, t}), dtype == ComputeDtype::kBf16);
  loss.backward();
  out.loss_error = std::abs(result->loss() - loss.item<double>()) / std::abs(loss.item<double>());
  CompareGradients(*under_test->store, params, &out);
  out.ran = true;
  return out;
}

GradientRun RunGradientsOn(const ModelConfig& config, const std::string& device, ComputeDtype dtype,
                           double init_range, int64_t b, int64_t t,
                           const std::vector<MicroBatch>& batches) {
  GradientRun out;
  std::unique_ptr<ExecutorUnderTest> under_test = MakeExecutorUnderTest(
      config, device, dtype, init_range, b, t, /*loss_chunk_tokens=*/0,
      /*offload_activations=*/false, /*resident_layers=*/0, /*resident_embedding=*/false,
      /*device_grad_accumulation=*/false, StepSchedule::kMicroBatchMajor, /*wave=*/1,
      /*mlp_chunk_bytes=*/0, /*cuda_graphs=*/false);
  if (under_test == nullptr) return out;
  auto result = under_test->executor->ForwardBackward(batches);
  EXPECT_THAT(result, IsOk());
  if (!result.ok()) return out;
  const HostStore& store = *under_test->store;
  for (int64_t blk = 0; blk < store.num_blocks(); ++blk) {
    out.grads.insert(out.grads.end(), store.grad(blk), store.grad(blk) + store.block_numel(blk));
  }
  out.loss = result->loss();
  out.stats = result->stats;
  return out;
}

std::vector<ParityMode> ParityModes(int plain_micro_batches) {
  return {
      {"Fp32", ComputeDtype::kFp32, plain_micro_batches, false, 0},
      {"Bf16", ComputeDtype::kBf16, plain_micro_batches, false, 0},
      {"Fp32WithActivationOffload", ComputeDtype::kFp32, 2, true, 0},
      {"Bf16WithActivationOffload", ComputeDtype::kBf16, 2, true, 0},
      {"Fp32WithResidentLayers", ComputeDtype::kFp32, 2, false, 2},
      {"Bf16WithResidentLayers", ComputeDtype::kBf16, 2, false, 1},
      {"Fp32WithResidentEmbedding", ComputeDtype::kFp32, 2, false, 1, true},
      {"Bf16WithResidentEmbedding", ComputeDtype::kBf16, 2, false, 0, true},
      {"Fp32WithDeviceAccumulation", ComputeDtype::kFp32, 2, false, 0, false, true},
      {"Bf16WithDeviceAccumulation", ComputeDtype::kBf16, 3, false, 1, false, true},
      {"Fp32WithMlpChunks", ComputeDtype::kFp32, 2, false, 0, false, false,
       StepSchedule::kMicroBatchMajor, 1, kParityMlpChunkBytes},
      {"Bf16WithMlpChunksAndActivationOffload", ComputeDtype::kBf16, 2, true, 0, false, false,
       StepSchedule::kMicroBatchMajor, 1, kParityMlpChunkBytes},
      {"Fp32WithCudaGraphs", ComputeDtype::kFp32, 3, false, 0, false, false,
       StepSchedule::kMicroBatchMajor, 1, 0, /*cuda_graphs=*/true},
      {"Bf16WithCudaGraphsAndResidentLayers", ComputeDtype::kBf16, 3, false, 1, false, true,
       StepSchedule::kMicroBatchMajor, 1, 0, /*cuda_graphs=*/true},
      // Note [Kept layer graphs]: two of three layers' forward graphs kept
      // (a streamed layer between them and the head), one with the MLP in
      // chunks and the embedding resident in bf16.
      {"Fp32WithKeptGraphs", ComputeDtype::kFp32, 2, false, 2, false, false,
       StepSchedule::kMicroBatchMajor, 1, 0, false, false, /*kept_graph_layers=*/2},
      {"Bf16WithKeptGraphsMlpChunksAndResidentEmbedding", ComputeDtype::kBf16, 2, false, 1, true,
       false, StepSchedule::kMicroBatchMajor, 1, kParityMlpChunkBytes, false, false,
       /*kept_graph_layers=*/1},
  };
}

std::vector<ParityMode> LayerMajorParityModes() {
  constexpr ComputeDtype kFp32 = ComputeDtype::kFp32, kBf16 = ComputeDtype::kBf16;
  constexpr StepSchedule kLm = StepSchedule::kLayerMajor;
  // name, dtype, micro-batches, offload, resident layers, resident
  // embedding, device accumulation, schedule, wave.
  return {
      {"Fp32Accumulation1", kFp32, 1, false, 0, false, false, kLm, 1},
      {"Fp32Accumulation3", kFp32, 3, false, 0, false, false, kLm, 3},
      {"Bf16Accumulation4", kBf16, 4, false, 0, false, false, kLm, 4},
      {"Fp32Accumulation4Wave3", kFp32, 4, false, 0, false, false, kLm, 3},
      {"Fp32WithActivationOffloadWave2", kFp32, 4, true, 0, false, false, kLm, 2},
      {"Bf16WithActivationOffload", kBf16, 3, true, 0, false, false, kLm, 3},
      {"Fp32WithResidentLayers", kFp32, 3, false, 2, false, false, kLm, 3},
      {"Bf16WithResidentLayersWave3", kBf16, 4, false, 1, false, false, kLm, 3},
      {"Fp32WithResidentEmbedding", kFp32, 3, true, 1, true, false, kLm, 3},
      {"Bf16WithResidentEmbedding", kBf16, 3, false, 0, true, false, kLm, 3},
      {"Fp32WithDeviceAccumulationWave2", kFp32, 4, false, 0, false, true, kLm, 2},
      {"Bf16WithDeviceAccumulationWave2", kBf16, 3, false, 1, false, true, kLm, 2},
      {"Fp32WithMlpChunksWave2", kFp32, 3, false, 0, false, false, kLm, 2, kParityMlpChunkBytes},
      {"Bf16WithMlpChunksAndDeviceAccumulation", kBf16, 3, false, 1, false, true, kLm, 3,
       kParityMlpChunkBytes},
      {"Fp32WithCudaGraphsWave2", kFp32, 4, false, 1, false, false, kLm, 2, 0, true},
      {"Bf16WithCudaGraphsAndActivationOffload", kBf16, 3, true, 0, false, false, kLm, 3,
       kParityMlpChunkBytes, true},
      // Note [Kept layer graphs]: a wave's graphs alive at once, every
      // layer resident; and with CUDA graphs for the layer that is not kept.
      {"Fp32WithKeptGraphsWave3", kFp32, 3, false, 3, false, false, kLm, 3, 0, false, false, 3},
      {"Bf16WithKeptGraphsAndCudaGraphsWave2", kBf16, 4, false, 2, false, true, kLm, 2, 0, true,
       false, 1},
  };
}

std::vector<ParityMode> FusedKernelParityModes() {
  if (!FusedKernelsCompiled()) return {};
  constexpr ComputeDtype kBf16 = ComputeDtype::kBf16;
  constexpr StepSchedule kMbm = StepSchedule::kMicroBatchMajor, kLm = StepSchedule::kLayerMajor;
  std::vector<ParityMode> modes = {
      {"Bf16Fused", kBf16, 2, false, 0},
      {"Bf16FusedWithMlpChunksAndActivationOffload", kBf16, 2, true, 0, false, false, kMbm, 1,
       kParityMlpChunkBytes},
      {"Bf16FusedWithResidentLayersAndDeviceAccumulation", kBf16, 3, false, 1, true, true},
      {"Bf16FusedWithCudaGraphs", kBf16, 3, false, 0, false, false, kMbm, 1, 0, true},
      {"Bf16FusedLayerMajorAccumulation4", kBf16, 4, false, 0, false, false, kLm, 4},
      {"Bf16FusedWithKeptGraphs", kBf16, 2, false, 2, false, false, kMbm, 1, 0, false, false, 2},
  };
  for (ParityMode& mode : modes) mode.fused_kernels = true;
  return modes;
}

void ExpectParity(const Variant& variant, const std::string& device, const ParityMode& mode) {
  const bool bf16 = mode.dtype == ComputeDtype::kBf16;
  const double tolerance = bf16 ? 2e-2 : 1e-5;
  ParityResult r =
      RunParity(variant.config, device, mode.dtype, bf16 ? 0.02 : 0.2, mode.micro_batches, 2, 12,
                mode.offload_activations, mode.resident_layers, mode.resident_embedding,
                mode.device_grad_accumulation, mode.schedule, mode.wave, mode.mlp_chunk_bytes,
                mode.cuda_graphs, mode.fused_kernels, mode.kept_graph_layers);
  ASSERT_TRUE(r.ran);
  EXPECT_LT(r.loss_error, tolerance);
  EXPECT_LT(r.worst_grad_error, tolerance) << r.worst_grad;
}

GradientRun RunGradients(const ModelConfig& config, const std::string& device, ComputeDtype dtype,
                         double init_range, int micro_batches, int64_t b, int64_t t,
                         bool offload_activations, int resident_layers, bool resident_embedding,
                         bool device_grad_accumulation, StepSchedule schedule, int wave,
                         bool cuda_graphs, int kept_graph_layers) {
  GradientRun out;
  std::unique_ptr<ExecutorUnderTest> under_test = MakeExecutorUnderTest(
      config, device, dtype, init_range, b, t, /*loss_chunk_tokens=*/0, offload_activations,
      resident_layers, resident_embedding, device_grad_accumulation, schedule, wave,
      /*mlp_chunk_bytes=*/0, cuda_graphs, /*fused_kernels=*/false, kept_graph_layers);
  if (under_test == nullptr) return out;
  HostStore* store = under_test->store.get();
  StreamingExecutor* executor = under_test->executor.get();
  auto result = executor->ForwardBackward(MakeBatches(micro_batches, b, t, config.vocab_size, 11));
  EXPECT_THAT(result, IsOk());
  if (!result.ok()) return out;
  EXPECT_THAT(executor->SyncResidentToStore(/*grads=*/true), IsOk());
  for (int64_t blk = 0; blk < store->num_blocks(); ++blk) {
    out.grads.insert(out.grads.end(), store->grad(blk), store->grad(blk) + store->block_numel(blk));
  }
  out.loss = result->loss();
  out.stats = result->stats;
  return out;
}

}  // namespace megatrain::testing
