// SerialWorker: one thread that runs posted tasks in order, so that a
// training thread can hand off work that takes locks RPC handlers also take
// (the job store's, the watchers' notification) and go back to its step.
//
// Note [Progress off the step]
// A job's observer (JobManager::Observer) used to write every step's
// progress and event to the job store, and wake the watchers, on the
// training thread: under control-plane load the store's lock (held by
// ListJobs / GetJob / WatchJob readers) and the SQLite write then sat on the
// step's critical path, and 32 polling clients cut a CPU job's steps/s by
// 97%. Now the observer copies the step's numbers into a task and Posts it
// to the job's SerialWorker, which persists and notifies on its own thread,
// in the order the steps happened; the job thread waits for the worker only
// when the queue is full (kMaxPendingTasks: backpressure instead of unbounded
// memory) and when the job ends (Drain, before its final state is written,
// so that watchers see every step before the end).
//
// Thread-safety: Post and Drain may be called from any thread; tasks run on
// the worker's thread, one at a time, in Post order. The destructor drains
// and joins; tasks must not throw (an exception is caught and dropped).
#ifndef MEGATRAIN_SERVER_SERIAL_WORKER_H_
#define MEGATRAIN_SERVER_SERIAL_WORKER_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::server {

class SerialWorker {
 public:
  // Tasks waiting at most; Post blocks beyond (a worker this far behind is
  // minutes of steps behind: the store is stuck, not slow).
  static constexpr size_t kMaxPendingTasks = 4096;

  SerialWorker();
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`; returns at once unless kMaxPendingTasks are waiting.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns once every task posted before the call has run.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Conditions for mu_.Await (absl::Mutex re-checks them on every unlock:
  // no condition variable to signal).
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasTaskOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_SERIAL_WORKER_H_
