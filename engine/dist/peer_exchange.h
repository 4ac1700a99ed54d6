// Collectives over the GPUs of one process by peer copies on the copy
// engines (Note [Peer copies]).
#ifndef MEGATRAIN_ENGINE_DIST_PEER_EXCHANGE_H_
#define MEGATRAIN_ENGINE_DIST_PEER_EXCHANGE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine {

// Note [Peer copies]
// NCCL's collectives run as kernels: under the backward's GEMMs their
// blocks wait for SMs, and an all-reduce that moves 313 GB/s alone moved
// about 27 GB/s during the backward on a 2 x H200 host (NV18). The ranks
// of a data-parallel job in one process (DataParallelTrainer's threads)
// can instead read each other's device memory with cudaMemcpyPeerAsync,
// which the copy engines carry over NVLink without an SM, and do only the
// additions as kernels (memory-bound, a few hundred microseconds a block).
//
// Each collective is one or more meetings. At a meeting every rank
// records an event on its current stream (its data is ready), publishes
// the event and its buffer's address, and waits on the host until every
// rank has published the same meeting (the ranks call the collectives in
// the same order: the same step plan, one enqueuing thread each); then
// each rank's stream waits for the others' events and copies from their
// buffers. Nothing blocks a GPU beyond those event waits.
//   * ReduceScatterSum: meet; pull every peer's part of this rank's shard
//     (ShardOf) in chunks into a receive buffer and add it to the shard;
//     meet again, so that no rank reuses its buffer before every peer has
//     read from it. A rank writes only its own shard, which no peer reads.
//   * AllReduceSum: the reduce-scatter, then pull every peer's summed
//     shard into place, then a last meeting. Every element is summed once,
//     by its shard's owner, so the ranks hold bit-identical sums.
//   * AllGather: meet; pull every peer's shard; meet again.
// Memory: one receive buffer of kChunkElements fp32 per rank (128 MiB),
// on the device, allocated at the first reduction.
// The events of a rank are a ring of kSlots: a rank re-records one only
// kSlots meetings later, when every peer has long enqueued its wait on it.
class PeerExchange {
 public:
  static constexpr int64_t kChunkElements = int64_t{32} << 20;

  // The ranks' CUDA device indices, rank r on devices[r]. Enables peer
  // access between every pair. UNAVAILABLE when a pair has no peer access
  // or the build has no CUDA; INVALID_ARGUMENT for fewer than 2 devices
  // or a device named twice. A meeting fails with UNAVAILABLE after
  // `timeout` (a peer failed or never came).
  static absl::StatusOr<std::shared_ptr<PeerExchange>> Create(const std::vector<int>& devices,
                                                              std::chrono::milliseconds timeout);
  ~PeerExchange();

  int world_size() const;

  // Called by rank `rank`'s enqueuing thread, in the same order on every
  // rank, with that rank's device current and the stream to use as
  // LibTorch's current stream there. No host synchronisation with the
  // GPUs; errors: UNAVAILABLE (a meeting timed out, a CUDA call failed).
  //
  // Sums `data` ([numel] fp32 on the rank's device) over the ranks into
  // data[ShardOf(numel, rank, world)); the rest of `data` is unchanged.
  absl::Status ReduceScatterSum(int rank, float* data, int64_t numel);
  // Sums `data` ([numel] fp32) over the ranks, in place, bit-identical on
  // every rank.
  absl::Status AllReduceSum(int rank, float* data, int64_t numel);
  // `data` holds world * shard_numel elements of `element_bytes` bytes of
  // which this rank wrote [rank * shard_numel, (rank + 1) * shard_numel);
  // afterwards every rank holds every shard.
  absl::Status AllGather(int rank, void* data, int64_t shard_numel, int element_bytes);

  struct Impl;

 private:
  explicit PeerExchange(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_PEER_EXCHANGE_H_
