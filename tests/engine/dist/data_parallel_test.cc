// Data parallelism over c10d's gloo on the CPU (Notes [Data-parallel step]
// and [Shared host store] in engine/step/gradient_reducer.h): two ranks,
// sharing one host store and one AdamW, each training on half of the
// global batch, end with the weights of one device accumulating the whole
// batch; the store's bytes are counted once; a checkpoint written once resumes exactly on the same
// world size and loads on another; bad batches and options fail on every rank with the field named,
// without a rank left waiting in a collective.
#include "engine/dist/data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/batch.h"
#include "engine/dist/process_group.h"
#include "engine/model/model_config.h"
#include "engine/step/grad_lander.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/reference_llama.h"

// The CPU tests run the ranks over gloo; builds whose LibTorch ships no
// gloo headers (pip's torch on the GPU machines) have no CPU backend.
#define MEGATRAIN_SKIP_WITHOUT_GLOO() \
  if (!::megatrain::engine::HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallDataParallelOptions;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::SmallMixtral;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;
constexpr int kMicroBatches = 4;  // per global batch
constexpr uint64_t kSeed = 5;

TrainerOptions Options(double max_grad_norm) {
  return SmallDataParallelOptions(kB, kT, max_grad_norm, kMicroBatches);
}

// Global batches of kMicroBatches micro-batches, one per step.
std::vector<std::vector<MicroBatch>> Steps(const ModelConfig& config, int steps) {
  std::vector<std::vector<MicroBatch>> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back(MakeBatches(kMicroBatches, kB, kT, config.vocab_size, 100 + s));
  }
  return out;
}

using ::megatrain::testing::RelativeError;  // the L2 measure over flat copies

// One device accumulating each global batch; its losses (and MoE aux
// losses) per step into `losses` (`aux_losses`) when not null.
std::vector<float> TrainSingle(const ModelConfig& config, const TrainerOptions& o,
                               const std::vector<std::vector<MicroBatch>>& steps,
                               std::vector<double>* losses,
                               std::vector<double>* aux_losses = nullptr) {
  auto trainer = Trainer::Create(config, o, kSeed);
  EXPECT_THAT(trainer, IsOk());
  for (const auto& batch : steps) {
    auto r = (*trainer)->Step(batch);
    EXPECT_THAT(r, IsOk());
    if (losses != nullptr && r.ok()) losses->push_back(r->loss);
    if (aux_losses != nullptr && r.ok()) aux_losses->push_back(r->aux_loss);
  }
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  return AllState((*trainer)->store());
}

absl::StatusOr<std::unique_ptr<DataParallelTrainer>> MakeDp(const ModelConfig& config,
                                                            const TrainerOptions& o, int ranks) {
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", ranks);
  dp.timeout = std::chrono::seconds(60);
  return DataParallelTrainer::Create(config, o, kSeed, dp);
}

class DataParallelParityTest : public ::testing::TestWithParam<double> {};

// Tolerance 1e-6 relative: the ranks' sums differ from one device's only
// in the order of the fp32 additions (Note [Gradient all-reduce]), ~1e-7
// relative per gradient, carried through a few AdamW steps.
TEST_P(DataParallelParityTest, TwoRanksMatchOneDeviceAccumulating) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(GetParam());
  const auto steps = Steps(config, 3);
  std::vector<double> single_losses;
  const std::vector<float> single = TrainSingle(config, o, steps, &single_losses);

  auto dp = MakeDp(config, o, 2);
  ASSERT_THAT(dp, IsOk());
  EXPECT_EQ((*dp)->backend_name(), "gloo");
  for (size_t s = 0; s < steps.size(); ++s) {
    auto r = (*dp)->Step(steps[s]);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->step, static_cast<int64_t>(s) + 1);
    EXPECT_NEAR(r->loss, single_losses[s], 1e-6 * std::abs(single_losses[s]));
    ASSERT_EQ(r->rank_stats.size(), 2u);  // each rank's own, its share of the tokens
    EXPECT_EQ(r->rank_stats[1].tokens, r->stats.tokens);
  }
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  // One store: an AdamW applied twice per step (once per rank) would leave
  // moments and weights far from one device's.
  const std::vector<float> rank0 = AllState((*dp)->store());
  EXPECT_LE(RelativeError(rank0, single), 1e-6);
  std::fprintf(stderr, "weights and moments vs one device: %.3g relative\n",
               RelativeError(rank0, single));
  auto initial = HostStore::Create(config, {});
  ASSERT_THAT(initial, IsOk());
  (*initial)->InitializeWeights(kSeed);
  EXPECT_GT(RelativeError(rank0, AllState(**initial)), 1e-4) << "training moved the weights";
}

