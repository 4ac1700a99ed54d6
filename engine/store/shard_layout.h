// The layout of a block's shards over the ranks of one host (data
// parallelism, docs/distributed.md): what each rank reduce-scatters,
// updates and, with the NVMe tier, keeps in its moment files. Header-only,
// no LibTorch types; below engine/dist/ so that the store's NVMe tier can
// read it (tests: tests/engine/dist/gradient_shard_test.cc).
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
#ifndef MEGATRAIN_ENGINE_STORE_SHARD_LAYOUT_H_
#define MEGATRAIN_ENGINE_STORE_SHARD_LAYOUT_H_

#include <cstdint>

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

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STORE_SHARD_LAYOUT_H_
