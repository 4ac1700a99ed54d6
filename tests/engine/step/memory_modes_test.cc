// The host-memory modes of docs/operations.md's sizing table give the same
// bits as the default ones and hold exactly their plan:
//   Note [Weight streaming] (engine/step/weight_slots.h): streaming the fp32
//   master and casting on the device gives what streaming the host's bf16
//   copy gives, with 2 bytes/param less host memory; so does casting it on
//   the host (Note [Host cast] in engine/step/host_cast.h) with the copy's
//   H2D bytes;
//   Note [Bounded gradient staging] (engine/step/grad_lander.h): host
//   accumulation through a bounded chunk ring sums as whole-block staging;
//   Note [Gradient ring] (engine/step/grad_lander.h): without clipping,
//   gradients consumed from a bounded pinned ring give the arena's result;
//   admission's footprint (EstimateFootprintForConfig) equals what the
//   store and the executor allocate in every mode.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/device_runtime.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/executor.h"
#include "engine/step/grad_lander.h"
#include "engine/step/host_cast.h"
#include "engine/formats/hf_model.h"
#include "engine/step/trainer.h"
#include "engine/step/weight_slots.h"
#include "engine/job/training_job.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The host's bf16 copy (FloatToBf16) and LibTorch's cast (what the device
// runs; on the CPU c10's round_to_nearest_even, on CUDA cvt.rn.bf16.f32)
// agree on every non-NaN float: ties to even, subnormals, overflow to inf.
TEST(Bf16RoundingTest, HostCopyEqualsLibTorchCast) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.5f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               FromBits(0x3f808000u),   // tie, even below: down
                               FromBits(0x3f818000u),   // tie, odd below: up
                               FromBits(0x3f808001u),   // above the tie: up
                               FromBits(0x3f807fffu),   // below the tie: down
                               FromBits(0x7f7f8000u),   // tie at the top: to inf
                               FromBits(0x00008000u),   // subnormal tie
                               FromBits(0x80018000u)};  // negative subnormal tie
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = FromBits(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) values.push_back(f);
  }
  const at::Tensor cast =
      at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kFloat)
          .to(at::kBFloat16);
  const auto* device_bits = static_cast<const uint16_t*>(cast.data_ptr());
  int64_t mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (FloatToBf16(values[i]) != device_bits[i]) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

TrainerOptions Bf16Options(double max_grad_norm, WeightStream stream) {
  TrainerOptions o;
  o.compute_dtype = ComputeDtype::kBf16;
  o.weight_stream = stream;
  o.micro_batch = kB;
  o.seq_len = kT;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.max_grad_norm = max_grad_norm;
  o.threads = 2;
  o.gradient_accumulation_steps = 2;
  return o;
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> state;  // master, exp_avg, exp_avg_sq of every block
  HostStoreBytes bytes;
  int64_t steps = 0;  // the trainer's step() at the end
  int skipped = 0;    // steps skipped (StepResult::skipped)
  int partial = 0;    // of them partial
};

TrainedRun Train(const ModelConfig& config, const TrainerOptions& options) {
  TrainedRun run;
  auto trainer = Trainer::Create(config, options, 5);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return run;
  for (int s = 0; s < 3; ++s) {
    const auto result = (*trainer)->Step(MakeBatches(2, kB, kT, config.vocab_size, 40 + s));
    EXPECT_THAT(result, IsOk());
    if (!result.ok()) return run;
    run.losses.push_back(result->loss);
  }
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  HostStore& store = (*trainer)->store();
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    for (const float* data : {store.master(b), store.exp_avg(b), store.exp_avg_sq(b)}) {
      run.state.insert(run.state.end(), data, data + store.block_numel(b));
    }
  }
  run.bytes = store.bytes();
  return run;
}

// Three bf16 steps of two micro-batches, with and without clipping, with a
// resident layer (loaded by a cast on the device too): the same losses and
// the same master and moments, bit for bit; no bf16 copy in host memory.
TEST(WeightStreamTest, Fp32MasterStreamIsBitIdenticalToTheBf16Copy) {
  const ModelConfig config = SmallLlama();
  for (const double clip : {0.0, 1.0}) {
    for (const int resident : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("max_grad_norm ", clip, " resident_layers ", resident));
      TrainerOptions copy = Bf16Options(clip, WeightStream::kBf16);
      copy.resident_layers = resident;
      TrainerOptions stream = copy;
      stream.weight_stream = WeightStream::kFp32;
      const TrainedRun a = Train(config, copy);
      const TrainedRun b = Train(config, stream);
      ASSERT_EQ(a.losses.size(), 3u);
      EXPECT_EQ(a.losses, b.losses);
      ASSERT_EQ(a.state.size(), b.state.size());
      EXPECT_EQ(std::memcmp(a.state.data(), b.state.data(), a.state.size() * 4), 0);
      EXPECT_GT(a.bytes.streaming, 0);
      EXPECT_EQ(b.bytes.streaming, 0);
      EXPECT_EQ(a.bytes.master, b.bytes.master);
    }
  }
}

