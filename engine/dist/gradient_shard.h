// Shard arithmetic and the choice of gradient reduction for data
// parallelism (docs/distributed.md). No LibTorch types: the CPU unit
// tests (tests/engine/dist/gradient_shard_test.cc) check it directly.
// The shards' layout (ShardRange, ShardOf: Note [Shard layout]) lives in
// engine/store/shard_layout.h, where the NVMe tier reads it too.
#ifndef MEGATRAIN_ENGINE_DIST_GRADIENT_SHARD_H_
#define MEGATRAIN_ENGINE_DIST_GRADIENT_SHARD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/store/shard_layout.h"

namespace megatrain::engine {

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
