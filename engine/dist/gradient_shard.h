// Shard arithmetic and the choice of gradient reduction for data
// parallelism (docs/distributed.md). No LibTorch types: the CPU unit
// tests (tests/engine/dist/gradient_shard_test.cc) check it directly.
//
// Note [Shard layout]
// A block of `numel` fp32 gradient values is split over the `world` ranks
// of one host (one process) in the layout of c10d's _reduce_scatter_base
// (NCCL's ncclReduceScatter): every shard has S = ceil(numel / world)
// elements, the block is padded with zeros to world * S, and rank r owns
// elements [r * S, (r + 1) * S) clipped to [0, numel). With numel not a
// multiple of world the last owning rank's shard is shorter, and when
// numel < world the ranks past it own nothing (begin == end == numel):
// e.g. numel 10, world 4: S 3, shards [0,3) [3,6) [6,9) [9,10); numel 2,
// world 4: S 1, shards [0,1) [1,2) [2,2) [2,2). The shards are disjoint and
// cover the block. Both reduction paths land the same shards, so the
// shared store's gradient is assembled the same way whichever ran.
#ifndef MEGATRAIN_ENGINE_DIST_GRADIENT_SHARD_H_
#define MEGATRAIN_ENGINE_DIST_GRADIENT_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// Elements [begin, end) of a block, 0 <= begin <= end <= numel.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// S = ceil(numel / world): the elements of every shard of the padded block
// (Note [Shard layout]); 0 for an empty block. Precondition: numel >= 0,
// world >= 1.
inline int64_t PaddedShardNumel(int64_t numel, int world) { return (numel + world - 1) / world; }

// Rank `rank`'s shard of a block of `numel` values over `world` ranks
// (Note [Shard layout]). Precondition: 0 <= rank < world.
inline ShardRange ShardOf(int64_t numel, int rank, int world) {
  const int64_t s = PaddedShardNumel(numel, world);
  const int64_t begin = s * rank < numel ? s * rank : numel;
  const int64_t end = s * (rank + 1) < numel ? s * (rank + 1) : numel;
  return ShardRange{begin, end};
}

// How each block's gradient is reduced over the ranks (docs/distributed.md,
// "The two reduction paths").
enum class GradientReduction {
  // Choose: kDeviceReduceScatter where the backend has a reduce-scatter on
  // the devices' memory (NCCL), else kHostAllReduce.
  kAuto,
  // The block lands whole in host memory, is all-reduced there (gloo; NCCL
  // stages it through device memory) and each rank copies its shard into
  // the shared store.
  kHostAllReduce,
  // Before the D2H copy, the block's gradient is reduce-scattered over this
  // process's ranks on the devices (and, with several processes, each
  // shard is all-reduced over the processes' ranks of the same local
  // index); each rank copies only its shard to the host (1/world of the
  // block's D2H bytes). Blocks whose gradient is not whole on the device at
  // landing (the embedding's scatter-added rows; a block summed over
  // micro-batches on the host) still take kHostAllReduce.
  kDeviceReduceScatter,
};

// "auto", "host_all_reduce" or "device_reduce_scatter".
const char* GradientReductionName(GradientReduction reduction);
// The inverse; INVALID_ARGUMENT naming `field` for any other text.
absl::StatusOr<GradientReduction> ParseGradientReduction(const std::string& text,
                                                         const std::string& field);

// The path a group takes: `requested` (kAuto resolved) for a c10d backend
// named `backend` ("gloo", "nccl") that `has_reduce_scatter` (c10d's
// _reduce_scatter_base on its tensors: NCCL on every supported LibTorch;
// not gloo 1.13, which throws). kAuto: kDeviceReduceScatter exactly for
// NCCL with a reduce-scatter (on the CPU there is no D2H copy to save).
// kDeviceReduceScatter asked of a backend without a reduce-scatter is
// kept: CollectiveGroup::ReduceScatterSum then emulates it (all-reduce,
// then the shard), which the CPU tests use to run the device path's
// landing over gloo. Never returns kAuto.
GradientReduction SelectGradientReduction(GradientReduction requested, const std::string& backend,
                                          bool has_reduce_scatter);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_GRADIENT_SHARD_H_