// Note [Host cast] (engine/step/host_cast.h): the fp32 master cast by host
// threads into pinned staging just before each load gives the bf16 copy's
// results bit for bit, over three steps of two micro-batches each (gradient
// accumulation), with and without clipping, with and without a resident
// layer: the same losses, the same master and moments. (Each cast must
// read the master after its block's AdamW of the previous step: here the
// optimizer is usually done before the cast, so a missing wait would
// rarely show; HostCastStagerTest.CastsABlockOnlyAfterItsGateReturns in
// host_cast_test.cc checks that order deterministically.) The host holds
// no bf16 copy, as with weight_stream fp32. (Chunks smaller than a block:
// the next test.)
TEST(WeightStreamTest, HostCastIsBitIdenticalToTheBf16Copy) {
  const ModelConfig config = SmallLlama();
  for (const double clip : {0.0, 1.0}) {
    for (const int resident : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("max_grad_norm ", clip, " resident_layers ", resident));
      TrainerOptions copy = Bf16Options(clip, WeightStream::kBf16);
      copy.resident_layers = resident;
      TrainerOptions cast = copy;
      cast.weight_stream = WeightStream::kHostCast;
      const TrainedRun a = Train(config, copy);
      const TrainedRun b = Train(config, cast);
      ASSERT_EQ(a.losses.size(), 3u);
      EXPECT_EQ(a.losses, b.losses);
      EXPECT_NE(a.losses[0], a.losses[1]);  // the updates changed the weights
      ASSERT_EQ(a.state.size(), b.state.size());
      EXPECT_EQ(std::memcmp(a.state.data(), b.state.data(), a.state.size() * 4), 0);
      EXPECT_EQ(b.bytes.streaming, 0);
      EXPECT_EQ(a.bytes.master, b.bytes.master);
    }
  }
}

// One ForwardBackward per weight stream: host_cast in chunks smaller than
// a block (the ring wraps, the last chunk of a block is partial) loads the
// bf16 copy's weights (same loss and gradients, bit for bit) with its H2D
// weight bytes, half of fp32's; each executor holds exactly its plan (the
// pinned ring: one largest block plus one chunk; no device cast staging).
TEST(WeightStreamTest, HostCastMovesHalfTheFp32WeightBytesAndHoldsItsPlan) {
  const ModelConfig config = SmallLlama();
  const std::vector<MicroBatch> batches = MakeBatches(2, kB, kT, config.vocab_size, 11);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(2);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  std::vector<int64_t> weight_bytes;
  for (const WeightStream stream :
       {WeightStream::kBf16, WeightStream::kFp32, WeightStream::kHostCast}) {
    SCOPED_TRACE(WeightStreamName(stream));
    HostStoreOptions store_options;
    store_options.streaming_bf16 = KeepsBf16Copy(stream);
    auto store = HostStore::Create(config, store_options);
    ASSERT_THAT(store, IsOk());
    (*store)->InitializeWeights(3);
    ExecutorOptions options;
    options.compute_dtype = ComputeDtype::kBf16;
    options.micro_batch = kB;
    options.seq_len = kT;
    options.stream_fp32_master = !KeepsBf16Copy(stream);
    options.host_cast = stream == WeightStream::kHostCast;
    options.host_cast_chunk_elements = 1000;
    auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
    ASSERT_THAT(executor, IsOk());
    const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options);
    const HostCastRing ring = HostCastRingOf(plan.max_slot_numel, 1000);
    EXPECT_EQ(plan.host_cast_staging_bytes, options.host_cast ? ring.pinned_bytes() : 0);
    EXPECT_EQ(plan.cast_staging_bytes,
              stream == WeightStream::kFp32 ? 4 * CastStagingNumel(plan.max_slot_numel) : 0);
    EXPECT_EQ((*executor)->slot_device_bytes(), plan.device_bytes());
    EXPECT_EQ((*executor)->staging_host_bytes(), plan.pinned_bytes());
    auto result = (*executor)->ForwardBackward(batches, {});
    ASSERT_THAT(result, IsOk());
    losses.push_back(result->loss());
    std::vector<float> g;
    for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
      g.insert(g.end(), (*store)->grad(b), (*store)->grad(b) + (*store)->block_numel(b));
    }
    grads.push_back(std::move(g));
    weight_bytes.push_back(result->stats.h2d_weight_bytes);
    EXPECT_LT(result->stats.h2d_weight_bytes, result->stats.h2d_bytes);
  }
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(losses[1], losses[2]);
  EXPECT_GT(weight_bytes[0], 0);
  EXPECT_EQ(weight_bytes[2], weight_bytes[0]);
  EXPECT_EQ(weight_bytes[1], 2 * weight_bytes[2]);
  for (const auto& g : {grads[1], grads[2]}) {
    ASSERT_EQ(grads[0].size(), g.size());
    EXPECT_EQ(std::memcmp(grads[0].data(), g.data(), g.size() * 4), 0);
  }
}