// Note [Data-parallel step]: the ranks' gradients sum to one device's
// objective CE / N + coef * sum of aux_m over every micro-batch, with N the
// global count and the aux terms unscaled, and the router jitter of each
// micro-batch keyed by its index in the global batch. Rank 1's
// micro-batches count fewer tokens than rank 0's (labels masked), so a
// per-rank mean rescaled by N_r / N would differ in the aux terms' weight
// as well. Tolerance as TwoRanksMatchOneDeviceAccumulating (1e-6): only
// the fp32 summation order differs.
TEST_P(DataParallelParityTest, TwoRanksMatchOneDeviceOverAMixtureOfExperts) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallMixtral();
  ASSERT_NE(config.moe, nullptr);
  const TrainerOptions o = Options(GetParam());
  auto steps = Steps(config, 3);
  for (auto& batch : steps) {  // rank 1's share: micro-batches 2 and 3
    for (int m = kMicroBatches / 2; m < kMicroBatches; ++m) {
      for (size_t i = 0; i < batch[m].labels.size(); i += 2) batch[m].labels[i] = kIgnoreLabel;
    }
  }
  std::vector<double> single_losses, single_aux;
  const std::vector<float> single = TrainSingle(config, o, steps, &single_losses, &single_aux);
  ASSERT_EQ(single_aux.size(), steps.size());

  auto dp = MakeDp(config, o, 2);
  ASSERT_THAT(dp, IsOk());
  for (size_t s = 0; s < steps.size(); ++s) {
    auto r = (*dp)->Step(steps[s]);
    ASSERT_THAT(r, IsOk());
    EXPECT_NEAR(r->loss, single_losses[s], 1e-6 * std::abs(single_losses[s])) << "step " << s;
    EXPECT_GT(r->aux_loss, 0) << "step " << s;
    EXPECT_NEAR(r->aux_loss, single_aux[s], 1e-6 * std::abs(single_aux[s])) << "step " << s;
  }
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  const std::vector<float> rank0 = AllState((*dp)->store());
  EXPECT_LE(RelativeError(rank0, single), 1e-6);
  std::fprintf(stderr, "MoE weights and moments vs one device: %.3g relative\n",
               RelativeError(rank0, single));
}

// Note [Shared host store]: the weights, moments and the reduced gradient
// exist once; each rank holds only its landing gradients, and streams the
// shared store's weights.
TEST(DataParallelTest, RanksShareOneHostStoreCountedOnce) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  auto single = Trainer::Create(config, Options(1.0), kSeed);
  ASSERT_THAT(single, IsOk());
  const HostStoreBytes one = (*single)->store().bytes();
  auto dp = MakeDp(config, Options(1.0), 2);
  ASSERT_THAT(dp, IsOk());
  const HostStoreBytes shared = (*dp)->store().bytes();
  EXPECT_EQ(shared.master, one.master);
  EXPECT_EQ(shared.grad, one.grad);
  EXPECT_EQ(shared.exp_avg, one.exp_avg);
  EXPECT_EQ(shared.exp_avg_sq, one.exp_avg_sq);
  for (int r = 0; r < 2; ++r) {
    HostStore& view = (*dp)->rank(r).store();
    const HostStoreBytes b = view.bytes();
    EXPECT_EQ(b.master + b.exp_avg + b.exp_avg_sq + b.streaming, 0) << "rank " << r;
    EXPECT_EQ(b.grad, one.grad) << "rank " << r;
    EXPECT_EQ(view.master(0), (*dp)->store().master(0)) << "rank " << r;
    EXPECT_EQ(view.exp_avg(1), (*dp)->store().exp_avg(1)) << "rank " << r;
    EXPECT_NE(view.grad(0), (*dp)->store().grad(0)) << "rank " << r;
  }
  const HostStoreBytes total = (*dp)->host_bytes();
  EXPECT_EQ(total.Total(), one.Total() + 2 * one.grad);
}

// max_grad_norm 1: clipping (updates after backward); 0: updates overlap
// backward as each block's reduced gradient is final.
INSTANTIATE_TEST_SUITE_P(Clipping, DataParallelParityTest, ::testing::Values(1.0, 0.0));

TEST(DataParallelTest, CheckpointResumesExactlyAndLoadsOnOtherRankCounts) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(1.0);
  const auto steps = Steps(config, 4);
  const std::string dir = testing::MakeTempDir("dp-ckpt");

  auto dp = MakeDp(config, o, 2);
  ASSERT_THAT(dp, IsOk());
  for (int s = 0; s < 2; ++s) ASSERT_THAT((*dp)->Step(steps[s]), IsOk());
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  CheckpointState state;
  state.step = (*dp)->step();
  // Written once, from rank 0's store.
  auto info = WriteCheckpoint((*dp)->store(), state, dir, CheckpointSpec{});
  ASSERT_THAT(info, IsOk());
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*dp)->Step(steps[s]), IsOk());
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  const std::vector<float> uninterrupted = AllState((*dp)->store());

  // Same world size: continues bit for bit.
  auto resumed = MakeDp(config, o, 2);
  ASSERT_THAT(resumed, IsOk());
  auto read = ReadCheckpoint(info->dir, &(*resumed)->store());
  ASSERT_THAT(read, IsOk());
  (*resumed)->set_step(read->step);
  for (int s = 2; s < 4; ++s) {
    auto r = (*resumed)->Step(steps[s]);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->step, s + 1);
  }
  ASSERT_THAT((*resumed)->WaitForOptimizer(), IsOk());
  const std::vector<float> after = AllState((*resumed)->store());
  ASSERT_EQ(after.size(), uninterrupted.size());
  EXPECT_EQ(std::memcmp(after.data(), uninterrupted.data(), after.size() * sizeof(float)), 0);

  // One device, and four ranks: the same training within the reduction
  // order's tolerance (DataParallelParityTest).
  auto single = Trainer::Create(config, o, kSeed);
  ASSERT_THAT(single, IsOk());
  auto read1 = ReadCheckpoint(info->dir, &(*single)->store());
  ASSERT_THAT(read1, IsOk());
  (*single)->set_step(read1->step);
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*single)->Step(steps[s]), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  EXPECT_LE(RelativeError(AllState((*single)->store()), uninterrupted), 1e-6);

  auto four = MakeDp(config, o, 4);
  ASSERT_THAT(four, IsOk());
  auto read4 = ReadCheckpoint(info->dir, &(*four)->store());
  ASSERT_THAT(read4, IsOk());
  (*four)->set_step(read4->step);
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*four)->Step(steps[s]), IsOk());
  ASSERT_THAT((*four)->WaitForOptimizer(), IsOk());
  EXPECT_LE(RelativeError(AllState((*four)->store()), uninterrupted), 1e-6);
}

