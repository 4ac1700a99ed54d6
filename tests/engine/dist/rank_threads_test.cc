// RankThreads (engine/dist/rank_threads.h, Note [Rank threads]).
#include "engine/dist/rank_threads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;

TEST(RankThreadsTest, EachRankRunsOnItsOwnThreadEveryTime) {
  constexpr int kRanks = 4;
  RankThreads threads(kRanks);
  std::vector<std::thread::id> first(kRanks);
  ASSERT_THAT(threads.Run([&](int r) {
    first[static_cast<size_t>(r)] = std::this_thread::get_id();
    return absl::OkStatus();
  }),
              IsOk());
  EXPECT_EQ(std::set<std::thread::id>(first.begin(), first.end()).size(), size_t{kRanks});
  EXPECT_EQ(std::count(first.begin(), first.end(), std::this_thread::get_id()), 0);
  for (int run = 0; run < 50; ++run) {
    std::vector<std::thread::id> now(kRanks);
    ASSERT_THAT(threads.Run([&](int r) {
      now[static_cast<size_t>(r)] = std::this_thread::get_id();
      return absl::OkStatus();
    }),
                IsOk());
    EXPECT_EQ(now, first) << "run " << run;
  }
}

// Every rank runs, even when a lower one fails; the lowest rank's error
// comes back, and the next Run starts clean.
TEST(RankThreadsTest, RunReturnsTheLowestRanksErrorAfterEveryRankRan) {
  RankThreads threads(3);
  std::atomic<int> ran{0};
  EXPECT_THAT(threads.Run([&](int r) {
    ++ran;
    return r == 0 ? absl::OkStatus() : absl::InternalError(absl::StrCat("rank ", r));
  }),
              StatusIs(absl::StatusCode::kInternal, ::testing::HasSubstr("rank 1")));
  EXPECT_EQ(ran.load(), 3);
  EXPECT_THAT(threads.Run([](int) { return absl::OkStatus(); }), IsOk());
}

// The ranks run at once: each waits until all have arrived (it would
// never return if Run ran them one after another).
TEST(RankThreadsTest, RanksRunConcurrently) {
  constexpr int kRanks = 3;
  RankThreads threads(kRanks);
  absl::Mutex mu;
  int arrived = 0;
  EXPECT_THAT(threads.Run([&](int) {
    absl::MutexLock lock(&mu);
    ++arrived;
    mu.Await(absl::Condition(
        +[](int* n) { return *n == kRanks; }, &arrived));
    return absl::OkStatus();
  }),
              IsOk());
}

// Note [Serial first use]: each rank on its own thread (the one Run uses),
// in rank order, never two at once.
TEST(RankThreadsTest, RunOneAtATimeRunsEachRankAloneOnItsThreadInRankOrder) {
  constexpr int kRanks = 4;
  RankThreads threads(kRanks);
  std::vector<std::thread::id> own(kRanks);
  ASSERT_THAT(threads.Run([&](int r) {
    own[static_cast<size_t>(r)] = std::this_thread::get_id();
    return absl::OkStatus();
  }),
              IsOk());
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  std::vector<int> order;  // written by one rank at a time (what is checked)
  std::vector<std::thread::id> seen(kRanks);
  ASSERT_THAT(threads.RunOneAtATime([&](int r) {
    if (++running > 1) overlapped = true;
    order.push_back(r);
    seen[static_cast<size_t>(r)] = std::this_thread::get_id();
    --running;
    return absl::OkStatus();
  }),
              IsOk());
  EXPECT_FALSE(overlapped.load());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(seen, own);
}

// The first failing rank's error comes back; the ranks after it never run.
TEST(RankThreadsTest, RunOneAtATimeStopsAtTheFirstError) {
  RankThreads threads(4);
  std::vector<int> ran;
  EXPECT_THAT(threads.RunOneAtATime([&](int r) {
    ran.push_back(r);
    return r == 1 ? absl::ResourceExhaustedError(absl::StrCat("rank ", r, " out of memory"))
                  : absl::OkStatus();
  }),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("rank 1")));
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  EXPECT_THAT(threads.Run([](int) { return absl::OkStatus(); }), IsOk());
}

}  // namespace
}  // namespace megatrain::engine
