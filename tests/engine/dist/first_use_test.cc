// WarmUpFirstUse (engine/dist/first_use.h, Note [Serial first use]) on CPU
// ranks: the rank threads' first GEMMs, forward and backward, one rank at a
// time, then the ranks' GEMMs together (first_use_cuda_test: every GPU).
#include "engine/dist/first_use.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/dist/rank_threads.h"
#include "tests/engine/dist/first_use_testing.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

// A head_dim of the common models (llama's).
constexpr int64_t kHeadDim = 128;

// CPU ranks: the warm-up runs (its GEMMs and autograd) on every rank's
// thread, one after the other, and the ranks' concurrent GEMMs after it
// give the right gradient.
TEST(FirstUseTest, RanksWarmUpOneAtATimeThenRunTogetherOnCpu) {
  constexpr int kRanks = 4;
  auto runtimes = Runtimes(std::vector<std::string>(kRanks, "cpu"));
  ASSERT_EQ(runtimes.size(), size_t{kRanks});
  RankThreads threads(kRanks);
  ASSERT_THAT(threads.RunOneAtATime([&](int r) { return WarmUpFirstUse(*runtimes[r], kHeadDim); }),
              IsOk());
  absl::Mutex mu;
  int arrived = 0;
  EXPECT_THAT(
      threads.Run([&](int r) { return FirstStepGemms(*runtimes[r], &mu, &arrived, kRanks); }),
      IsOk());
}

// Two warm-ups at once (two trainers' ranks) take turns on the process-wide
// lock; both succeed.
TEST(FirstUseTest, ConcurrentWarmUpsBothSucceed) {
  auto runtimes = Runtimes({"cpu", "cpu"});
  ASSERT_EQ(runtimes.size(), size_t{2});
  RankThreads threads(2);
  EXPECT_THAT(threads.Run([&](int r) { return WarmUpFirstUse(*runtimes[r], kHeadDim); }), IsOk());
}

}  // namespace
}  // namespace megatrain::engine