// A checkpoint of one device loads on two ranks (1 -> 2) and continues as
// the one device does, within the reduction order's tolerance.
TEST(DataParallelTest, OneDeviceCheckpointLoadsOnTwoRanks) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(1.0);
  const auto steps = Steps(config, 4);
  const std::string dir = testing::MakeTempDir("dp-ckpt-1to2");
  auto single = Trainer::Create(config, o, kSeed);
  ASSERT_THAT(single, IsOk());
  for (int s = 0; s < 2; ++s) ASSERT_THAT((*single)->Step(steps[s]), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  CheckpointState state;
  state.step = (*single)->step();
  auto info = WriteCheckpoint((*single)->store(), state, dir, CheckpointSpec{});
  ASSERT_THAT(info, IsOk());
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*single)->Step(steps[s]), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  const std::vector<float> uninterrupted = AllState((*single)->store());

  auto dp = MakeDp(config, o, 2);
  ASSERT_THAT(dp, IsOk());
  auto read = ReadCheckpoint(info->dir, &(*dp)->store());
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->step, 2);
  (*dp)->set_step(read->step);
  const std::vector<float> loaded = AllState((*dp)->store());
  for (int s = 2; s < 4; ++s) {
    auto r = (*dp)->Step(steps[s]);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->step, s + 1);
  }
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  const std::vector<float> after = AllState((*dp)->store());
  EXPECT_LE(RelativeError(after, uninterrupted), 1e-6);
  EXPECT_GT(RelativeError(after, loaded), 1e-5) << "the two ranks trained";
}

TEST(DataParallelTest, BadTokenOnOneRankFailsEveryRank) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  auto dp = MakeDp(config, Options(1.0), 2);
  ASSERT_THAT(dp, IsOk());
  std::vector<MicroBatch> batch = MakeBatches(kMicroBatches, kB, kT, config.vocab_size, 7);
  batch[3].input_ids[0] = static_cast<int32_t>(config.vocab_size);  // rank 1's
  EXPECT_THAT((*dp)->Step(batch),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside [0, vocab_size)")));
  // Both ranks left the step: the next one runs.
  batch[3].input_ids[0] = 1;
  EXPECT_THAT((*dp)->Step(batch), IsOk());
}

TEST(DataParallelTest, RefusesBatchesAndOptionsRanksCannotSplit) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.gradient_accumulation_steps = 3;
  EXPECT_THAT(MakeDp(config, o, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.gradient_accumulation_steps: must be a multiple of "
                                 "train.devices=2")));
  EXPECT_THAT(MakeDp(config, Options(1.0), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.devices")));
  auto dp = MakeDp(config, Options(1.0), 2);
  ASSERT_THAT(dp, IsOk());
  // A trainer that updates only a shard must share its store.
  o = Options(1.0);
  o.optimizer_shard_rank = 1;
  o.optimizer_shard_world = 2;
  EXPECT_THAT(Trainer::Create(config, o, kSeed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("optimizer_shard_world: only with a shared_store")));
  o.optimizer_shard_rank = 2;
  EXPECT_THAT(Trainer::Create(config, o, kSeed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer_shard_rank")));
  EXPECT_THAT((*dp)->Step(MakeBatches(3, kB, kT, config.vocab_size, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("multiple of train.devices=2, got 3")));
  // Bad position ids on one rank's share fail the step on every rank.
  std::vector<MicroBatch> bad = MakeBatches(4, kB, kT, config.vocab_size, 2);
  bad[3].position_ids.assign(static_cast<size_t>(kB * kT), 0);
  bad[3].position_ids[1] = 5;
  EXPECT_THAT((*dp)->Step(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("micro-batch 3: position_ids")));
  EXPECT_THAT((*dp)->Step(MakeBatches(4, kB, kT, config.vocab_size, 3)), IsOk());
}

// Note [Device reduce-scatter] in engine/step/gradient_reducer.h, run on
// the CPU: gloo has no reduce-scatter, so the device path is emulated
// (all-reduce, then the shard), but everything around it is the GPU's:
// the executor offers each whole block before its D2H copy, lands only
// the rank's shard, and the shards assemble the shared gradient. One
// micro-batch per rank, so every dense block is whole at landing (the
// embedding's rows still take the host path). Without clipping the
// weights and moments are bit-identical to the host path's (the same two
// fp32 addends); with clipping, the norm is the sum of the shards' fp64
// norms instead of the whole block's, within 1e-12 relative of the host
// path's, so the weights agree within 1e-6 (measured: identical).
TEST_P(DataParallelParityTest, DeviceReduceScatterPathLandsShardsAndMatchesTheHostPath) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(GetParam());
  o.gradient_accumulation_steps = 2;  // one micro-batch per rank
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 300 + s));
  std::vector<std::vector<float>> state(2);
  std::vector<std::vector<int64_t>> d2h(2);
  std::vector<std::vector<double>> losses(2);
  for (int path = 0; path < 2; ++path) {
    DataParallelOptions dp;
    dp.devices = DataParallelDevices("cpu", 2);
    dp.timeout = std::chrono::seconds(60);
    dp.gradient_reduction =
        path == 0 ? GradientReduction::kHostAllReduce : GradientReduction::kDeviceReduceScatter;
    auto t = DataParallelTrainer::Create(config, o, kSeed, dp);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ((*t)->gradient_reduction(), dp.gradient_reduction);
    for (const auto& batch : steps) {
      auto r = (*t)->Step(batch);
      ASSERT_THAT(r, IsOk());
      d2h[path].push_back(r->stats.d2h_bytes);  // rank 0's
      losses[path].push_back(r->loss);
    }
    ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
    state[path] = AllState((*t)->store());
  }
  EXPECT_EQ(losses[0], losses[1]);
  if (GetParam() == 0) {
    ASSERT_EQ(state[0].size(), state[1].size());
    EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0);
  }
  EXPECT_LE(RelativeError(state[1], state[0]), 1e-6);
  // D2H: rank 0 copies only its shard of every dense block (the embedding
  // lands its rows whole either way).
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  int64_t saved = 0;
  for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
    if (b == (*store)->layout().embedding_block()) continue;
    const int64_t numel = (*store)->block_numel(b);
    saved += 4 * (numel - ShardOf(numel, 0, 2).size());
  }
  for (size_t s = 0; s < steps.size(); ++s) EXPECT_EQ(d2h[0][s] - d2h[1][s], saved) << s;
}

