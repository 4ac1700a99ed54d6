// A fixed-size pool of worker threads for the CPU side of the engine: the
// CPU optimizer splits one transformer layer's AdamW update over it
// (ParallelFor) while the GPU works on other layers, and host-side jobs
// (e.g. the gradient norm of one layer) run on it asynchronously (Schedule).
//
// Why our own pool: LibTorch's intra-op pool is sized and owned by LibTorch
// and is shared with whatever ATen runs on the CPU; the optimizer needs a
// pool whose size it controls and whose calls never throw.
#ifndef MEGATRAIN_ENGINE_THREAD_POOL_H_
#define MEGATRAIN_ENGINE_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

// Counts outstanding tasks; Wait() blocks until the count drops to zero.
// Like Go's sync.WaitGroup. ThreadPool::Schedule takes one to signal
// completion of async tasks.
//
// Thread-safety: all methods are thread-safe. The WaitGroup must outlive
// every task it counts (i.e. call Wait() before destroying it).
//
// Example:
//   WaitGroup done;
//   pool->Schedule([&] { norm = SumOfSquares(grads, n, nullptr); }, &done);
//   ...                      // other work on this thread
//   done.Wait();             // `norm` is ready
class WaitGroup {
 public:
  WaitGroup() = default;
  WaitGroup(const WaitGroup&) = delete;
  WaitGroup& operator=(const WaitGroup&) = delete;

  // Waits for a concurrent Done() to leave the object; does not wait for
  // outstanding tasks (call Wait() for that).
  ~WaitGroup();

  // Adds `count` (>= 0) outstanding tasks.
  void Add(int64_t count = 1);

  // Marks one task finished. Calling it more often than Add() is a bug.
  void Done();

  // Blocks until every added task is Done(). Returns at once when none is
  // outstanding. May be called from several threads.
  void Wait();

 private:
  absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

// A fixed set of worker threads running queued tasks in FIFO order.
//
// Ownership and lifetime: created by Create(), owned by the caller through
// std::unique_ptr. The destructor runs every task already queued (drains),
// then joins the workers; it must not be called from one of the pool's own
// tasks.
//
// Thread-safety: every method may be called concurrently from any thread,
// including from inside a task running on this pool (ParallelFor from a task
// cannot deadlock: the calling thread works through the chunks itself when
// the workers are busy).
//
// Tasks must not throw: an exception escaping a task terminates the process
// (no exception crosses a thread; see STYLE "Errors").
// Sets the calling thread's nice value (Linux: per thread). Returns false
// when the kernel refuses (raising the priority needs CAP_SYS_NICE).
bool SetCurrentThreadNice(int nice);

class ThreadPool {
 public:
  // Starts `num_threads` workers; 0 (or a negative value) means
  // std::thread::hardware_concurrency() (at least 1). ParallelFor runs on up
  // to `num_threads` threads in all: the calling thread plus
  // `num_threads - 1` workers, so it never oversubscribes the cores it was
  // sized for. `nice` > 0 lowers the workers' scheduling priority (Linux
  // per-thread nice value, setpriority(2); ignored where it fails), so that
  // threads of default priority (the GPU's critical path) preempt them
  // when the cores are oversubscribed.
  static std::unique_ptr<ThreadPool> Create(int num_threads, int nice = 0);

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Drains the queue (every scheduled task runs), then joins the workers.
  ~ThreadPool();

  // The parallelism of ParallelFor, and the number of worker threads.
  int num_threads() const { return static_cast<int>(workers_.size()); }

  // Splits [0, n) into contiguous, near-equal chunks of at least
  // `min_chunk` indices (a range shorter than `min_chunk` is one chunk), at
  // most 4 per thread, calls `fn(begin, end)` once per chunk, with
  // begin < end, on the calling thread and up to num_threads() - 1 workers,
  // and returns when every call has returned. The chunk boundaries depend
  // only on (n, min_chunk, num_threads()), not on timing (see
  // Note [ParallelFor chunking] in the .cc). n <= 0 calls nothing;
  // min_chunk < 1 is treated as 1.
  //
  // `fn` is called concurrently on disjoint chunks; it must not throw.
  void ParallelFor(int64_t n, int64_t min_chunk,
                   absl::FunctionRef<void(int64_t begin, int64_t end)> fn);

  // Queues `task` to run on a worker and returns at once. When `done` is not
  // null, calls done->Add(1) now and done->Done() after `task` has returned;
  // `done` must outlive the task. Tasks start in FIFO order; several run at
  // once when there are several workers.
  void Schedule(std::function<void()> task, WaitGroup* done = nullptr);

 private:
  ThreadPool(int num_threads, int nice);
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_THREAD_POOL_H_
