// GradientReducer over a CollectiveGroup (Note [Data-parallel step] in
// step/gradient_reducer.h; the reduction order is in docs/distributed.md).
#ifndef MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
#define MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/dist/process_group.h"
#include "engine/step/gradient_reducer.h"

namespace megatrain::engine {

// Note [Gradient all-reduce]
// Rank r's landed gradient is g_r = sum over its micro-batches of d(token
// losses) / N_r, N_r its counted tokens (the executor's loss scale). The
// reducer multiplies it by N_r / N (N the global count, agreed in
// BeginStep) and sums over the ranks, so the result is the gradient of
// the mean over the global batch. With equal N_r and a power-of-two world
// size the factor is a power of two and the rescaling is exact; the only
// difference from one device accumulating the whole batch is the order of
// the fp32 sum (each rank sums its micro-batches in order, then the
// all-reduce adds the ranks' sums). The squared norm is summed in fp64
// over fixed 1 M-element chunks, in chunk order, so every rank computes the
// same bits whatever its thread count.
//
// Thread-safety: as GradientReducer. Does not own `group`.
class CollectiveGradientReducer : public GradientReducer {
 public:
  // `vocab_size` bounds the token ids BeginStep checks.
  CollectiveGradientReducer(CollectiveGroup* group, int64_t vocab_size)
      : group_(group), vocab_size_(vocab_size) {}

  absl::Status BeginStep(absl::Span<const MicroBatch> micro_batches) override;
  double ReduceBlock(int64_t block, float* grad, int64_t numel) override;
  absl::StatusOr<double> EndStep(double loss_sum) override;
  int64_t global_counted_tokens() const override { return global_tokens_; }

 private:
  CollectiveGroup* group_;
  int64_t vocab_size_;
  int64_t global_tokens_ = 0;
  double scale_ = 1;  // N_r / N
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // first failed collective of the step
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
