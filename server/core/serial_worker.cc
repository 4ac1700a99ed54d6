// See serial_worker.h.
#include "server/core/serial_worker.h"

#include <exception>
#include <utility>

namespace megatrain::server {

SerialWorker::SerialWorker() : thread_(&SerialWorker::Loop, this) {}

SerialWorker::~SerialWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();  // Loop runs what is queued before it returns
}

bool SerialWorker::HasRoom() const { return tasks_.size() < kMaxPendingTasks; }

bool SerialWorker::Idle() const { return tasks_.empty() && !running_task_; }

bool SerialWorker::HasTaskOrStopping() const { return stopping_ || !tasks_.empty(); }

void SerialWorker::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &SerialWorker::HasRoom));
  tasks_.push_back(std::move(task));
}

void SerialWorker::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &SerialWorker::Idle));
}

void SerialWorker::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SerialWorker::HasTaskOrStopping));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_task_ = true;
    }
    try {
      task();
    } catch (...) {
      // A task must not throw (serial_worker.h); nothing to tell anyone.
    }
    absl::MutexLock lock(&mu_);
    running_task_ = false;
  }
}

}  // namespace megatrain::server
