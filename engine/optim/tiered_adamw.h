// AdamW with the moments on the NVMe tier (Note [NVMe tier] in
// engine/store/nvme_tier.h): the optimizer step of a job whose host store
// keeps no exp_avg / exp_avg_sq. Same arithmetic as CpuAdamW::Step on the
// store's buffers, chunk by chunk (the update is elementwise, so the
// result is bit-identical to the all-in-RAM step: tiered_adamw_test).
#ifndef MEGATRAIN_ENGINE_OPTIM_TIERED_ADAMW_H_
#define MEGATRAIN_ENGINE_OPTIM_TIERED_ADAMW_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/optim/adamw.h"
#include "engine/store/host_store.h"
#include "engine/store/nvme_tier.h"

namespace megatrain::engine {

// Updates `blocks` of `store` (in this order, the optimizer's: forward
// order) with update number `step`, rate `lr` and gradient multiplier
// `grad_scale`: params and gradients from the store, moments read ahead
// from `moments` and written behind (NvmeMomentFiles::ForEachChunk), the
// bf16 streaming copy refreshed as CpuAdamW::Step does. `moments` must
// have store.arena_numel() elements. Errors: CpuAdamW::Step's (nothing
// written for that chunk), and the tier's (DATA_LOSS for a truncated file,
// RESOURCE_EXHAUSTED for a full disk, naming the file). Thread-safety: one
// call at a time per `moments`; blocks must not be touched by others
// meanwhile.
absl::Status TieredAdamWStep(const CpuAdamW& adamw, const HostStore& store,
                             NvmeMomentFiles& moments, const std::vector<int64_t>& blocks,
                             int64_t step, double lr, float grad_scale);

// As TieredAdamWStep for elements [begin, begin + count) of one block:
// the trainer's unit of work (Note [Optimizer slices] in trainer.h), with
// the moments where `layout` keeps them in `moments` (Note [Tier shards]
// in store/nvme_tier.h: a data-parallel rank's shard). The slice must lie
// in the layout's range of the block, starting a multiple of 1024
// elements after the range's first element (the tier's 4 KiB alignment);
// INVALID_ARGUMENT otherwise, and when `moments` does not have
// layout.numel elements. Other errors and thread-safety as
// TieredAdamWStep.
absl::Status TieredAdamWSliceStep(const CpuAdamW& adamw, const HostStore& store,
                                  NvmeMomentFiles& moments, const NvmeShardLayout& layout,
                                  int64_t block, int64_t begin, int64_t count, int64_t step,
                                  double lr, float grad_scale);

// Copies the moments of every block between `tier` (every shard's files)
// and host buffers laid out like the store's arenas ([store.arena_numel()]
// fp32 each), for checkpoints (to host) and resume (from host). Errors:
// the tier's.
absl::Status CopyMomentsToHost(const NvmeMomentTier& tier, const HostStore& store, float* exp_avg,
                               float* exp_avg_sq);
absl::Status CopyMomentsFromHost(const NvmeMomentTier& tier, const HostStore& store,
                                 const float* exp_avg, const float* exp_avg_sq);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_OPTIM_TIERED_ADAMW_H_