// Note [Resident blocks on every rank] (engine/step/gradient_reducer.h):
// each rank keeps layer 0 and the embedding on its device, sums their
// gradients over the ranks in place and applies the same AdamW. Both
// gradient paths for the streamed blocks: the ranks end within the
// reduction order's tolerance of one device with the same resident blocks
// (as TwoRanksMatchOneDeviceAccumulating), and the two ranks' replicas
// agree bit for bit (each rank evaluates with its own resident copy).
TEST_P(DataParallelParityTest, ResidentBlocksOnEveryRankMatchOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(GetParam());
  o.resident_layers = 1;
  o.resident_embedding = 1;
  const auto steps = Steps(config, 3);
  std::vector<double> single_losses;
  const std::vector<float> single = TrainSingle(config, o, steps, &single_losses);
  for (const GradientReduction path :
       {GradientReduction::kHostAllReduce, GradientReduction::kDeviceReduceScatter}) {
    DataParallelOptions dp;
    dp.devices = DataParallelDevices("cpu", 2);
    dp.timeout = std::chrono::seconds(60);
    dp.gradient_reduction = path;
    auto t = DataParallelTrainer::Create(config, o, kSeed, dp);
    ASSERT_THAT(t, IsOk());
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ((*t)->rank(r).resident_layers(), 1);
      EXPECT_TRUE((*t)->rank(r).resident_embedding());
    }
    for (size_t s = 0; s < steps.size(); ++s) {
      auto r = (*t)->Step(steps[s]);
      ASSERT_THAT(r, IsOk());
      EXPECT_NEAR(r->loss, single_losses[s], 1e-6 * std::abs(single_losses[s]));
    }
    ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
    // Each rank's own resident copy: the same bits.
    const auto probe = MakeBatches(1, kB, kT, config.vocab_size, 77);
    auto loss0 = (*t)->rank(0).Evaluate(probe);
    auto loss1 = (*t)->rank(1).Evaluate(probe);
    ASSERT_THAT(loss0, IsOk());
    ASSERT_THAT(loss1, IsOk());
    EXPECT_EQ(*loss0, *loss1);
    // Rank 0's resident state reaches the shared store (checkpoints).
    // Tolerance 1e-5, not 1e-6: the resident embedding's AdamW moments
    // agree within 2.4e-7 (the fp32 summation order), but an element whose
    // gradient nearly cancels over the micro-batches has v near eps^2,
    // where lr * m / (sqrt(v) + eps) turns that rounding into up to 1e-4 of
    // its weight (measured 6.7e-5 on the embedding's master, 4.8e-6 over
    // the whole state, with clipping; 1e-8 on the other blocks). A wrong
    // reduction (a missing scale, a sum counted twice) is O(1).
    const std::vector<float> state = AllState((*t)->store());
    EXPECT_LE(RelativeError(state, single), 1e-5) << GradientReductionName(path);
  }
}

// Two gloo ranks taking the device path's reduce-scatter (Note [Device
// reduce-scatter]), as NCCL ranks would.
DataParallelOptions DevicePathOnTwoCpuRanks() {
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", 2);
  dp.timeout = std::chrono::seconds(60);
  dp.gradient_reduction = GradientReduction::kDeviceReduceScatter;
  return dp;
}

// Note [Shard-only landing] (engine/store/host_store.h): with one
// micro-batch per rank on the device path, each rank lands its shard of a
// streamed block in the shared gradient itself; only the embedding's rows
// (not resident here) land in a buffer of the rank's own, so the ranks add
// two embedding tables to the host, not two whole arenas.
TEST(DataParallelTest, DevicePathRanksLandShardsInTheSharedGradient) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.gradient_accumulation_steps = 2;  // one micro-batch per rank
  auto t = DataParallelTrainer::Create(config, o, kSeed, DevicePathOnTwoCpuRanks());
  ASSERT_THAT(t, IsOk());
  HostStore& shared = (*t)->store();
  const int64_t emb = shared.layout().embedding_block();
  const int64_t emb_bytes = (shared.block_numel(emb) + 1023) / 1024 * 1024 * 4;
  for (int r = 0; r < 2; ++r) {
    HostStore& view = (*t)->rank(r).store();
    EXPECT_EQ(view.bytes().grad, emb_bytes) << "rank " << r;
    EXPECT_NE(view.grad(emb), shared.grad(emb)) << "rank " << r;
    for (int64_t b = 0; b < shared.num_blocks(); ++b) {
      if (b == emb) continue;
      EXPECT_EQ(view.grad(b), shared.grad(b)) << "rank " << r << " block " << b;
    }
  }
  EXPECT_EQ((*t)->host_bytes().Total(), shared.bytes().Total() + 2 * emb_bytes);
}

