// Data parallelism with the AdamW moments on the NVMe tier (Note [Tier
// shards] in engine/store/nvme_tier.h), CPU ranks over c10d's gloo: two
// ranks, each keeping its optimizer shard's moments in files of its own,
// train as one device with the tier and as one device without it
// (dense and mixture-of-experts models, clipping on and off); the tier
// changes no bit of the two ranks' training; a checkpoint of the tiered
// ranks resumes bit for bit and loads on one device; a trainer of
// process 1 of 2 names its files by its global rank; a truncated moment
// file of one rank fails the step naming it, on every rank before the
// collective timeout. (Several processes with the
// tier: multi_process_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/dist/data_parallel.h"
#include "engine/dist/process_group.h"
#include "engine/model/model_config.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer_state.h"

// Builds whose LibTorch has no gloo (pip's torch on the GPU machines) have
// no CPU ranks (as in data_parallel_test.cc).
#define MEGATRAIN_SKIP_WITHOUT_GLOO() \
  if (!::megatrain::engine::HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::BitIdentical;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::RelativeError;
using ::megatrain::testing::SmallDataParallelOptions;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::SmallMixtral;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;
constexpr int kMicroBatches = 4;  // per global batch
constexpr uint64_t kSeed = 5;

// The data-parallel tests' options; with `tier`, the moments in a fresh
// directory, in small chunks and slices (several per block and per shard:
// slices rounded up to 2048 with the tier).
TrainerOptions Options(double max_grad_norm, bool tier) {
  TrainerOptions o = SmallDataParallelOptions(kB, kT, max_grad_norm, kMicroBatches);
  if (tier) {
    o.nvme_dir = MakeTempDir("dp-tier");
    o.nvme_chunk_elements = 1024;
    o.optimizer_slice_elements = 2000;
  }
  return o;
}

std::vector<std::vector<MicroBatch>> Steps(const ModelConfig& config, int steps) {
  std::vector<std::vector<MicroBatch>> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back(MakeBatches(kMicroBatches, kB, kT, config.vocab_size, 100 + s));
  }
  return out;
}

// Weights and both moments of one device after `steps` (the moments from
// its tier's files when it has them); its losses into `losses`.
std::vector<float> TrainSingle(const ModelConfig& config, const TrainerOptions& o,
                               const std::vector<std::vector<MicroBatch>>& steps,
                               std::vector<double>* losses) {
  auto trainer = Trainer::Create(config, o, kSeed);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return {};
  for (const auto& batch : steps) {
    auto r = (*trainer)->Step(batch);
    EXPECT_THAT(r, IsOk());
    if (r.ok()) losses->push_back(r->loss);
  }
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  if ((*trainer)->nvme_moments() == nullptr) return AllState((*trainer)->store());
  absl::StatusOr<NvmeMomentTier> tier = NvmeMomentTier::Create({(*trainer)->nvme_shard()});
  EXPECT_THAT(tier, IsOk());
  return tier.ok() ? AllState((*trainer)->store(), *tier) : std::vector<float>{};
}

absl::StatusOr<std::unique_ptr<DataParallelTrainer>> MakeDp(const ModelConfig& config,
                                                            const TrainerOptions& o, int ranks) {
  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cpu", ranks);
  dp.timeout = std::chrono::seconds(60);
  return DataParallelTrainer::Create(config, o, kSeed, dp);
}

// The shared store's weights and moments (from every rank's tier files
// when the ranks have them), after the ranks' updates.
std::vector<float> DpState(DataParallelTrainer& dp) {
  EXPECT_THAT(dp.WaitForOptimizer(), IsOk());
  if (dp.rank(0).nvme_moments() == nullptr) return AllState(dp.store());
  absl::StatusOr<NvmeMomentTier> tier = dp.nvme_tier();
  EXPECT_THAT(tier, IsOk());
  return tier.ok() ? AllState(dp.store(), *tier) : std::vector<float>{};
}

