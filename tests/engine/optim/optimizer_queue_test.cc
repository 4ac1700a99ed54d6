// The optimizer queue (engine/optim/optimizer_queue.h): earliest deadline
// first, per-block waits, the first error kept.
#include "engine/optim/optimizer_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(OptimizerQueueTest, RunsTheLowestKeyFirst) {
  OptimizerQueue queue(/*num_blocks=*/4, /*nice=*/0);
  absl::Notification release;
  absl::Mutex mu;
  std::vector<int> order;
  // The first task holds the thread until everything else is queued.
  queue.Push({0, 0, 0}, -1, [&] {
    release.WaitForNotification();
    return absl::OkStatus();
  });
  auto record = [&](int id) {
    return [&, id] {
      absl::MutexLock lock(&mu);
      order.push_back(id);
      return absl::OkStatus();
    };
  };
  queue.Push({2, 0, 0}, 0, record(5));    // a later step
  queue.Push({1, 3, 0}, 3, record(3));    // the head
  queue.Push({1, 1, 1}, 1, record(2));    // layer 0's second slice
  queue.Push({1, 1, 0}, 1, record(1));    // layer 0's first slice
  queue.Push({1, -1, 0}, -1, record(0));  // a lookahead: before its step's updates
  queue.Push({1, 4, 0}, 0, record(4));    // the row-wise embedding: last of its step
  release.Notify();
  EXPECT_THAT(queue.WaitAll(), IsOk());
  absl::MutexLock lock(&mu);
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(OptimizerQueueTest, WaitBlockReturnsWhenTheBlocksTasksAreDone) {
  OptimizerQueue queue(/*num_blocks=*/2, /*nice=*/0);
  absl::Notification release;
  bool block1_done = false;
  queue.Push({1, 0, 0}, 0, [&] {
    release.WaitForNotification();
    return absl::OkStatus();
  });
  queue.Push({1, 1, 0}, 1, [&] {
    block1_done = true;
    return absl::OkStatus();
  });
  release.Notify();
  queue.WaitBlock(1);
  EXPECT_TRUE(block1_done);
  queue.WaitBlock(0);  // already done
}

TEST(OptimizerQueueTest, KeepsTheFirstErrorAndStillRunsLaterTasks) {
  OptimizerQueue queue(/*num_blocks=*/1, /*nice=*/0);
  bool later_ran = false;
  queue.Push({1, 0, 0}, 0, [] { return absl::InternalError("adamw: first"); });
  queue.Push({1, 0, 1}, 0, [] { return absl::InternalError("adamw: second"); });
  queue.Push({1, 0, 2}, 0, [&] {
    later_ran = true;
    return absl::OkStatus();
  });
  EXPECT_THAT(queue.WaitAll(), StatusIs(absl::StatusCode::kInternal, HasSubstr("first")));
  EXPECT_TRUE(later_ran);
  EXPECT_THAT(queue.error(), StatusIs(absl::StatusCode::kInternal, HasSubstr("first")));
  queue.RecordError(absl::InternalError("ignored: not the first"));
  EXPECT_THAT(queue.error(), StatusIs(absl::StatusCode::kInternal, HasSubstr("first")));
}

TEST(OptimizerQueueTest, UncountedTasksAreNotWaitedFor) {
  OptimizerQueue queue(/*num_blocks=*/1, /*nice=*/0);
  absl::Notification release, done;
  queue.Push({1, -1, 0}, -1, [&] {
    release.WaitForNotification();
    done.Notify();
    return absl::OkStatus();
  });
  EXPECT_THAT(queue.WaitAll(), IsOk());  // returns while the uncounted task waits
  release.Notify();
  done.WaitForNotification();
}

TEST(OptimizerQueueTest, DestructorRunsEveryQueuedTask) {
  int ran = 0;
  {
    OptimizerQueue queue(/*num_blocks=*/1, /*nice=*/0);
    for (int k = 0; k < 5; ++k) {
      queue.Push({1, 0, k}, 0, [&] {
        ++ran;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(ran, 5);
}

}  // namespace
}  // namespace megatrain::engine
