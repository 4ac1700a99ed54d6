// AdamW with the moments on the NVMe tier (tiered_adamw.h).
#include "engine/optim/tiered_adamw.h"

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// CpuAdamW::Step on one chunk of `block`'s moments, `begin` elements into
// the block; params, gradients and the bf16 copy from the store.
absl::Status StepChunk(const CpuAdamW& adamw, const HostStore& store, int64_t block, int64_t begin,
                       int64_t count, float* exp_avg, float* exp_avg_sq, int64_t step, double lr,
                       float grad_scale) {
  AdamWBuffers buffers;
  buffers.params = store.master(block) + begin;
  buffers.grads = store.grad(block) + begin;
  buffers.exp_avg = exp_avg;
  buffers.exp_avg_sq = exp_avg_sq;
  bf16_bits* bf16 = store.streaming_bf16(block);
  buffers.bf16_params = bf16 != nullptr ? bf16 + begin : nullptr;
  buffers.num_elements = count;
  return adamw.Step(buffers, step, lr, grad_scale);
}

absl::Status CheckSize(const HostStore& store, const NvmeMomentFiles& moments) {
  if (moments.numel() != store.arena_numel()) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe tier: moment files hold ", moments.numel(),
                                                   " elements, the store ", store.arena_numel()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TieredAdamWStep(const CpuAdamW& adamw, const HostStore& store,
                             NvmeMomentFiles& moments, const std::vector<int64_t>& blocks,
                             int64_t step, double lr, float grad_scale) {
  MEGATRAIN_RETURN_IF_ERROR(CheckSize(store, moments));
  std::vector<MomentRange> ranges;
  ranges.reserve(blocks.size());
  for (const int64_t block : blocks) {
    ranges.push_back({store.block_offset(block), store.block_numel(block)});
  }
  // Chunks come in the order of `ranges`: the chunk's block is the first
  // range from the current one on that holds its offset.
  size_t block_idx = 0;
  return moments.ForEachChunk(
      ranges, [&](const MomentRange& chunk, float* exp_avg, float* exp_avg_sq) {
        while (block_idx < ranges.size() &&
               (chunk.offset < ranges[block_idx].offset ||
                chunk.offset >= ranges[block_idx].offset + ranges[block_idx].count)) {
          ++block_idx;
        }
        if (block_idx == ranges.size()) {
          return absl::InternalError(absl::StrCat("NVMe tier: chunk at ", chunk.offset,
                                                  " outside the blocks of the pass"));
        }
        const int64_t block = blocks[block_idx];
        return StepChunk(adamw, store, block, chunk.offset - store.block_offset(block), chunk.count,
                         exp_avg, exp_avg_sq, step, lr, grad_scale);
      });
}

absl::Status TieredAdamWSliceStep(const CpuAdamW& adamw, const HostStore& store,
                                  NvmeMomentFiles& moments, const NvmeShardLayout& layout,
                                  int64_t block, int64_t begin, int64_t count, int64_t step,
                                  double lr, float grad_scale) {
  if (moments.numel() != layout.numel) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe tier: moment files hold ", moments.numel(),
                                                   " elements, the layout ", layout.numel));
  }
  const size_t b = static_cast<size_t>(block);
  if (block < 0 || block >= store.num_blocks() || b >= layout.begin.size() || count < 0 ||
      begin < layout.begin[b] || (begin - layout.begin[b]) % 1024 != 0 ||
      begin + count > layout.end[b]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVMe tier: slice [", begin, ", +", count, ") of block ", block,
        " is not 1024-aligned inside rank ", layout.rank, " of ", layout.world, "'s shard"));
  }
  // Element `begin` of the block lies `file_begin` elements into the files.
  const int64_t file_begin = layout.file_offset[b] + (begin - layout.begin[b]);
  return moments.ForEachChunk(
      {{file_begin, count}}, [&](const MomentRange& chunk, float* exp_avg, float* exp_avg_sq) {
        return StepChunk(adamw, store, block, begin + (chunk.offset - file_begin), chunk.count,
                         exp_avg, exp_avg_sq, step, lr, grad_scale);
      });
}

absl::Status CopyMomentsToHost(const NvmeMomentTier& tier, const HostStore& store, float* exp_avg,
                               float* exp_avg_sq) {
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    const int64_t offset = store.block_offset(block);
    for (const NvmeBlockPiece& p : tier.Pieces(block)) {
      const int64_t at = offset + p.begin;
      MEGATRAIN_RETURN_IF_ERROR(
          p.files->Read(MomentKind::kExpAvg, p.file_offset, p.count, exp_avg + at));
      MEGATRAIN_RETURN_IF_ERROR(
          p.files->Read(MomentKind::kExpAvgSq, p.file_offset, p.count, exp_avg_sq + at));
    }
  }
  return absl::OkStatus();
}

absl::Status CopyMomentsFromHost(const NvmeMomentTier& tier, const HostStore& store,
                                 const float* exp_avg, const float* exp_avg_sq) {
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    const int64_t offset = store.block_offset(block);
    for (const NvmeBlockPiece& p : tier.Pieces(block)) {
      const int64_t at = offset + p.begin;
      MEGATRAIN_RETURN_IF_ERROR(
          p.files->Write(MomentKind::kExpAvg, p.file_offset, p.count, exp_avg + at));
      MEGATRAIN_RETURN_IF_ERROR(
          p.files->Write(MomentKind::kExpAvgSq, p.file_offset, p.count, exp_avg_sq + at));
    }
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
