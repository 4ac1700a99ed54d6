// GradientReducer over a CollectiveGroup (Note [Data-parallel step] in
// step/gradient_reducer.h; the reduction order is in docs/distributed.md).
#ifndef MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
#define MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/store/host_store.h"
#include "engine/dist/gradient_shard.h"
#include "engine/dist/process_group.h"
#include "engine/step/gradient_reducer.h"

namespace megatrain::engine {

// Note [Gradient all-reduce]
// Rank r's landed gradient is g_r = sum over its micro-batches of d(token
// losses) / N, N the global batch's counted tokens (agreed in BeginStep;
// the executor's loss scale, BatchShare), plus the MoE aux terms of its
// micro-batches (Note [Data-parallel step]). The reducer sums the g_r
// over the ranks, so the result is the gradient of one device
// accumulating the global batch; the only difference is the order of the
// fp32 sum (each rank sums its micro-batches in order, then the
// all-reduce adds the ranks' sums). The squared norm is summed in fp64
// over fixed 1 M-element chunks, in chunk order, so every rank computes the
// same bits whatever its thread count.
//
// Note [Shard landing]
// Note [Shared host store] in step/gradient_reducer.h wants a
// reduce-scatter: rank r of a process's L ranks ends with the sum over all
// ranks of its shard of the block (ShardOf(numel, r, L), Note [Shard
// layout] in gradient_shard.h), which it copies into the shared store's
// gradient. Two paths (GradientReduction), chosen per group and taken per
// block:
// * kHostAllReduce: the block lands whole in the rank's landing buffer and
//   is all-reduced there over every rank of the job (gloo; NCCL stages it
//   through device memory); each rank then copies only its shard. LibTorch
//   1.13's gloo has no reduce-scatter, so this is the CPU path. Every
//   rank's all-reduced buffer holds the same bits, so the squared norm is
//   taken over the whole block on each rank (fixed chunks) and agrees
//   everywhere; only the owner waits for the shards.
// * kDeviceReduceScatter (Note [Device reduce-scatter] in
//   step/gradient_reducer.h): ReduceScatterOnDevice scales the device
//   gradient, reduce-scatters it over the process's ranks (`local_group`)
//   and, with several processes, all-reduces the shard over the ranks of
//   the same local index (`cross_group`); only the shard is copied to the
//   host, and ReduceBlock copies it into the shared store and records its
//   squared norm. The block's squared norm is the sum of the L shards'
//   norms in rank order (each fixed-chunk fp64), so every rank of every
//   process returns the same bits; every rank waits for the shards. A
//   block whose whole gradient is not on the device at landing (the
//   embedding; a block summed over micro-batches on the host) is not
//   offered to ReduceScatterOnDevice and takes the host path.
//   With the gradient ring (Note [Ring shards] in step/gradient_reducer.h)
//   the shard goes to the rank's ring instead: ReduceRingShard lands
//   nothing but the shard's squared norm (taken on the device) and
//   returns the same rank-order sum. The ring takes this path only: the
//   shared store then has no gradient arena, and the embedding (host
//   path) keeps its reduced gradient in each rank's landing buffer.
// A rank's ReduceBlock (or ReduceRingShard) waits until all L shards of the block landed
// (`round` counts its calls for that block: the shard of round k cannot
// arrive before the k-th collective of that block, one it takes part in).
//
// Thread-safety: all methods are thread-safe (each rank's accumulator
// thread calls Land; the owner's calls WaitLanded).
class GradientShards {
 public:
  // `shared`: the store whose gradient arena receives the shards (not
  // owned); `world`: the ranks sharing it (this process's).
  GradientShards(HostStore* shared, int world);

  int world() const { return world_; }
  // Rank `rank` lands its shard of `block` from `reduced` ([numel] fp32,
  // its landing buffer: only the shard's range is read); null when its
  // collective failed (the shard is not copied but counted, so that no
  // rank waits forever; the step fails through EndStep) or when the
  // shard is in the rank's gradient ring (Note [Ring shards]); not
  // copied either where the shared store has no gradient of `block`
  // (the ring's store). `shard_sq`: the
  // shard's squared norm (ShardNormsSum; 0 where unused).
  void Land(int rank, int64_t block, const float* reduced, double shard_sq = 0);
  // Blocks until `block` was landed by every rank `round` times, or
  // `timeout` passed (false).
  bool WaitLanded(int64_t block, int64_t round, absl::Duration timeout);
  // The landed shards' squared norms of `block`, added in rank order
  // (after WaitLanded).
  double ShardNormsSum(int64_t block);

