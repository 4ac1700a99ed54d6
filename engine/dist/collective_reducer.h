// GradientReducer over a CollectiveGroup (Note [Data-parallel step] in
// step/gradient_reducer.h; the reduction order is in docs/distributed.md).
#ifndef MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
#define MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/store/host_store.h"
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
// Note [Shard landing]
// Note [Shared host store] in step/gradient_reducer.h wants a
// reduce-scatter: rank r ends with the sum over the ranks of its 1/N shard
// of the block (elements [numel*r/N, numel*(r+1)/N)), which it copies into
// the shared store's gradient. LibTorch 1.13's ProcessGroupGloo has no
// reduce_scatter (it throws "ProcessGroupGloo does not support
// reduce_scatter"), and the CPU tests run gloo, so every backend
// all-reduces the rank's whole landing buffer and each rank then copies
// only its shard: the shared gradient is the same bits as a reduce-scatter
// whose sums match the all-reduce's. (NCCL's reduce_scatter on the device,
// before the D2H copy, is the intended GPU path; not built.) Every rank's
// all-reduced buffer holds the same bits, so the squared norm is taken over
// the whole block on each rank and agrees everywhere. The owner's
// ReduceBlock waits until all N shards of the block landed (`round` counts
// the owner's calls for that block: the shard of round k cannot arrive
// before the owner's k-th all-reduce, a collective it takes part in).
//
// Thread-safety: all methods are thread-safe (each rank's accumulator
// thread calls Land; the owner's calls WaitLanded).
class GradientShards {
 public:
  // `shared`: the store whose gradient arena receives the shards (not
  // owned); `world`: the ranks.
  GradientShards(HostStore* shared, int world);

  // Rank `rank` lands its shard of `block` from `reduced` ([numel] fp32,
  // its all-reduced landing buffer); null when its collective failed (the
  // shard is not copied but counted, so that the owner does not wait
  // forever; the step fails through EndStep).
  void Land(int rank, int64_t block, const float* reduced);
  // Blocks until `block` was landed by every rank `round` times, or
  // `timeout` passed (false).
  bool WaitLanded(int64_t block, int64_t round, absl::Duration timeout);

 private:
  HostStore* shared_;
  int world_;
  absl::Mutex mu_;
  std::vector<int64_t> landed_ ABSL_GUARDED_BY(mu_);  // per block: shards landed so far
};

// Thread-safety: as GradientReducer. Does not own `group` or `shards`.
class CollectiveGradientReducer : public GradientReducer {
 public:
  // `vocab_size` bounds the token ids BeginStep checks. `shards`: where
  // this rank lands its shard (Note [Shard landing]); `owner`: whether this
  // rank's trainer runs the AdamW (then ReduceBlock waits for every shard,
  // up to `timeout`).
  CollectiveGradientReducer(CollectiveGroup* group, int64_t vocab_size, GradientShards* shards,
                            bool owner, std::chrono::milliseconds timeout);

  absl::Status BeginStep(absl::Span<const MicroBatch> micro_batches) override;
  double ReduceBlock(int64_t block, float* grad, int64_t numel) override;
  absl::StatusOr<double> EndStep(double loss_sum) override;
  int64_t global_counted_tokens() const override { return global_tokens_; }

 private:
  CollectiveGroup* group_;
  int64_t vocab_size_;
  int64_t global_tokens_ = 0;
  GradientShards* shards_;
  bool owner_;
  absl::Duration timeout_;
  std::vector<int64_t> rounds_;  // per block: ReduceBlock calls (accumulator thread only)
  double scale_ = 1;             // N_r / N
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // first failed collective of the step
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