// Two ranks over `steps`, with or without the tier: the losses and the
// final state.
std::vector<float> TrainTwoRanks(const ModelConfig& config, const TrainerOptions& o,
                                 const std::vector<std::vector<MicroBatch>>& steps,
                                 std::vector<double>* losses) {
  auto dp = MakeDp(config, o, 2);
  EXPECT_THAT(dp, IsOk());
  if (!dp.ok()) return {};
  for (const auto& batch : steps) {
    auto r = (*dp)->Step(batch);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return {};
    losses->push_back(r->loss);
    if (o.nvme_dir.empty()) continue;
    // The host's tier traffic: every rank's, each reading and writing its
    // shard (Note [Tier shards]).
    EXPECT_EQ(r->rank_stats.size(), 2u);
    if (r->rank_stats.size() != 2) continue;
    EXPECT_EQ(r->stats.nvme_written_bytes,
              r->rank_stats[0].nvme_written_bytes + r->rank_stats[1].nvme_written_bytes);
  }
  return DpState(**dp);
}

// (max_grad_norm, mixture of experts).
class TieredDataParallelTest : public ::testing::TestWithParam<std::tuple<double, bool>> {};

// Two ranks with the tier against one device with it and one without it,
// over the same global batches. Tolerance 1e-6 relative (L2 over weights
// and moments; per-step losses), data_parallel_test's
// TwoRanksMatchOneDeviceAccumulating bound: the ranks' gradient sums
// differ from one device's only in the order of the fp32 additions (~1e-7
// relative per gradient, carried through three AdamW steps). The tier
// itself changes no bit (Note [Tiered trainer]: the same AdamW on the same
// values, in disjoint shards): the tiered ranks equal the untiered ranks
// bit for bit, and the tiered device the untiered device.
TEST_P(TieredDataParallelTest, TwoTieredRanksMatchOneDeviceWithAndWithoutTheTier) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const auto [clip, moe] = GetParam();
  const ModelConfig config = moe ? SmallMixtral() : SmallLlama();
  const auto steps = Steps(config, 3);
  std::vector<double> single_losses, single_tier_losses, dp_losses, dp_tier_losses;
  const std::vector<float> single =
      TrainSingle(config, Options(clip, false), steps, &single_losses);
  const std::vector<float> single_tier =
      TrainSingle(config, Options(clip, true), steps, &single_tier_losses);
  const TrainerOptions tiered = Options(clip, true);
  const std::vector<float> dp = TrainTwoRanks(config, Options(clip, false), steps, &dp_losses);
  const std::vector<float> dp_tier = TrainTwoRanks(config, tiered, steps, &dp_tier_losses);
  ASSERT_FALSE(single.empty());
  ASSERT_FALSE(dp_tier.empty());
  EXPECT_TRUE(BitIdentical(single_tier, single)) << "one device, tier vs none";
  EXPECT_TRUE(BitIdentical(dp_tier, dp)) << "two ranks, tier vs none";
  EXPECT_EQ(dp_tier_losses, dp_losses);
  ASSERT_EQ(dp_tier_losses.size(), single_losses.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_NEAR(dp_tier_losses[s], single_losses[s], 1e-6 * std::abs(single_losses[s]))
        << "step " << s + 1;
  }
  const double error = RelativeError(dp_tier, single);
  std::fprintf(stderr, "two tiered ranks vs one device: weights and moments %.3g relative\n",
               error);
  EXPECT_LE(error, 1e-6);
  // Each rank's shard in files of its own; no file of the store's layout.
  for (const char* name : {"exp_avg.rank-0-of-2.bin", "exp_avg_sq.rank-1-of-2.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(tiered.nvme_dir + "/" + name)) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(tiered.nvme_dir + "/exp_avg.bin"));
}

INSTANTIATE_TEST_SUITE_P(Modes, TieredDataParallelTest,
                         ::testing::Combine(::testing::Values(1.0, 0.0), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param) > 0 ? "Clip" : "NoClip",
                                               std::get<1>(info.param) ? "Moe" : "Dense");
                         });