// The cast in chunks smaller than a block (a partial last chunk) loads the
// same weights: one ForwardBackward gives the same loss and gradients as
// the bf16 copy, and the executor holds exactly its plan.
TEST(WeightStreamTest, ChunkedCastMatchesTheCopyAndHoldsItsPlan) {
  const ModelConfig config = SmallLlama();
  const std::vector<MicroBatch> batches = MakeBatches(2, kB, kT, config.vocab_size, 11);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(2);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  std::vector<int64_t> h2d_bytes;
  for (const bool fp32 : {false, true}) {
    HostStoreOptions store_options;
    store_options.streaming_bf16 = !fp32;
    auto store = HostStore::Create(config, store_options);
    ASSERT_THAT(store, IsOk());
    (*store)->InitializeWeights(3);
    ExecutorOptions options;
    options.compute_dtype = ComputeDtype::kBf16;
    options.micro_batch = kB;
    options.seq_len = kT;
    options.stream_fp32_master = fp32;
    options.cast_chunk_elements = 1000;  // several chunks per block, the last partial
    auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
    ASSERT_THAT(executor, IsOk());
    const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options);
    EXPECT_EQ(plan.cast_staging_bytes, fp32 ? 4000 : 0);
    EXPECT_EQ((*executor)->slot_device_bytes(), plan.device_bytes());
    EXPECT_EQ((*executor)->staging_host_bytes(), plan.pinned_bytes());
    auto result = (*executor)->ForwardBackward(batches, {});
    ASSERT_THAT(result, IsOk());
    losses.push_back(result->loss());
    std::vector<float> g;
    for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
      g.insert(g.end(), (*store)->grad(b), (*store)->grad(b) + (*store)->block_numel(b));
    }
    grads.push_back(std::move(g));
    h2d_bytes.push_back(result->stats.h2d_bytes);
  }
  EXPECT_EQ(losses[0], losses[1]);
  // fp32 streaming moves 4 bytes per streamed weight instead of 2.
  EXPECT_GT(h2d_bytes[1], h2d_bytes[0]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4), 0);
}

// Host accumulation over three micro-batches through chunks smaller than
// a block (several per block, the last partial) gives the gradients of
// one-chunk landings bit for bit, and the executor holds its plan.
TEST(GradStagingTest, ChunkedHostAccumulationIsBitIdentical) {
  const ModelConfig config = SmallLlama();
  const std::vector<MicroBatch> batches = MakeBatches(3, kB, kT, config.vocab_size, 21);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(2);
  std::vector<std::vector<float>> grads;
  for (const int64_t chunk : {int64_t{1} << 30, int64_t{777}}) {
    SCOPED_TRACE(absl::StrCat("grad_chunk_elements ", chunk));
    auto store = HostStore::Create(config, HostStoreOptions{});
    ASSERT_THAT(store, IsOk());
    (*store)->InitializeWeights(4);
    ExecutorOptions options;
    options.micro_batch = kB;
    options.seq_len = kT;
    options.grad_chunk_elements = chunk;
    auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
    ASSERT_THAT(executor, IsOk());
    const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options);
    EXPECT_EQ((*executor)->staging_host_bytes(), plan.pinned_bytes());
    // The ring: kGradChunkBuffers chunks of min(chunk, largest block) fp32;
    // and the resident norm ring (Note [Resident norm ring] in
    // engine/step/grad_lander.h).
    const int64_t slot_bytes = kB * kT * config.hidden_size * 4 + 8;
    EXPECT_EQ(plan.grad_staging_bytes,
              2 * slot_bytes + kGradChunkBuffers * 4 * std::min(chunk, plan.max_slot_numel) +
                  kResidentNormSlots * 8);
    ASSERT_THAT((*executor)->ForwardBackward(batches, {}), IsOk());
    std::vector<float> g;
    for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
      g.insert(g.end(), (*store)->grad(b), (*store)->grad(b) + (*store)->block_numel(b));
    }
    grads.push_back(std::move(g));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4), 0);
}