// Note [Shard-only landing]: with two micro-batches per rank the trainer
// sums them on the device (device gradient accumulation), so the ranks
// still land only shards, and train as one trainer accumulating the
// global batch (1e-5, the bound of the reduction paths' test above and
// its reason: the embedding's moments near eps^2).
TEST(DataParallelTest, SeveralMicroBatchesPerRankLandShardsSummedOnTheDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.gradient_accumulation_steps = 4;  // two micro-batches per rank
  auto t = DataParallelTrainer::Create(config, o, kSeed, DevicePathOnTwoCpuRanks());
  ASSERT_THAT(t, IsOk());
  HostStore& shared = (*t)->store();
  const int64_t emb = shared.layout().embedding_block();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE((*t)->rank(r).device_grad_accumulation()) << "rank " << r;
    EXPECT_EQ((*t)->rank(r).store().bytes().grad,
              (shared.block_numel(emb) + 1023) / 1024 * 1024 * 4)
        << "rank " << r;
  }
  const auto steps = Steps(config, 2);
  for (const auto& batch : steps) ASSERT_THAT((*t)->Step(batch), IsOk());
  ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
  const std::vector<float> single = TrainSingle(config, o, steps, nullptr);
  EXPECT_LE(RelativeError(AllState((*t)->store()), single), 1e-5);
}

// Note [Sharded weight streaming] (engine/step/weight_slots.h): each rank
// loads half of every streamed block and gathers the other half from its
// peer, so rank 0's host-to-device bytes halve, and a gather being a copy,
// the training is bit for bit that of whole-block loads.
TEST(DataParallelTest, ShardedWeightStreamingHalvesEachRanksLoadsBitForBit) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(1.0);
  const auto steps = Steps(config, 2);
  std::vector<std::vector<float>> state(2);
  std::vector<int64_t> h2d(2, 0);
  std::vector<std::vector<double>> losses(2);
  for (int sharded = 0; sharded < 2; ++sharded) {
    DataParallelOptions dp;
    dp.devices = DataParallelDevices("cpu", 2);
    dp.timeout = std::chrono::seconds(60);
    dp.shard_weights = sharded == 1;
    auto t = DataParallelTrainer::Create(config, o, kSeed, dp);
    ASSERT_THAT(t, IsOk());
    for (const auto& batch : steps) {
      auto r = (*t)->Step(batch);
      ASSERT_THAT(r, IsOk());
      h2d[sharded] += r->stats.h2d_bytes;  // rank 0's
      losses[sharded].push_back(r->loss);
    }
    ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
    state[sharded] = AllState((*t)->store());
    // Evaluation runs on rank 0 alone, with whole-block loads.
    ASSERT_THAT((*t)->Evaluate(steps[0]), IsOk());
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(state[0].size(), state[1].size());
  EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0);
  // ceil(numel / 2) of each block: at most 51% for the smallest (norm
  // weights are inside the layer blocks, thousands of elements each).
  EXPECT_GT(h2d[1], 0);
  EXPECT_LE(static_cast<double>(h2d[1]), 0.51 * static_cast<double>(h2d[0]));
}

// torchrun's one process driving several devices: the ranks, threads of
// one process, meet through the TCPStore torchrun's variables name. Each
// rank needs a client connection of its own: a blocking wait on a shared
// one would hold it while the rank it waits for tries to set its key.
TEST(DataParallelTest, RanksAsThreadsOfOneProcessJoinThroughATcpStore) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  TorchrunEnv env{"127.0.0.1", 0, 1, 0, 0};
  auto store = RendezvousStore::CreateTcp(env, std::chrono::seconds(30));
  ASSERT_THAT(store, IsOk());
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", 2);
  dp.timeout = std::chrono::seconds(20);
  dp.rendezvous = *store;
  const ModelConfig config = SmallLlama();
  auto t = DataParallelTrainer::Create(config, Options(1.0), kSeed, dp);
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT((*t)->Step(Steps(config, 1)[0]), IsOk());
}

// kAuto on gloo: the host all-reduce (no D2H copy to save on the CPU).
TEST(DataParallelTest, GlooTakesTheHostAllReduce) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  auto dp = MakeDp(SmallLlama(), Options(1.0), 2);
  ASSERT_THAT(dp, IsOk());
  EXPECT_EQ((*dp)->gradient_reduction(), GradientReduction::kHostAllReduce);
  EXPECT_EQ((*dp)->num_processes(), 1);
  EXPECT_TRUE((*dp)->writes_checkpoints());
  auto agree = (*dp)->ReplicasAgree();  // one replica: trivially
  ASSERT_THAT(agree, IsOk());
  EXPECT_TRUE(*agree);
}