// A checkpoint of two tiered ranks (written once, the moments read from
// both ranks' files) resumed by two fresh tiered ranks continues bit for
// bit; the same checkpoint on one device without the tier continues
// within the reduction order's 1e-6 (TwoTieredRanksMatchOneDevice...).
TEST(TieredDataParallelCheckpointTest, ResumesBitForBitAndLoadsOnOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const auto steps = Steps(config, 4);
  const std::string dir = MakeTempDir("dp-tier-ckpt");
  auto dp = MakeDp(config, Options(1.0, true), 2);
  ASSERT_THAT(dp, IsOk());
  for (int s = 0; s < 2; ++s) ASSERT_THAT((*dp)->Step(steps[s]), IsOk());
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  absl::StatusOr<NvmeMomentTier> tier = (*dp)->nvme_tier();
  ASSERT_THAT(tier, IsOk());
  CheckpointState state;
  state.step = (*dp)->step();
  auto info = WriteCheckpoint((*dp)->store(), state, dir, CheckpointSpec{}, &*tier);
  ASSERT_THAT(info, IsOk());
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*dp)->Step(steps[s]), IsOk());
  const std::vector<float> uninterrupted = DpState(**dp);
  ASSERT_FALSE(uninterrupted.empty());

  auto resumed = MakeDp(config, Options(1.0, true), 2);
  ASSERT_THAT(resumed, IsOk());
  absl::StatusOr<NvmeMomentTier> resumed_tier = (*resumed)->nvme_tier();
  ASSERT_THAT(resumed_tier, IsOk());
  auto read = ReadCheckpoint(info->dir, &(*resumed)->store(), &*resumed_tier);
  ASSERT_THAT(read, IsOk());
  (*resumed)->set_step(read->step);
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*resumed)->Step(steps[s]), IsOk());
  EXPECT_TRUE(BitIdentical(DpState(**resumed), uninterrupted));

  auto single = Trainer::Create(config, Options(1.0, false), kSeed);
  ASSERT_THAT(single, IsOk());
  auto read1 = ReadCheckpoint(info->dir, &(*single)->store());
  ASSERT_THAT(read1, IsOk());
  (*single)->set_step(read1->step);
  for (int s = 2; s < 4; ++s) ASSERT_THAT((*single)->Step(steps[s]), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  EXPECT_LE(RelativeError(AllState((*single)->store()), uninterrupted), 1e-6);
}

// Note [Tier shards]: a trainer of process 1 of 2 (one rank each) names
// its files by its global rank, rank-1-of-2, so that process 0's on the
// same host never share them; a process rank outside [0, num_processes)
// is INVALID_ARGUMENT naming the field.
TEST(TieredDataParallelNamesTest, FilesAreNamedByTheGlobalRank) {
  TrainerOptions o = Options(1.0, true);
  o.process_rank = 1;
  o.num_processes = 2;
  auto trainer = Trainer::Create(SmallLlama(), o, kSeed);
  ASSERT_THAT(trainer, IsOk());
  EXPECT_EQ((*trainer)->nvme_moments()->path(MomentKind::kExpAvg),
            o.nvme_dir + "/exp_avg.rank-1-of-2.bin");
  EXPECT_EQ((*trainer)->nvme_moments()->path(MomentKind::kExpAvgSq),
            o.nvme_dir + "/exp_avg_sq.rank-1-of-2.bin");
  EXPECT_FALSE(std::filesystem::exists(o.nvme_dir + "/exp_avg.bin"));
  o.process_rank = 2;
  EXPECT_THAT(Trainer::Create(SmallLlama(), o, kSeed).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("process_rank: must be in [0, num_processes=2), got 2")));
}

// An I/O error in one rank's files (rank 1's exp_avg truncated between
// steps) fails a later step with DATA_LOSS naming that file: the step
// after the failed updates, on rank 1 at its start. Rank 1 still meets
// rank 0 in the step's first collective (GradientReducer::BeginStep), so
// rank 0 fails at once with UNAVAILABLE (the echo, not the cause) rather
// than at the collective timeout: 60 s here, and the steps from the
// truncation to the failure take well under half of it (each about 0.1 s
// on a 2-core machine). The updates running behind a step may fail after
// it returned: then the next step, or WaitForOptimizer, returns it.
TEST(TieredDataParallelFailureTest, TruncatedRankFileFailsAStepNamingItBeforeTheTimeout) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(1.0, true);
  const auto steps = Steps(config, 5);
  DataParallelOptions dpo;
  dpo.devices = DataParallelDevices("cpu", 2);
  dpo.timeout = std::chrono::seconds(60);
  auto dp = DataParallelTrainer::Create(config, o, kSeed, dpo);
  ASSERT_THAT(dp, IsOk());
  ASSERT_THAT((*dp)->Step(steps[0]), IsOk());
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  const std::string path = o.nvme_dir + "/exp_avg.rank-1-of-2.bin";
  std::filesystem::resize_file(path, 4096);
  const auto start = std::chrono::steady_clock::now();
  absl::Status failed;
  for (size_t s = 1; s < steps.size() && failed.ok(); ++s) failed = (*dp)->Step(steps[s]).status();
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, dpo.timeout / 2);
}

}  // namespace
}  // namespace megatrain::engine
