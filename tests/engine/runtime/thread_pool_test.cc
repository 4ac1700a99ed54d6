// Tests for engine/runtime/thread_pool.h: ParallelFor coverage and chunking,
// Schedule + WaitGroup completion, draining on destruction, nesting.
#include "engine/runtime/thread_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

// Records the [begin, end) chunks one ParallelFor call produced, sorted.
std::vector<std::pair<int64_t, int64_t>> CollectChunks(ThreadPool& pool, int64_t n,
                                                       int64_t min_chunk) {
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelFor(n, min_chunk, [&](int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu);
    chunks.emplace_back(begin, end);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

TEST(ThreadPoolTest, CreateWithZeroUsesHardwareConcurrency) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(0);
  const int expected = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(pool->num_threads(), expected);
}

TEST(ThreadPoolTest, ParallelForVisitsEveryIndexExactlyOnce) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(4);
  constexpr int64_t kN = 100'003;  // prime: no even split
  std::vector<std::atomic<int>> visits(kN);
  pool->ParallelFor(kN, 7, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      visits[index].fetch_add(1, std::memory_order_relaxed);
    }
  });
  for (int64_t index = 0; index < kN; ++index) {
    ASSERT_EQ(visits[index].load(), 1) << "index " << index;
  }
}

TEST(ThreadPoolTest, ParallelForChunksAreContiguousAndAtLeastMinChunk) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(3);
  constexpr int64_t kN = 10'000;
  constexpr int64_t kMinChunk = 1'000;
  const auto chunks = CollectChunks(*pool, kN, kMinChunk);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front().first, 0);
  EXPECT_EQ(chunks.back().second, kN);
  for (size_t chunk_idx = 0; chunk_idx < chunks.size(); ++chunk_idx) {
    EXPECT_GE(chunks[chunk_idx].second - chunks[chunk_idx].first, kMinChunk);
    if (chunk_idx > 0) {
      EXPECT_EQ(chunks[chunk_idx].first, chunks[chunk_idx - 1].second);
    }
  }
}

TEST(ThreadPoolTest, ParallelForBoundariesAreDeterministic) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(4);
  const auto first = CollectChunks(*pool, 123'457, 100);
  for (int repeat = 0; repeat < 20; ++repeat) {
    EXPECT_EQ(CollectChunks(*pool, 123'457, 100), first);
  }
}

TEST(ThreadPoolTest, ParallelForRunsOneChunkWhenRangeIsShorterThanMinChunk) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(4);
  const auto chunks = CollectChunks(*pool, 10, 64);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0], std::make_pair(int64_t{0}, int64_t{10}));
}

TEST(ThreadPoolTest, ParallelForCallsNothingWhenRangeIsEmpty) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(2);
  int calls = 0;
  pool->ParallelFor(0, 1, [&](int64_t, int64_t) { ++calls; });
  pool->ParallelFor(-5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, ParallelForRunsOnCallingThreadWhenSingleThreaded) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(1);
  const std::thread::id caller = std::this_thread::get_id();
  bool all_on_caller = true;
  pool->ParallelFor(1000, 1, [&](int64_t, int64_t) {
    all_on_caller = all_on_caller && std::this_thread::get_id() == caller;
  });
  EXPECT_TRUE(all_on_caller);
}

TEST(ThreadPoolTest, ParallelForRunsChunksConcurrentlyWhenWorkersAreFree) {
  // Two chunks, each waiting until the other has started: this completes
  // only if a worker runs one while the caller runs the other. The timeout
  // turns a serial implementation into a failure instead of a hang.
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(2);
  absl::Notification started[2];
  std::atomic<bool> both_met{true};
  pool->ParallelFor(2, 1, [&](int64_t begin, int64_t end) {
    ASSERT_EQ(end - begin, 1);
    started[begin].Notify();
    if (!started[1 - begin].WaitForNotificationWithTimeout(absl::Seconds(60))) {
      both_met = false;
    }
  });
  EXPECT_TRUE(both_met.load());
}

TEST(ThreadPoolTest, WorkersRunAtTheRequestedNiceValue) {
  // A pool created with nice 7 runs its tasks at nice 7 (per thread); the
  // creating thread keeps its own priority.
  const int before = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  auto pool = ThreadPool::Create(2, /*nice=*/std::min(before + 7, 19));
  std::atomic<int> seen{-100};
  WaitGroup done;
  pool->Schedule([&] { seen = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))); },
                 &done);
  done.Wait();
  EXPECT_EQ(seen.load(), std::min(before + 7, 19));
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))), before);
}

TEST(ThreadPoolTest, ScheduleRunsEveryTaskBeforeWaitGroupReturns) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(4);
  std::atomic<int> counter{0};
  WaitGroup done;
  for (int task_idx = 0; task_idx < 1000; ++task_idx) {
    pool->Schedule([&] { counter.fetch_add(1); }, &done);
  }
  done.Wait();
  EXPECT_EQ(counter.load(), 1000);
}

TEST(ThreadPoolTest, WaitGroupWaitReturnsAtOnceWhenNothingIsOutstanding) {
  WaitGroup done;
  done.Wait();
  done.Add(2);
  done.Done();
  done.Done();
  done.Wait();
  SUCCEED();
}

TEST(ThreadPoolTest, DestructorDrainsQueuedTasks) {
  std::atomic<int> counter{0};
  {
    std::unique_ptr<ThreadPool> pool = ThreadPool::Create(2);
    // Hold the workers so tasks pile up in the queue before destruction.
    absl::Notification release;
    for (int worker_idx = 0; worker_idx < 2; ++worker_idx) {
      pool->Schedule([&] { release.WaitForNotification(); });
    }
    for (int task_idx = 0; task_idx < 100; ++task_idx) {
      pool->Schedule([&] { counter.fetch_add(1); });
    }
    release.Notify();
  }  // ~ThreadPool runs the 100 queued tasks, then joins.
  EXPECT_EQ(counter.load(), 100);
}

TEST(ThreadPoolTest, ParallelForInsideTaskCompletesWhenAllWorkersAreBusy) {
  // Every worker runs a task that itself calls ParallelFor on the same pool;
  // no worker is free to help, so each caller must do its chunks itself.
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(2);
  std::atomic<int64_t> total{0};
  WaitGroup done;
  for (int task_idx = 0; task_idx < 2; ++task_idx) {
    pool->Schedule(
        [&] {
          pool->ParallelFor(10'000, 10,
                            [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
        },
        &done);
  }
  done.Wait();
  EXPECT_EQ(total.load(), 20'000);
}

TEST(ThreadPoolTest, ConcurrentParallelForCallsFromSeveralThreadsAllComplete) {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int caller_idx = 0; caller_idx < 4; ++caller_idx) {
    callers.emplace_back([&] {
      for (int repeat = 0; repeat < 50; ++repeat) {
        pool->ParallelFor(1'000, 1,
                          [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1'000);
}

}  // namespace
}  // namespace megatrain::engine
