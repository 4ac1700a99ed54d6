// One long-lived thread per data-parallel rank of a process (Note [Rank
// threads]).
#ifndef MEGATRAIN_ENGINE_DIST_RANK_THREADS_H_
#define MEGATRAIN_ENGINE_DIST_RANK_THREADS_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

// Note [Rank threads]
// A rank's set-up (its process groups), every step and every wait for its
// optimizer run on the same thread for the trainer's whole life, rather
// than on threads made for each call: LibTorch keeps per-thread state (the
// current CUDA streams, cuBLAS handles and the workspaces keyed by handle
// and stream), which a new thread each step would make and drop again, and
// a rank's caches stay with one thread.
class RankThreads {
 public:
  // Starts `ranks` threads (>= 1).
  explicit RankThreads(int ranks);
  // Joins the threads; a Run still going is waited for first.
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs fn(r) on rank r's thread for every rank at once and waits for all
  // of them; returns the lowest rank's error. Calls from several threads
  // are serialised; fn must not call Run (it would wait for itself).
  absl::Status Run(const std::function<absl::Status(int)>& fn);

  // Runs fn(r) on rank r's thread for one rank at a time, rank 0 first,
  // each after the previous one returned (Note [Serial first use] in
  // dist/first_use.h); stops at the first error and returns it (the later
  // ranks do not run). Serialised with Run; fn must not call Run.
  absl::Status RunOneAtATime(const std::function<absl::Status(int)>& fn);

 private:
  void Loop(int rank);

  absl::Mutex run_mu_;  // one Run at a time
  absl::Mutex mu_;
  const std::function<absl::Status(int)>* task_ ABSL_GUARDED_BY(mu_) = nullptr;
  long generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by each Run
  int pending_ ABSL_GUARDED_BY(mu_) = 0;      // ranks still running this generation
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_RANK_THREADS_H_