// Note [Ring shards] (engine/step/gradient_reducer.h): with
// memory.gradient_landing ring and clipping off, each rank lands its
// reduce-scattered shard of a streamed block in a shard-sized gradient
// ring of its own and updates it from there; the shared store keeps no
// gradient arena. One case per model and split of the global batch.
struct RingCase {
  const char* name;
  int ranks;
  int per_rank;  // micro-batches per rank (summed on the device when > 1)
  bool moe;
  bool tied;  // tie_word_embeddings: lm_head's gradient lands in the table
  // Layer 0 and the embedding resident on every rank (summed on the
  // devices, no ring; Note [Resident blocks on every rank]).
  bool resident = false;
};
void PrintTo(const RingCase& c, std::ostream* os) { *os << c.name; }

class GradientRingParityTest : public ::testing::TestWithParam<RingCase> {};

// The same ranks with the arena on the device path land the same shards
// (the same reduce-scatter) and AdamW is elementwise, so the ring's
// weights and moments are bit for bit the arena's. Against one device
// accumulating the global batch in the arena: losses within 1e-6 relative
// and the state within 1e-5, the bounds of
// SeveralMicroBatchesPerRankLandShardsSummedOnTheDevice and their reason
// (the fp32 summation order, magnified in the embedding's moments near
// eps^2).
TEST_P(GradientRingParityTest, RanksLandingShardsInRingsMatchTheArenaAndOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const RingCase c = GetParam();
  ModelConfig config = c.moe ? SmallMixtral() : SmallLlama();
  config.tie_word_embeddings = c.tied;
  const int global = c.ranks * c.per_rank;
  TrainerOptions o = Options(0.0);
  o.gradient_accumulation_steps = global;
  if (c.resident) {
    o.resident_layers = 1;
    o.resident_embedding = 1;
  }
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) {
    steps.push_back(MakeBatches(global, kB, kT, config.vocab_size, 500 + s));
  }
  std::vector<double> single_losses;
  const std::vector<float> single = TrainSingle(config, o, steps, &single_losses);
  std::vector<std::vector<float>> state(2);
  std::vector<std::vector<double>> losses(2);
  for (const bool ring : {false, true}) {
    DataParallelOptions dp;
    dp.devices = DataParallelDevices("cpu", c.ranks);
    dp.timeout = std::chrono::seconds(60);
    // The ring takes the device path itself (auto); the arena is asked.
    dp.gradient_reduction =
        ring ? GradientReduction::kAuto : GradientReduction::kDeviceReduceScatter;
    o.gradient_landing = ring ? GradientLanding::kRing : GradientLanding::kArena;
    auto t = DataParallelTrainer::Create(config, o, kSeed, dp);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ((*t)->gradient_ring(), ring);
    EXPECT_EQ((*t)->gradient_reduction(), GradientReduction::kDeviceReduceScatter);
    for (int r = 0; r < c.ranks; ++r) EXPECT_EQ((*t)->rank(r).gradient_ring(), ring) << r;
    if (ring) {
      EXPECT_EQ((*t)->store().bytes().grad, 0) << "no gradient arena";
    }
    for (size_t s = 0; s < steps.size(); ++s) {
      auto r = (*t)->Step(steps[s]);
      ASSERT_THAT(r, IsOk());
      losses[ring].push_back(r->loss);
      EXPECT_NEAR(r->loss, single_losses[s], 1e-6 * std::abs(single_losses[s])) << "step " << s;
      EXPECT_TRUE(std::isfinite(r->grad_norm) && r->grad_norm > 0) << "step " << s;
    }
    ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
    state[ring] = AllState((*t)->store());
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(state[0].size(), state[1].size());
  EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0);
  EXPECT_LE(RelativeError(state[1], single), 1e-5);
  std::fprintf(stderr, "%s: ring vs one device: %.3g relative\n", c.name,
               RelativeError(state[1], single));
}

INSTANTIATE_TEST_SUITE_P(Cases, GradientRingParityTest,
                         ::testing::Values(RingCase{"dense_2x1", 2, 1, false, false},
                                           RingCase{"dense_2x2", 2, 2, false, false},
                                           RingCase{"dense_3x1", 3, 1, false, false},
                                           RingCase{"tied_2x1", 2, 1, false, true},
                                           RingCase{"resident_2x2", 2, 2, false, false, true},
                                           RingCase{"moe_2x1", 2, 1, true, false},
                                           RingCase{"moe_2x2", 2, 2, true, false},
                                           RingCase{"moe_resident_2x2", 2, 2, true, false, true}),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           return std::string(info.param.name);
                         });

// Note [Ring shards]: each rank's ring holds shards (ceil(numel / N) of
// the largest streamed layer per buffer), its view a landing buffer of the
// embedding only, and the shared store no gradient at all.
TEST(DataParallelTest, GradientRingKeepsNoArenaAndShardSizedRings) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(0.0);
  o.gradient_accumulation_steps = 2;
  o.gradient_landing = GradientLanding::kRing;
  auto t = MakeDp(config, o, 2);
  ASSERT_THAT(t, IsOk());
  HostStore& shared = (*t)->store();
  const int64_t emb = shared.layout().embedding_block();
  const int64_t emb_bytes = (shared.block_numel(emb) + 1023) / 1024 * 1024 * 4;
  EXPECT_EQ(shared.bytes().grad, 0);
  EXPECT_EQ(shared.grad(shared.layout().layer_block(0)), nullptr);
  for (int r = 0; r < 2; ++r) {
    HostStore& view = (*t)->rank(r).store();
    EXPECT_EQ(view.bytes().grad, emb_bytes) << "rank " << r;
    EXPECT_NE(view.grad(emb), nullptr) << "rank " << r;
  }
  EXPECT_EQ((*t)->host_bytes().grad, 2 * emb_bytes);
  // The executor's pinned buffers: the ring of shards, against a ring of
  // whole layers on one device.
  const int64_t layer = shared.block_numel(shared.layout().layer_block(0));
  const int64_t whole_ring = kGradRingBuffers * 4 * layer;
  const int64_t shard_ring = kGradRingBuffers * 4 * ((layer + 1) / 2);
  o.gradient_accumulation_steps = 1;
  auto single = Trainer::Create(config, o, kSeed);
  ASSERT_THAT(single, IsOk());
  EXPECT_EQ((*t)->rank(0).staging_host_bytes() - (*single)->staging_host_bytes(),
            shard_ring - whole_ring);
}