TrainerOptions RingOptions(GradientLanding landing, int64_t accumulation) {
  TrainerOptions o = Bf16Options(0.0, WeightStream::kFp32);
  o.gradient_landing = landing;
  o.gradient_accumulation_steps = accumulation;
  return o;
}

TrainedRun TrainSteps(const ModelConfig& config, const TrainerOptions& options,
                      int64_t micro_batches, bool* ring) {
  TrainedRun run;
  auto trainer = Trainer::Create(config, options, 5);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return run;
  *ring = (*trainer)->gradient_ring();
  for (int s = 0; s < 3; ++s) {
    const auto result = (*trainer)->Step(
        MakeBatches(static_cast<int>(micro_batches), kB, kT, config.vocab_size, 60 + s));
    EXPECT_THAT(result, IsOk());
    if (!result.ok()) return run;
    run.losses.push_back(result->loss);
    run.skipped += result->skipped;
    run.partial += result->partial;
  }
  run.steps = (*trainer)->step();
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  HostStore& store = (*trainer)->store();
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    for (const float* data : {store.master(b), store.exp_avg(b), store.exp_avg_sq(b)}) {
      run.state.insert(run.state.end(), data, data + store.block_numel(b));
    }
  }
  run.bytes = store.bytes();
  return run;
}

// Without clipping, updates read the gradients from the ring instead of
// the arena: the same losses, masters and moments bit for bit, with one
// micro-batch per step, with accumulation summed on the device, with a
// one-wave layer-major schedule, with a resident layer, with a step whose
// loss is NaN (skipped) and one whose embedding gradient is inf (partial:
// the blocks before it keep their update); the arena shrinks to the
// embedding's, and to nothing with the embedding resident. With a
// vocabulary of 1024 the untied head (65,600 elements) outgrows a layer
// (33,920): it lands in two pieces of a layer's buffer, and with 4096
// (262,208) in eight, each buffer of the ring (Note [Gradient ring])
// taking several pieces of the head; optimizer slices of 1000 elements
// cut pieces off their buffers' starts. A tied table never enters the
// ring (its gradient stays in the arena, or on the device when resident).
TEST(GradientRingTest, RingIsBitIdenticalToTheArena) {
  struct Mode {
    std::string name;
    int64_t accumulation;
    int device_grad_accumulation;
    bool layer_major;
    int resident_layers;
    int64_t poison_step;
    int resident_embedding;
    int64_t vocab_size;
    bool tied = false;
    NonFiniteInjection::Kind poison = NonFiniteInjection::Kind::kLoss;
    int64_t slice = 0;  // optimizer_slice_elements; 0: the default
  };
  const auto kGrad = NonFiniteInjection::Kind::kGradient;
  const Mode modes[] = {
      {"one micro-batch", 1, 0, false, 0, 0, 0, 96},
      {"device accumulation", 2, 1, false, 0, 0, 0, 96},
      {"layer-major one wave", 2, 0, true, 0, 0, 0, 96},
      {"resident layer", 1, 0, false, 1, 0, 0, 96},
      {"NaN loss at step 2", 1, 0, false, 0, 2, 0, 96},
      {"resident embedding", 1, 0, false, 0, 0, 1, 96},
      {"head in two pieces", 1, 0, false, 0, 0, 0, 1024},
      {"head in two pieces, embedding resident", 2, 1, false, 1, 0, 1, 1024},
      {"head in eight pieces", 1, 0, false, 0, 0, 0, 4096},
      {"head in eight pieces, device accumulation", 2, 1, false, 0, 0, 0, 4096},
      {"head in eight pieces, layer-major one wave", 2, 0, true, 0, 0, 0, 4096},
      {"head in eight pieces, slices of 1000", 1, 0, false, 0, 0, 0, 4096, false,
       NonFiniteInjection::Kind::kLoss, 1000},
      {"head in eight pieces, NaN loss at step 2", 1, 0, false, 0, 2, 0, 4096},
      {"head in eight pieces, inf embedding gradient at step 2", 1, 0, false, 0, 2, 0, 4096, false,
       kGrad},
      {"tied, one micro-batch", 1, 0, false, 0, 0, 0, 4096, true},
      {"tied, NaN loss at step 2", 1, 0, false, 0, 2, 0, 4096, true},
      {"tied, embedding resident, device accumulation", 2, 1, false, 0, 0, 1, 4096, true},
  };
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    ModelConfig config = SmallLlama();
    config.vocab_size = mode.vocab_size;
    config.tie_word_embeddings = mode.tied;
    TrainerOptions arena = RingOptions(GradientLanding::kArena, mode.accumulation);
    arena.device_grad_accumulation = mode.device_grad_accumulation;
    arena.resident_layers = mode.resident_layers;
    arena.resident_embedding = mode.resident_embedding;
    if (mode.slice > 0) arena.optimizer_slice_elements = mode.slice;
    if (mode.layer_major) {
      arena.step_schedule = StepSchedule::kLayerMajor;
      arena.wave = static_cast<int>(mode.accumulation);
    }
    arena.debug_nonfinite.step = mode.poison_step;
    arena.debug_nonfinite.kind = mode.poison;
    TrainerOptions ring = arena;
    ring.gradient_landing = GradientLanding::kRing;
    bool arena_ring = true, ring_ring = false;
    const TrainedRun a = TrainSteps(config, arena, mode.accumulation, &arena_ring);
    const TrainedRun b = TrainSteps(config, ring, mode.accumulation, &ring_ring);
    EXPECT_FALSE(arena_ring);
    EXPECT_TRUE(ring_ring);
    ASSERT_EQ(a.losses.size(), 3u);
    ASSERT_EQ(b.losses.size(), 3u);
    for (int s = 0; s < 3; ++s) {
      if (std::isnan(a.losses[s])) {
        EXPECT_TRUE(std::isnan(b.losses[s]));
      } else {
        EXPECT_EQ(a.losses[s], b.losses[s]);
      }
    }
    EXPECT_EQ(a.steps, b.steps);
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(a.partial, b.partial);
    if (mode.poison_step > 0) {
      EXPECT_EQ(b.skipped, 1);
      EXPECT_EQ(b.partial, mode.poison == kGrad ? 1 : 0);
    }
    ASSERT_EQ(a.state.size(), b.state.size());
    EXPECT_EQ(std::memcmp(a.state.data(), b.state.data(), a.state.size() * 4), 0);
    const ModelLayout layout = ModelLayout::Create(config);
    const int64_t embedding = layout.blocks[layout.embedding_block()].numel;
    EXPECT_EQ(b.bytes.grad, mode.resident_embedding ? 0 : (embedding + 1023) / 1024 * 1024 * 4);
    EXPECT_GT(a.bytes.grad, b.bytes.grad);
  }
}

