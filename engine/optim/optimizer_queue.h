// The CPU optimizer's queue: block updates (and other optimizer work) run
// on one thread in earliest-deadline-first order (Notes [Optimizer
// overlap] and [Optimizer slices] in trainer.h).
//
// Every task has a key (step, order, slice); the thread always runs the
// queued task of the lowest key. Blocks are ordered in forward order, so
// that is the update the next forward needs soonest. A task may count
// toward a block's pending updates: WaitBlock(block) returns once none of
// the block's counted tasks is queued or running, WaitAll once no counted
// task is.
//
// Ownership: owns its thread, started by the constructor at nice value
// `nice` and joined by the destructor after every queued task ran.
// Thread-safety: all methods are thread-safe.
#ifndef MEGATRAIN_ENGINE_OPTIM_OPTIMIZER_QUEUE_H_
#define MEGATRAIN_ENGINE_OPTIM_OPTIMIZER_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

class OptimizerQueue {
 public:
  // The scheduling key: lower runs first, compared as a tuple.
  struct Key {
    int64_t step = 0;   // optimizer step the task belongs to
    int64_t order = 0;  // within a step: the block's forward position
    int64_t slice = 0;  // within a block: its slice
  };
  // A task; its error (if any) is kept as the queue's first error.
  using Task = std::function<absl::Status()>;

  // `num_blocks`: the blocks WaitBlock knows; `nice` > 0 lowers the
  // thread's priority (ThreadPool's SetCurrentThreadNice).
  OptimizerQueue(int64_t num_blocks, int nice);
  ~OptimizerQueue();
  OptimizerQueue(const OptimizerQueue&) = delete;
  OptimizerQueue& operator=(const OptimizerQueue&) = delete;

  // Queues `task` under `key`; it counts toward `block`'s pending updates
  // unless `block` is -1.
  void Push(const Key& key, int64_t block, Task task);
  // Blocks until `block` has no counted task queued or running.
  void WaitBlock(int64_t block);
  // Blocks until no counted task is queued or running; returns the first
  // error a task returned (kept: later calls return it too).
  absl::Status WaitAll();
  // The first error so far (OK if none).
  absl::Status error() const;
  // Keeps `status` as the queue's error if it is the first.
  void RecordError(const absl::Status& status);
  // Thread seconds spent in tasks since the last call.
  double TakeBusySeconds();

 private:
  struct Entry {
    Key key;
    int64_t block = -1;
    Task run;
  };
  void Loop(int nice);

  mutable absl::Mutex mu_;
  std::deque<Entry> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> pending_ ABSL_GUARDED_BY(mu_);  // per block: counted tasks not done
  int64_t pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  double busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_OPTIM_OPTIMIZER_QUEUE_H_