// Note [Ring shards]: a view of a store without a gradient arena may own
// a landing buffer for the embedding only; an empty flag list (every
// block whole) or any other block is refused.
TEST(DataParallelTest, GradientRingViewLandsOnlyTheEmbeddingInABufferOfItsOwn) {
  const ModelConfig config = SmallLlama();
  HostStoreOptions ring;
  ring.gradient_ring = true;
  ring.embedding_grad_in_host = false;
  auto shared = HostStore::Create(config, ring);
  ASSERT_THAT(shared, IsOk());
  const int64_t emb = (*shared)->layout().embedding_block();
  const int64_t layer0 = (*shared)->layout().layer_block(0);
  std::vector<bool> flags(static_cast<size_t>((*shared)->num_blocks()), false);
  flags[static_cast<size_t>(layer0)] = true;
  for (const std::vector<bool>& bad : {std::vector<bool>{}, flags}) {
    EXPECT_THAT(HostStore::CreateGradientView(**shared, bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("land only the embedding in a buffer of their own")));
  }
  flags[static_cast<size_t>(layer0)] = false;
  auto none = HostStore::CreateGradientView(**shared, flags);
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ((*none)->bytes().grad, 0);
  EXPECT_FALSE((*none)->options().embedding_grad_in_host);
  flags[static_cast<size_t>(emb)] = true;
  auto view = HostStore::CreateGradientView(**shared, flags);
  ASSERT_THAT(view, IsOk());
  EXPECT_EQ((*view)->bytes().grad, ((*shared)->block_numel(emb) + 1023) / 1024 * 1024 * 4);
  EXPECT_TRUE((*view)->options().embedding_grad_in_host);
  EXPECT_NE((*view)->grad(emb), nullptr);
  EXPECT_EQ((*view)->grad(layer0), nullptr);
  EXPECT_TRUE((*view)->lands_shard_only(layer0));
}

// memory.gradient_landing auto with several ranks: the ring where it is
// sure to be allowed (DataParallelGradientRing), else the arena.
TEST(DataParallelTest, AutoLandingTakesTheRingWhereEveryRankLandsWholeGradients) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  ModelConfig config = SmallLlama();
  TrainerOptions o = Options(0.0);
  o.gradient_landing = GradientLanding::kAuto;
  auto ring = MakeDp(config, o, 2);  // two micro-batches per rank, summed on the device
  ASSERT_THAT(ring, IsOk());
  EXPECT_TRUE((*ring)->gradient_ring());
  EXPECT_EQ((*ring)->gradient_reduction(), GradientReduction::kDeviceReduceScatter);
  EXPECT_THAT((*ring)->Step(Steps(config, 1)[0]), IsOk());
  struct Arena {
    const char* why;
    double max_grad_norm;
    int device_grad_accumulation;
    bool tied;
    GradientReduction reduction;
  };
  for (const Arena& a :
       {Arena{"clipping", 1.0, -1, false, GradientReduction::kAuto},
        Arena{"host sums", 0.0, 0, false, GradientReduction::kAuto},
        Arena{"tied table", 0.0, -1, true, GradientReduction::kAuto},
        Arena{"host all-reduce", 0.0, -1, false, GradientReduction::kHostAllReduce}}) {
    TrainerOptions arena = o;
    arena.max_grad_norm = a.max_grad_norm;
    arena.device_grad_accumulation = a.device_grad_accumulation;
    config.tie_word_embeddings = a.tied;
    EXPECT_FALSE(DataParallelGradientRing(arena, config, 2, a.reduction)) << a.why;
  }
  config.tie_word_embeddings = false;
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", 2);
  dp.timeout = std::chrono::seconds(60);
  dp.gradient_reduction = GradientReduction::kHostAllReduce;
  auto host = DataParallelTrainer::Create(config, o, kSeed, dp);
  ASSERT_THAT(host, IsOk());
  EXPECT_FALSE((*host)->gradient_ring());
  EXPECT_EQ((*host)->gradient_reduction(), GradientReduction::kHostAllReduce);
}

