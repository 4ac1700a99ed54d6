// The CPU optimizer's queue (optimizer_queue.h).
#include "engine/optim/optimizer_queue.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "engine/runtime/thread_pool.h"

namespace megatrain::engine {

OptimizerQueue::OptimizerQueue(int64_t num_blocks, int nice) {
  {
    absl::MutexLock lock(&mu_);
    pending_.assign(num_blocks, 0);
  }
  thread_ = std::thread([this, nice] { Loop(nice); });
}

OptimizerQueue::~OptimizerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();  // runs every queued task first
}

void OptimizerQueue::Push(const Key& key, int64_t block, Task task) {
  absl::MutexLock lock(&mu_);
  if (block >= 0) {
    ++pending_[block];
    ++pending_count_;
  }
  tasks_.push_back(Entry{key, block, std::move(task)});
}

void OptimizerQueue::Loop(int nice) {
  if (nice != 0) SetCurrentThreadNice(nice);
  while (true) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;
      auto next =
          std::min_element(tasks_.begin(), tasks_.end(), [](const Entry& a, const Entry& b) {
            return std::tie(a.key.step, a.key.order, a.key.slice) <
                   std::tie(b.key.step, b.key.order, b.key.slice);
          });
      entry = std::move(*next);
      tasks_.erase(next);
    }
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = entry.run();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    absl::MutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    busy_seconds_ += seconds;
    if (entry.block >= 0) {
      --pending_[entry.block];
      --pending_count_;
    }
  }
}

void OptimizerQueue::WaitBlock(int64_t block) {
  absl::MutexLock lock(&mu_);
  auto done = [this, block]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_[block] == 0; };
  mu_.Await(absl::Condition(&done));
}

absl::Status OptimizerQueue::WaitAll() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_count_ == 0; };
  mu_.Await(absl::Condition(&idle));
  return error_;
}

absl::Status OptimizerQueue::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

void OptimizerQueue::RecordError(const absl::Status& status) {
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = status;
}

double OptimizerQueue::TakeBusySeconds() {
  absl::MutexLock lock(&mu_);
  const double seconds = busy_seconds_;
  busy_seconds_ = 0;
  return seconds;
}

}  // namespace megatrain::engine