// Mixture-of-experts models (the fixtures' mixtral, qwen2_moe, qwen3_moe
// and gpt_oss configs: 3-4 layers of 4-8 experts, the router's aux loss
// on): the ring against the arena, bit for bit, with one micro-batch, with
// accumulation summed on the device and with a one-wave layer-major pass.
// A MoE layer (every expert) is the largest block and sizes the ring.
TEST(GradientRingTest, MixtureOfExpertsRingIsBitIdenticalToTheArena) {
  for (const std::string family : {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"}) {
    auto loaded = LoadHfConfig(std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family);
    ASSERT_THAT(loaded, IsOk());
    const ModelConfig config = *loaded;
    ASSERT_NE(config.moe, nullptr);
    for (const int mode : {0, 1, 2}) {
      SCOPED_TRACE(family + (mode == 0   ? ": one micro-batch"
                             : mode == 1 ? ": device accumulation"
                                         : ": layer-major"));
      const int64_t accumulation = mode == 0 ? 1 : 2;
      TrainerOptions arena = RingOptions(GradientLanding::kArena, accumulation);
      arena.compute_dtype = ComputeDtype::kFp32;
      arena.weight_stream = WeightStream::kBf16;
      arena.resident_layers = 0;
      arena.resident_embedding = 0;
      arena.device_grad_accumulation = mode == 1 ? 1 : 0;
      if (mode == 2) {
        arena.step_schedule = StepSchedule::kLayerMajor;
        arena.wave = 2;
      }
      TrainerOptions ring = arena;
      ring.gradient_landing = GradientLanding::kRing;
      bool arena_ring = true, ring_ring = false;
      const TrainedRun a = TrainSteps(config, arena, accumulation, &arena_ring);
      const TrainedRun b = TrainSteps(config, ring, accumulation, &ring_ring);
      EXPECT_FALSE(arena_ring);
      EXPECT_TRUE(ring_ring);
      ASSERT_EQ(a.losses.size(), 3u);
      ASSERT_EQ(b.losses.size(), 3u);
      for (int s = 0; s < 3; ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
      ASSERT_EQ(a.state.size(), b.state.size());
      EXPECT_EQ(std::memcmp(a.state.data(), b.state.data(), a.state.size() * 4), 0);
      EXPECT_GT(a.bytes.grad, b.bytes.grad);
    }
  }
}

TEST(GradientRingTest, RingIsRefusedWhereGradientsWouldNotBeFinal) {
  const ModelConfig config = SmallLlama();
  TrainerOptions clipped = RingOptions(GradientLanding::kRing, 1);
  clipped.max_grad_norm = 1.0;
  EXPECT_THAT(Trainer::Create(config, clipped, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs max_grad_norm 0")));
  TrainerOptions host_sums = RingOptions(GradientLanding::kRing, 2);
  host_sums.device_grad_accumulation = 0;
  host_sums.step_schedule = StepSchedule::kMicroBatchMajor;
  EXPECT_THAT(Trainer::Create(config, host_sums, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("summed on the device")));
  // Auto falls back to the arena there.
  host_sums.gradient_landing = GradientLanding::kAuto;
  auto trainer = Trainer::Create(config, host_sums, 1);
  ASSERT_THAT(trainer, IsOk());
  EXPECT_FALSE((*trainer)->gradient_ring());
  // A tied table on the host takes lm_head's gradient once per micro-batch
  // (summed in its arena), even with device accumulation.
  ModelConfig tied = config;
  tied.tie_word_embeddings = true;
  TrainerOptions tied_sums = RingOptions(GradientLanding::kRing, 2);
  tied_sums.device_grad_accumulation = 1;
  EXPECT_THAT(Trainer::Create(tied, tied_sums, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tied embedding table")));
  tied_sums.gradient_landing = GradientLanding::kAuto;
  auto tied_trainer = Trainer::Create(tied, tied_sums, 1);
  ASSERT_THAT(tied_trainer, IsOk());
  EXPECT_FALSE((*tied_trainer)->gradient_ring());
  // A trainer with the ring refuses a step with more micro-batches than
  // the device sums, before any work.
  TrainerOptions one = RingOptions(GradientLanding::kAuto, 1);
  auto ring_trainer = Trainer::Create(config, one, 1);
  ASSERT_THAT(ring_trainer, IsOk());
  ASSERT_TRUE((*ring_trainer)->gradient_ring());
  EXPECT_THAT((*ring_trainer)->Step(MakeBatches(2, kB, kT, config.vocab_size, 3)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("would add gradients on the host")));
}

// What one ForwardBackward hands its callback, per block: every call
// (FinalGradient) and the gradient put together from them.
struct HandedOn {
  std::vector<std::vector<FinalGradient>> calls;  // data and release cleared
  std::vector<std::vector<float>> grads;
  int max_held = 0;  // ring pieces handed on and not yet released, at most
};

// Note [Gradient ring]: the executor hands a block larger than a ring
// buffer (the untied head of a 4096-token vocabulary, 262,208 elements,
// against a layer's 33,920) on in eight pieces, [0, n), [n, 2n), ...,
// first and last marked, each carrying the whole block's squared norm, and
// every other block in one; put together, the pieces are the arena's
// gradient bit for bit, with the arena's norms. A consumer that releases
// each piece late, from another thread, holds at most kGradRingBuffers
// pieces; a pass with no callback frees the buffers itself.
TEST(GradientRingTest, LargeBlockIsHandedOnInPiecesEqualToTheArena) {
  ModelConfig config = SmallLlama();
  config.vocab_size = 4096;
  const ModelLayout layout = ModelLayout::Create(config);
  const int64_t blocks = static_cast<int64_t>(layout.blocks.size());
  const int64_t layer = layout.blocks[layout.layer_block(0)].numel;
  const int64_t head = layout.head_block();
  const int64_t head_pieces = (layout.blocks[head].numel + layer - 1) / layer;
  ASSERT_EQ(head_pieces, 8);
  const std::vector<MicroBatch> batches = MakeBatches(1, kB, kT, config.vocab_size, 31);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(2);
  std::vector<HandedOn> runs;
  for (const bool ring : {false, true}) {
    SCOPED_TRACE(ring ? "ring" : "arena");
    HostStoreOptions store_options;
    store_options.gradient_ring = ring;
    auto store = HostStore::Create(config, store_options);
    ASSERT_THAT(store, IsOk());
    (*store)->InitializeWeights(6);
    ExecutorOptions options;
    options.micro_batch = kB;
    options.seq_len = kT;
    options.gradient_ring = ring;
    auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
    ASSERT_THAT(executor, IsOk());
    const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options);
    EXPECT_EQ((*executor)->staging_host_bytes(), plan.pinned_bytes());
    EXPECT_EQ(plan.grad_ring_bytes, ring ? kGradRingBuffers * 4 * layer : 0);
    // A releaser thread frees each ring piece after the callback returned.
    HandedOn out;
    out.calls.resize(blocks);
    out.grads.resize(blocks);
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> releases;
    int held = 0;
    bool done = false;
    std::thread releaser([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        cv.wait(lock, [&] { return done || !releases.empty(); });
        if (releases.empty()) return;
        std::function<void()> release = std::move(releases.front());
        releases.pop_front();
        --held;
        lock.unlock();
        release();
        lock.lock();
      }
    });
    auto result = (*executor)->ForwardBackward(batches, [&](const FinalGradient& g) {
      std::vector<float>& grad = out.grads[g.block];
      grad.resize(layout.blocks[g.block].numel);
      if (g.data != nullptr) std::memcpy(grad.data() + g.begin, g.data, g.count * 4);
      FinalGradient call = g;
      call.data = nullptr;
      call.release = nullptr;
      out.calls[g.block].push_back(call);
      if (!g.release) return;
      std::lock_guard<std::mutex> lock(mu);
      out.max_held = std::max(out.max_held, ++held);
      releases.push_back(g.release);
      cv.notify_one();
    });
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_one();
    }
    releaser.join();
    ASSERT_THAT(result, IsOk());
    // No callback: the executor frees the pieces, pass after pass.
    ASSERT_THAT((*executor)->ForwardBackward(batches, {}), IsOk());
    ASSERT_THAT((*executor)->ForwardBackward(batches, {}), IsOk());
    runs.push_back(std::move(out));
  }
  const HandedOn& arena = runs[0];
  const HandedOn& ring = runs[1];
  EXPECT_EQ(arena.max_held, 0);
  EXPECT_GE(ring.max_held, 1);
  EXPECT_LE(ring.max_held, kGradRingBuffers);
  for (int64_t b = 0; b < blocks; ++b) {
    SCOPED_TRACE(absl::StrCat("block ", b));
    const int64_t numel = layout.blocks[b].numel;
    ASSERT_EQ(arena.calls[b].size(), 1u);
    const FinalGradient& whole = arena.calls[b][0];
    EXPECT_EQ(whole.begin, 0);
    EXPECT_EQ(whole.count, numel);
    EXPECT_TRUE(whole.first && whole.last);
    const std::vector<FinalGradient>& pieces = ring.calls[b];
    ASSERT_EQ(pieces.size(), b == head ? static_cast<size_t>(head_pieces) : 1u);
    int64_t next = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      EXPECT_EQ(pieces[k].block, b);
      EXPECT_EQ(pieces[k].begin, next);
      EXPECT_EQ(pieces[k].first, k == 0);
      EXPECT_EQ(pieces[k].last, k + 1 == pieces.size());
      EXPECT_LE(pieces[k].count, b == layout.embedding_block() ? numel : layer);
      EXPECT_EQ(pieces[k].grad_squared_norm, whole.grad_squared_norm);
      next += pieces[k].count;
    }
    EXPECT_EQ(next, numel);
    ASSERT_EQ(ring.grads[b].size(), arena.grads[b].size());
    EXPECT_EQ(std::memcmp(ring.grads[b].data(), arena.grads[b].data(), numel * 4), 0);
  }
}

// Note [Executor memory plan]: admission's footprint is what the store
// and the executor hold, for every host-memory mode (on the CPU: the same
// buffers, none pinned). The footprint plans a GPU's auto settings (layers
// 0-1 and the untied embedding resident: no host gradient for the
// embedding with the ring, a ring of kGradRingBuffers decoder layers); the
// CPU trainer is given the same. With a vocabulary of 4096 the head is
// eight layers' worth and still sizes no ring buffer (Note [Gradient
// ring]); a tied table is never resident in the plan.
TEST(FootprintTest, StoreAndStagingEqualTheFootprintInEveryMode) {
  struct Mode {
    std::string name;
    ComputeDtype dtype;
    WeightStream stream;
    GradientLanding landing;
    double clip;
    int64_t vocab_size = 96;
    bool tied = false;
  };
  const Mode modes[] = {
      {"fp32 arena clip", ComputeDtype::kFp32, WeightStream::kBf16, GradientLanding::kArena, 1.0},
      {"bf16 copy arena clip", ComputeDtype::kBf16, WeightStream::kBf16, GradientLanding::kArena,
       1.0},
      {"bf16 fp32-stream arena clip", ComputeDtype::kBf16, WeightStream::kFp32,
       GradientLanding::kArena, 1.0},
      {"bf16 copy ring", ComputeDtype::kBf16, WeightStream::kBf16, GradientLanding::kRing, 0.0},
      {"bf16 fp32-stream ring", ComputeDtype::kBf16, WeightStream::kFp32, GradientLanding::kRing,
       0.0},
      {"fp32 auto no clip", ComputeDtype::kFp32, WeightStream::kBf16, GradientLanding::kAuto, 0.0},
      {"bf16 fp32-stream ring, head in pieces", ComputeDtype::kBf16, WeightStream::kFp32,
       GradientLanding::kRing, 0.0, 4096},
      {"bf16 fp32-stream arena clip, large head", ComputeDtype::kBf16, WeightStream::kFp32,
       GradientLanding::kArena, 1.0, 4096},
      {"bf16 fp32-stream ring, tied", ComputeDtype::kBf16, WeightStream::kFp32,
       GradientLanding::kRing, 0.0, 4096, true},
      {"bf16 host-cast arena clip", ComputeDtype::kBf16, WeightStream::kHostCast,
       GradientLanding::kArena, 1.0},
      {"bf16 host-cast ring, tied", ComputeDtype::kBf16, WeightStream::kHostCast,
       GradientLanding::kRing, 0.0, 4096, true},
  };
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    ModelConfig config = SmallLlama();
    config.vocab_size = mode.vocab_size;
    config.tie_word_embeddings = mode.tied;
    JobSpec spec;
    spec.train.micro_batch = kB;
    spec.train.seq_len = kT;
    spec.train.compute_dtype = mode.dtype;
    spec.train.max_grad_norm = mode.clip;
    spec.memory.weight_stream = mode.stream;
    spec.memory.gradient_landing = mode.landing;
    const MemoryFootprint f = EstimateFootprintForConfig(spec, config);
    TrainerOptions o;
    o.micro_batch = kB;
    o.seq_len = kT;
    o.compute_dtype = mode.dtype;
    o.max_grad_norm = mode.clip;
    o.weight_stream = mode.stream;
    o.gradient_landing = mode.landing;
    o.threads = 1;
    o.resident_layers = 2;
    o.resident_embedding = mode.tied ? 0 : 1;
    auto trainer = Trainer::Create(config, o, 1);
    ASSERT_THAT(trainer, IsOk());
    const HostStoreBytes held = (*trainer)->store().bytes();
    EXPECT_EQ(held.master, f.host.master);
    EXPECT_EQ(held.grad, f.host.grad);
    EXPECT_EQ(held.exp_avg, f.host.exp_avg);
    EXPECT_EQ(held.exp_avg_sq, f.host.exp_avg_sq);
    EXPECT_EQ(held.streaming, f.host.streaming);
    // staging_host_bytes() sums the bytes of the buffers the executor's
    // parts allocated (GradLander, InputStager, ...).
    EXPECT_EQ((*trainer)->staging_host_bytes(), f.host.staging);
    EXPECT_EQ(held.Total() + (*trainer)->staging_host_bytes(),
              f.host_total_bytes - f.embedding_lookahead_bytes);
    // Bytes per parameter of the store: 16 with the arena (+2 for the bf16
    // copy), 12 with the ring (+ the embedding's gradient).
    const int64_t copy = mode.dtype == ComputeDtype::kBf16 && mode.stream == WeightStream::kBf16;
    EXPECT_EQ(held.streaming, copy * held.master / 2);
    // The ring: kGradRingBuffers buffers of the largest streamed decoder
    // layer (layer 2; 0 and 1 are resident), never of the head.
    const ModelLayout layout = ModelLayout::Create(config);
    const int64_t layer = layout.blocks[layout.layer_block(2)].numel;
    EXPECT_EQ(f.gradient_ring_bytes,
              (*trainer)->gradient_ring() ? kGradRingBuffers * 4 * layer : 0);
  }
}

TEST(WeightStreamTest, ExecutorRefusesAStoreThatDisagrees) {
  const ModelConfig config = SmallLlama();
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(1);
  HostStoreOptions with_copy;
  with_copy.streaming_bf16 = true;
  auto store = HostStore::Create(config, with_copy);
  ASSERT_THAT(store, IsOk());
  ExecutorOptions options;
  options.compute_dtype = ComputeDtype::kBf16;
  options.stream_fp32_master = true;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("disagree")));
  options.compute_dtype = ComputeDtype::kFp32;
  auto fp32_store = HostStore::Create(config, HostStoreOptions{});
  ASSERT_THAT(fp32_store, IsOk());
  EXPECT_THAT(StreamingExecutor::Create(fp32_store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bf16 compute only")));
  // The host cast casts the fp32 master: it needs the store without a copy.
  options.compute_dtype = ComputeDtype::kBf16;
  options.stream_fp32_master = false;
  options.host_cast = true;
  EXPECT_THAT(StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("executor.host_cast: casts the fp32 master")));
}

}  // namespace
}  // namespace megatrain::engine
