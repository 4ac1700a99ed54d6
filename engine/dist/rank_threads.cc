// One long-lived thread per rank (rank_threads.h, Note [Rank threads]).
#include "engine/dist/rank_threads.h"

#include <utility>

namespace megatrain::engine {

RankThreads::RankThreads(int ranks) {
  {
    absl::MutexLock lock(&mu_);
    status_.resize(static_cast<size_t>(ranks));
  }
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  absl::MutexLock run(&run_mu_);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status RankThreads::Run(const std::function<absl::Status(int)>& fn) {
  absl::MutexLock run(&run_mu_);
  absl::MutexLock lock(&mu_);
  task_ = &fn;
  pending_ = size();
  ++generation_;
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  task_ = nullptr;
  for (const absl::Status& s : status_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RankThreads::RunOneAtATime(const std::function<absl::Status(int)>& fn) {
  for (int turn = 0; turn < size(); ++turn) {
    // The other ranks' threads return at once: one Run per turn.
    absl::Status status =
        Run([&fn, turn](int rank) { return rank == turn ? fn(rank) : absl::OkStatus(); });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void RankThreads::Loop(int rank) {
  long seen = 0;
  while (true) {
    const std::function<absl::Status(int)>* task = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    absl::Status status = (*task)(rank);
    absl::MutexLock lock(&mu_);
    status_[static_cast<size_t>(rank)] = std::move(status);
    --pending_;
  }
}

}  // namespace megatrain::engine
