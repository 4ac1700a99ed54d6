// SerialWorker (server/core/serial_worker.h): tasks run in Post order on
// one thread, Post returns before the task runs, Drain waits for what was
// posted, and the destructor runs what is still queued.
#include "server/core/serial_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

namespace megatrain::server {
namespace {

TEST(SerialWorkerTest, RunsTasksInPostOrderOnOneOtherThread) {
  std::vector<int> order;  // written by the worker only
  std::thread::id worker_id;
  {
    SerialWorker worker;
    for (int task_idx = 0; task_idx < 100; ++task_idx) {
      worker.Post([&, task_idx] {
        order.push_back(task_idx);
        worker_id = std::this_thread::get_id();
      });
    }
    worker.Drain();
    ASSERT_EQ(order.size(), 100u);
  }
  for (int task_idx = 0; task_idx < 100; ++task_idx) EXPECT_EQ(order[task_idx], task_idx);
  EXPECT_NE(worker_id, std::this_thread::get_id());
}

TEST(SerialWorkerTest, PostReturnsWhileATaskIsBlocked) {
  SerialWorker worker;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  worker.Post([released, &ran] {
    released.wait();  // stands in for a store lock held by RPC readers
    ++ran;
  });
  // The poster (the training thread) is not held up by the blocked task.
  for (int task_idx = 0; task_idx < 10; ++task_idx) worker.Post([&ran] { ++ran; });
  EXPECT_EQ(ran.load(), 0);
  release.set_value();
  worker.Drain();
  EXPECT_EQ(ran.load(), 11);
}

TEST(SerialWorkerTest, DestructorRunsWhatIsStillQueued) {
  std::atomic<int> ran{0};
  {
    SerialWorker worker;
    for (int task_idx = 0; task_idx < 50; ++task_idx) worker.Post([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace megatrain::server
