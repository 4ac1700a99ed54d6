// See serial_worker.h.
#include "server/core/serial_worker.h"

#include <exception>
#include <utility>

namespace megatrain::server {

SerialWorker::SerialWorker() : thread_(&SerialWorker::Loop, this) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();  // Loop runs what is queued before it returns
}

void SerialWorker::Post(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return tasks_.size() < kMaxPendingTasks; });
  tasks_.push_back(std::move(task));
  lock.unlock();
  changed_.notify_all();
}

void SerialWorker::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return tasks_.empty() && !running_task_; });
}

void SerialWorker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    running_task_ = true;
    lock.unlock();
    changed_.notify_all();  // a full queue has room
    try {
      task();
    } catch (...) {
      // A task must not throw (serial_worker.h); nothing to tell anyone.
    }
    lock.lock();
    running_task_ = false;
    changed_.notify_all();  // Drain may be done
  }
}

}  // namespace megatrain::server
