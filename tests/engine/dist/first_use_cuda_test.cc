// WarmUpFirstUse (engine/dist/first_use.h, Note [Serial first use]) on
// every GPU of the host (2 or more; skips otherwise).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/dist/first_use.h"
#include "engine/dist/rank_threads.h"
#include "tests/engine/dist/first_use_testing.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

// A head_dim of the common models (llama's).
constexpr int64_t kHeadDim = 128;

// Every GPU (2 or more): several rounds of fresh runtimes (new streams, so
// new keys of LibTorch's workspace maps), each warmed up one rank at a
// time, then every rank's first step GEMMs at once, released together.
// With the warm-up those find their map entries; without it a LibTorch
// that does not lock the maps may crash here (Note [Serial first use]).
TEST(FirstUseCudaTest, WarmedUpRanksRunTheirFirstGemmsTogetherOnEveryGpu) {
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus < 2) GTEST_SKIP() << "needs 2 CUDA devices (" << gpus << ")";
  std::vector<std::string> devices;
  for (int r = 0; r < gpus; ++r) devices.push_back(absl::StrCat("cuda:", r));
  RankThreads threads(gpus);
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    auto runtimes = Runtimes(devices);
    ASSERT_EQ(runtimes.size(), devices.size());
    ASSERT_THAT(
        threads.RunOneAtATime([&](int r) { return WarmUpFirstUse(*runtimes[r], kHeadDim); }),
        IsOk());
    absl::Mutex mu;
    int arrived = 0;
    ASSERT_THAT(
        threads.Run([&](int r) { return FirstStepGemms(*runtimes[r], &mu, &arrived, gpus); }),
        IsOk())
        << "round " << round;
  }
}

}  // namespace
}  // namespace megatrain::engine