// Where the ring cannot land shards with several ranks, INVALID_ARGUMENT
// names the field and the reason, before any step.
TEST(DataParallelTest, GradientRingRefusesWhatRanksCannotLandInIt) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  ModelConfig config = SmallLlama();
  TrainerOptions o = Options(0.0);
  o.gradient_accumulation_steps = 2;
  o.gradient_landing = GradientLanding::kRing;
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", 2);
  dp.timeout = std::chrono::seconds(60);
  dp.gradient_reduction = GradientReduction::kHostAllReduce;
  EXPECT_THAT(DataParallelTrainer::Create(config, o, kSeed, dp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("memory.gradient_landing: ring with train.devices > 1 needs the "
                                 "device reduce-scatter")));
  o.max_grad_norm = 1.0;
  EXPECT_THAT(MakeDp(config, o, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient_landing ring: needs max_grad_norm 0")));
  // Two micro-batches per rank added on the host (device accumulation
  // forced off) would land partial gradients.
  o.max_grad_norm = 0;
  o.gradient_accumulation_steps = 4;
  o.device_grad_accumulation = 0;
  EXPECT_THAT(MakeDp(config, o, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient_landing ring: with gradient accumulation the "
                                 "micro-batches' gradients must be summed on the device")));
  // A tied table on the host adds lm_head's gradient per micro-batch.
  o.device_grad_accumulation = -1;
  config.tie_word_embeddings = true;
  EXPECT_THAT(MakeDp(config, o, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient_landing ring: with gradient accumulation a tied "
                                 "embedding table on the host")));
}

// Rendezvous as torchrun's processes do it (TCPStore on loopback), here
// with two threads: rank 0 serves on an ephemeral port.
TEST(ProcessGroupTest, TcpStoreRendezvousAllReduces) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  TorchrunEnv env0{"127.0.0.1", 0, 2, 0, 0};
  auto store0 = RendezvousStore::CreateTcp(env0, std::chrono::seconds(30));
  ASSERT_THAT(store0, IsOk());
  ASSERT_GT((*store0)->port(), 0);
  TorchrunEnv env1{"127.0.0.1", (*store0)->port(), 2, 1, 1};
  std::vector<std::vector<float>> data = {{1, 2, 3}, {10, 20, 30}};
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::shared_ptr<RendezvousStore>> store =
          r == 0 ? *store0 : RendezvousStore::CreateTcp(env1, std::chrono::seconds(30));
      if (!store.ok()) {
        status[r] = store.status();
        return;
      }
      auto group = CollectiveGroup::Create(*store, r, 2, "cpu", std::chrono::seconds(30));
      status[r] = group.ok() ? (*group)->AllReduceSum(data[r].data(), 3) : group.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(status[0], IsOk());
  EXPECT_THAT(status[1], IsOk());
  EXPECT_THAT(data[0], ::testing::ElementsAre(11, 22, 33));
  EXPECT_THAT(data[1], ::testing::ElementsAre(11, 22, 33));
}

// Note [torchrun's agent store]: torchrun's agent already serves the store
// at MASTER_PORT (here a world-1 TCPStore on an ephemeral port stands in
// for it). A RANK 0 that tried to serve there too fails (the port is
// taken); with TORCHELASTIC_USE_AGENT_STORE both workers connect as
// clients, under torch's "/worker/attempt_N" prefix, and all-reduce.
TEST(ProcessGroupTest, TorchrunAgentStoreIsJoinedAsAClient) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  auto agent = RendezvousStore::CreateTcp({"127.0.0.1", 0, 1, 0, 0}, std::chrono::seconds(30));
  ASSERT_THAT(agent, IsOk());
  const int port = (*agent)->port();
  ASSERT_GT(port, 0);
  EXPECT_THAT(RendezvousStore::CreateTcp({"127.0.0.1", port, 2, 0, 0}, std::chrono::seconds(2)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("rank 0 could not serve the rendezvous store")));
  std::vector<std::vector<float>> data = {{1, 2}, {10, 20}};
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TorchrunEnv env{"127.0.0.1", port, 2, r, 0};
      env.agent_store = true;
      env.restart_count = 3;
      auto store = RendezvousStore::CreateTcp(env, std::chrono::seconds(30));
      if (!store.ok()) {
        status[r] = store.status();
        return;
      }
      auto group = CollectiveGroup::Create(*store, r, 2, "cpu", std::chrono::seconds(30));
      status[r] = group.ok() ? (*group)->AllReduceSum(data[r].data(), 2) : group.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(status[0], IsOk());
  EXPECT_THAT(status[1], IsOk());
  EXPECT_THAT(data[0], ::testing::ElementsAre(11, 22));
  EXPECT_THAT(data[1], ::testing::ElementsAre(11, 22));
}

TEST(ProcessGroupTest, TorchrunEnvNamesTheBadVariable) {
  unsetenv("WORLD_SIZE");
  EXPECT_THAT(ReadTorchrunEnv(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("WORLD_SIZE")));
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("RANK", "2", 1);
  setenv("LOCAL_RANK", "0", 1);
  EXPECT_THAT(ReadTorchrunEnv(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("RANK: must be an integer in [0, 1]")));
  setenv("RANK", "1", 1);
  auto env = ReadTorchrunEnv();
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->rank, 1);
  EXPECT_FALSE(env->agent_store);
  // torchrun's agent store (Note [torchrun's agent store]).
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  env = ReadTorchrunEnv();
  ASSERT_THAT(env, IsOk());
  EXPECT_TRUE(env->agent_store);
  EXPECT_EQ(env->restart_count, 2);
  setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
  EXPECT_THAT(ReadTorchrunEnv(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("TORCHELASTIC_RESTART_COUNT: must be")));
  for (const char* name : {"WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                           "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"}) {
    unsetenv(name);
  }
}

TEST(ProcessGroupTest, CollectiveGroupRefusesARankOutsideTheWorld) {
  EXPECT_THAT(CollectiveGroup::Create(RendezvousStore::CreateInProcess(), 2, 2, "cpu",
                                      std::chrono::seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank: must be in [0, world_size=2), got 2")));
}

}  // namespace
}  // namespace megatrain::engine