 private:
  HostStore* shared_;
  int world_;
  absl::Mutex mu_;
  std::vector<int64_t> landed_ ABSL_GUARDED_BY(mu_);   // per block: shards landed so far
  std::vector<double> shard_sq_ ABSL_GUARDED_BY(mu_);  // [block * world + rank]
};

// What a CollectiveGradientReducer works with (Note [Shard landing]). Not
// owned; each group is used by one thread at a time.
struct CollectiveReducerGroups {
  // Every rank of the job: BeginStep, EndStep and the host path's
  // all-reduce (step and accumulator threads, never concurrently).
  CollectiveGroup* all = nullptr;
  // This process's ranks, used by the executor's enqueuing thread only:
  // the device reduce-scatter (kDeviceReduceScatter) and the resident
  // blocks' all-reduce (Note [Resident blocks on every rank] in
  // step/gradient_reducer.h); null: neither (the host path only).
  CollectiveGroup* local = nullptr;
  // Whether streamed blocks take the device reduce-scatter (Note [Shard
  // landing]); needs `local`.
  bool device_reduce_scatter = false;
  // Note [Sharded weight streaming] in step/weight_slots.h: this process's
  // ranks again, as a group of its own (on NCCL its own communicator and
  // stream, so that the gathers of prefetched weights do not queue behind
  // gradient reductions that wait for compute); used by the executor's
  // enqueuing thread only. Null: every rank loads whole blocks.
  CollectiveGroup* weights = nullptr;
  // With `local`, several processes: the rank of the same local index in
  // every process (the second stage of both device reductions); null with
  // one process.
  CollectiveGroup* cross = nullptr;
  // This rank's index among its process's ranks (its shard).
  int local_rank = 0;
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
  // Over `groups` (one process: local_rank == groups.all->rank()).
  CollectiveGradientReducer(const CollectiveReducerGroups& groups, int64_t vocab_size,
                            GradientShards* shards, bool owner, std::chrono::milliseconds timeout);

  absl::Status BeginStep(absl::Span<const MicroBatch> micro_batches, bool rank_failed) override;
  double ReduceBlock(int64_t block, float* grad, int64_t numel) override;
  // Note [Ring shards]: the device path only (a block the host path
  // reduces has no ring landing).
  double ReduceRingShard(int64_t block, double shard_squared_norm) override;
  int gradient_shard_world() const override {
    return device_reduce_scatter_ ? shards_->world() : 1;
  }
  absl::StatusOr<PassSums> EndStep(const PassSums& local) override;
  int64_t global_counted_tokens() const override { return global_tokens_; }
  int64_t first_micro_batch() const override { return first_micro_batch_; }
  // Note [Device reduce-scatter]: false unless groups.device_reduce_scatter.
  bool ReduceScatterOnDevice(int64_t block, float* grad, int64_t numel, int64_t* begin,
                             int64_t* end) override;
  // Note [Resident blocks on every rank]: false unless groups.local was
  // given; sums over the local ranks, then over the processes (the cross
  // group).
  bool AllReduceOnDevice(int64_t block, float* grad, int64_t numel) override;
  bool reduce_scatters_on_device() const override { return device_reduce_scatter_; }
  // Note [Sharded weight streaming]: over groups.weights.
  int weight_shard_world() const override {
    return weights_group_ != nullptr ? weights_group_->world_size() : 1;
  }
  int weight_shard_rank() const override {
    return weights_group_ != nullptr ? weights_group_->rank() : 0;
  }
  void AllGatherWeights(int64_t block, void* slot, int64_t shard_numel, int element_bytes) override;

 private:
  // Records the step's first failed collective (for EndStep).
  void Fail(int64_t block, const absl::Status& status);
  // The start of a block's ReduceBlock or ReduceRingShard: counts its
  // round (returned), and takes whether the block was reduced on the
  // device this round (`*on_device`, then cleared) and the step's error.
  int64_t BeginRound(int64_t block, bool* on_device, absl::Status* status);
  // The end of either: waits (when `wait`) until every rank's shard of
  // `block` landed `round` times; records a failure and returns NaN, or
  // `squared_norm()`.
  double EndRound(int64_t block, int64_t round, bool wait, absl::Status status,
                  const std::function<double()>& squared_norm);

  CollectiveGroup* group_;
  CollectiveGroup* local_group_ = nullptr;
  CollectiveGroup* cross_group_ = nullptr;
  bool device_reduce_scatter_ = false;
  CollectiveGroup* weights_group_ = nullptr;
  int local_rank_ = 0;
  int64_t vocab_size_;
  int64_t global_tokens_ = 0;
  GradientShards* shards_;
  bool owner_;
  absl::Duration timeout_;
  std::vector<int64_t> rounds_;    // per block: ReduceBlock calls (accumulator thread only)
  int64_t first_micro_batch_ = 0;  // this rank's, in the global batch (BeginStep)
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // first failed collective of the step
  // Per block: reduced on the device this round (set on the enqueuing
  // thread, read by the block's ReduceBlock).
  std::vector<bool> on_device_ ABSL_GUARDED_BY(mu_);
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_COLLECTIVE_REDUCER_H_
