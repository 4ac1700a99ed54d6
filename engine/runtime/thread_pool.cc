// Implementation of ThreadPool and WaitGroup (see thread_pool.h).
#include "engine/runtime/thread_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

namespace megatrain::engine {
namespace {

// ParallelFor splits into up to this many chunks per thread, claimed
// dynamically, so that a worker busy with a scheduled task (or a slow core)
// delays the loop by a quarter of a thread's share rather than by a whole
// share. Four keeps every chunk of a layer-sized range (millions of floats)
// long enough that streaming and prefetch are not disturbed.
constexpr int64_t kChunksPerThread = 4;

}  // namespace

// ---------------------------------------------------------------------------
// WaitGroup

WaitGroup::~WaitGroup() {
  // Done() may still be inside mu_.Unlock() after a waiter saw zero and went
  // on to destroy us; taking the lock here waits for it (the same reasoning
  // as absl::Notification's destructor).
  absl::MutexLock lock(&mu_);
}

void WaitGroup::Add(int64_t count) {
  absl::MutexLock lock(&mu_);
  outstanding_ += count;
}

void WaitGroup::Done() {
  absl::MutexLock lock(&mu_);
  --outstanding_;
}

void WaitGroup::Wait() {
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outstanding_ <= 0; };
  absl::MutexLock lock(&mu_, absl::Condition(&all_done));
}

// ---------------------------------------------------------------------------
// ThreadPool

bool SetCurrentThreadNice(int nice) {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  return setpriority(PRIO_PROCESS, tid, nice) == 0;
}

std::unique_ptr<ThreadPool> ThreadPool::Create(int num_threads, int nice) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  return std::unique_ptr<ThreadPool>(new ThreadPool(num_threads, nice));
}

ThreadPool::ThreadPool(int num_threads, int nice) {
  workers_.reserve(num_threads);
  for (int worker_idx = 0; worker_idx < num_threads; ++worker_idx) {
    workers_.emplace_back([this, nice] {
      if (nice != 0) SetCurrentThreadNice(nice);
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::WorkerLoop() {
  auto has_work_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  };
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_, absl::Condition(&has_work_or_stopping));
      // Drain before exiting: stop only once the queue is empty.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::Schedule(std::function<void()> task, WaitGroup* done) {
  if (done != nullptr) {
    done->Add(1);
    task = [task = std::move(task), done] {
      task();
      done->Done();
    };
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

// Note [ParallelFor chunking]
// [0, n) is cut into `num_chunks` contiguous chunks of near-equal length
// (chunk k is [k*n/num_chunks, (k+1)*n/num_chunks)), a pure function of
// (n, min_chunk, num_threads()), so callers that store one partial result per
// chunk get the same answer whatever the timing. The calling thread and up
// to num_threads() - 1 helper tasks claim chunks from an atomic counter
// until none is left. The caller never waits for a helper to *start*: if
// every worker is busy it simply runs all chunks itself, which is why
// ParallelFor may be called from inside a pool task. The shared state is
// reference-counted because a helper may be dequeued after ParallelFor has
// returned; such a helper finds no chunk left and never touches `fn`.
namespace {

struct ParallelForState {
  ParallelForState(int64_t n, int64_t num_chunks, absl::FunctionRef<void(int64_t, int64_t)> fn)
      : n(n), num_chunks(num_chunks), fn(fn) {}

  // Claims and runs chunks until none is left, then records how many this
  // thread ran.
  void RunChunks() {
    int64_t chunks_run = 0;
    while (true) {
      const int64_t chunk_idx = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk_idx >= num_chunks) break;
      // n * (chunk_idx + 1) <= n * num_chunks: no overflow for any n below
      // 2^63 / num_chunks (num_chunks <= 4 * threads), i.e. any real count.
      const int64_t begin = n * chunk_idx / num_chunks;
      const int64_t end = n * (chunk_idx + 1) / num_chunks;
      fn(begin, end);
      ++chunks_run;
    }
    if (chunks_run > 0) {
      absl::MutexLock lock(&mu);
      chunks_done += chunks_run;
    }
  }

  const int64_t n;
  const int64_t num_chunks;
  // Valid until ParallelFor returns; called only for claimed chunks, all of
  // which finish before it returns.
  const absl::FunctionRef<void(int64_t, int64_t)> fn;
  std::atomic<int64_t> next_chunk{0};
  absl::Mutex mu;
  int64_t chunks_done ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             absl::FunctionRef<void(int64_t begin, int64_t end)> fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  const int64_t threads = num_threads();
  const int64_t num_chunks = std::clamp<int64_t>(n / min_chunk, 1, threads * kChunksPerThread);
  if (num_chunks == 1 || threads == 1) {
    // Same boundaries as the parallel path, without the shared state.
    for (int64_t chunk_idx = 0; chunk_idx < num_chunks; ++chunk_idx) {
      fn(n * chunk_idx / num_chunks, n * (chunk_idx + 1) / num_chunks);
    }
    return;
  }

  auto state = std::make_shared<ParallelForState>(n, num_chunks, fn);
  const int64_t helpers = std::min(num_chunks, threads) - 1;
  for (int64_t helper_idx = 0; helper_idx < helpers; ++helper_idx) {
    Schedule([state] { state->RunChunks(); });
  }
  state->RunChunks();
  auto all_done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->chunks_done == state->num_chunks;
  };
  absl::MutexLock lock(&state->mu, absl::Condition(&all_done));
}

}  // namespace megatrain::engine
