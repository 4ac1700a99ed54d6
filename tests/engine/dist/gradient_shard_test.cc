// Shard arithmetic (Note [Shard layout] in engine/store/shard_layout.h),
// the choice between the host all-reduce and the device reduce-scatter,
// and CollectiveGroup::ReduceScatterSum over gloo (the emulation the CPU
// runs; NCCL's is tests/engine/dist/nccl_reduce_scatter_test.cc).
#include "engine/dist/gradient_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/dist/process_group.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ShardLayoutTest, UnevenBlocksAndWorldsLargerThanTheBlock) {
  // numel 10 over 4 ranks: S = 3, the last shard holds the 1 left.
  EXPECT_EQ(PaddedShardNumel(10, 4), 3);
  const int64_t want10[4][2] = {{0, 3}, {3, 6}, {6, 9}, {9, 10}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ShardOf(10, r, 4).begin, want10[r][0]) << r;
    EXPECT_EQ(ShardOf(10, r, 4).end, want10[r][1]) << r;
  }
  // numel 9 over 4: S = 3, rank 3 owns nothing (past the end).
  EXPECT_EQ(ShardOf(9, 2, 4).end, 9);
  EXPECT_EQ(ShardOf(9, 3, 4).size(), 0);
  EXPECT_EQ(ShardOf(9, 3, 4).begin, 9);
  // numel 2 over 4: S = 1, ranks 2 and 3 empty.
  EXPECT_EQ(ShardOf(2, 1, 4).begin, 1);
  EXPECT_EQ(ShardOf(2, 2, 4).size(), 0);
  // An even split, one rank, an empty block.
  EXPECT_EQ(ShardOf(12, 1, 3).begin, 4);
  EXPECT_EQ(ShardOf(12, 1, 3).end, 8);
  EXPECT_EQ(ShardOf(7, 0, 1).end, 7);
  EXPECT_EQ(PaddedShardNumel(0, 3), 0);
  EXPECT_EQ(ShardOf(0, 2, 3).size(), 0);
}

// Every (numel, world): the shards are disjoint, in rank order, cover
// [0, numel), and each is S long except where clipped at numel.
TEST(ShardLayoutTest, ShardsTileEveryBlock) {
  for (int64_t numel = 0; numel <= 70; ++numel) {
    for (int world = 1; world <= 9; ++world) {
      const int64_t s = PaddedShardNumel(numel, world);
      EXPECT_GE(s * world, numel);
      EXPECT_LT(s * world - numel, world);
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange shard = ShardOf(numel, r, world);
        EXPECT_EQ(shard.begin, next) << numel << " " << world << " " << r;
        EXPECT_GE(shard.size(), 0);
        EXPECT_LE(shard.size(), s);
        if (shard.end < numel) {
          EXPECT_EQ(shard.size(), s);
        }
        next = shard.end;
      }
      EXPECT_EQ(next, numel) << numel << " " << world;
    }
  }
  // Large blocks: no overflow in r * S (llama-8b's untied head over 64 ranks).
  const int64_t head = int64_t{128256} * 4096;
  EXPECT_EQ(ShardOf(head, 63, 64).end, head);
  EXPECT_EQ(ShardOf(head, 63, 64).size(), head - 63 * PaddedShardNumel(head, 64));
}

TEST(GradientReductionTest, AutoTakesTheDeviceReduceScatterOnlyOnNccl) {
  using R = GradientReduction;
  EXPECT_EQ(SelectGradientReduction(R::kAuto, "nccl", true), R::kDeviceReduceScatter);
  EXPECT_EQ(SelectGradientReduction(R::kAuto, "nccl", false), R::kHostAllReduce);
  EXPECT_EQ(SelectGradientReduction(R::kAuto, "gloo", false), R::kHostAllReduce);
  // gloo with a reduce-scatter still has no D2H copy to save.
  EXPECT_EQ(SelectGradientReduction(R::kAuto, "gloo", true), R::kHostAllReduce);
  // An explicit request is kept (the device path on gloo is emulated).
  EXPECT_EQ(SelectGradientReduction(R::kHostAllReduce, "nccl", true), R::kHostAllReduce);
  EXPECT_EQ(SelectGradientReduction(R::kDeviceReduceScatter, "gloo", false),
            R::kDeviceReduceScatter);
}

TEST(GradientReductionTest, NamesRoundTripAndBadTextIsRefusedByField) {
  for (const GradientReduction r : {GradientReduction::kAuto, GradientReduction::kHostAllReduce,
                                    GradientReduction::kDeviceReduceScatter}) {
    auto parsed = ParseGradientReduction(GradientReductionName(r), "--gradient_reduction");
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_THAT(ParseGradientReduction("reduce_scatter", "--gradient_reduction"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--gradient_reduction: expected auto, host_all_reduce")));
}

// Three ranks (threads) over gloo, a block of 10 that 3 does not divide:
// each rank's shard of the result holds the sum over the ranks, scaled.
// gloo 1.13 has no reduce-scatter, so this is the emulation (an
// all-reduce); the shard arithmetic and the scaling are the ones NCCL's
// path uses.
TEST(GradientReductionTest, ReduceScatterSumLeavesEachRankItsShardOfTheSum) {
  if (!HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build";
  constexpr int kWorld = 3;
  constexpr int64_t kNumel = 10;
  auto store = RendezvousStore::CreateInProcess();
  std::vector<std::vector<float>> data(kWorld);
  std::vector<absl::Status> status(kWorld);
  std::vector<bool> has_rs(kWorld, true);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kNumel; ++i) data[r].push_back(static_cast<float>(100 * r + i));
    threads.emplace_back([&, r] {
      auto group = CollectiveGroup::Create(store, r, kWorld, "cpu", std::chrono::seconds(30));
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      has_rs[r] = (*group)->has_reduce_scatter();
      status[r] = (*group)->ReduceScatterSum(data[r].data(), kNumel, 0.5f);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(status[r], IsOk());
    EXPECT_FALSE(has_rs[r]) << "gloo on LibTorch 1.13 has no reduce-scatter";
    const ShardRange shard = ShardOf(kNumel, r, kWorld);
    for (int64_t i = shard.begin; i < shard.end; ++i) {
      // 0.5 * sum_r (100 r + i) = 0.5 * (300 + 3 i)
      EXPECT_EQ(data[r][i], 0.5f * (300 + 3 * i)) << "rank " << r << " element " << i;
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
