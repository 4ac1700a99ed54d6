// Device gradient accumulation (device_grad_accumulator.h).
#include "engine/step/device_grad_accumulator.h"

#include <cstdio>

#include "engine/model/fused_ops.h"
#include "engine/model/layers.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {

// Note [One-pass accumulation]
// A bf16 contribution added to the fp32 accumulator with ATen is a cast
// kernel (reads 2 bytes, writes 4) and an add (reads 8, writes 4): 18
// bytes per parameter, for every micro-batch after the first (at
// llama-1b, 1 x 2048 x accumulation 8, the casts and adds were about 63
// ms of a 447 ms step's kernel time; docs/performance.md).
// FusedAddBf16IntoFp32 does both in one kernel (10 bytes) with the same
// fp32 sums (the widening is exact, each element one fp32 add), so
// CUDA builds with the kernels use it whatever train.fused_kernels says,
// as the gradient norm does (Note [Gradient norm kernel]).
void AccumulateInto(const BlockLayout& bl, const at::Tensor& dst,
                    const std::vector<at::Tensor>& grads, bool first) {
  // The host's adds: fp32 values of each contribution, in micro-batch order.
  std::vector<at::Tensor> g = BindBlockParams(bl, dst);
  for (size_t i = 0; i < g.size(); ++i) {
    if (first) {
      g[i].copy_(grads[i]);
      continue;
    }
#ifdef MEGATRAIN_FUSED_KERNELS
    if (FusedAddIntoFp32Applies(g[i], grads[i])) {
      FusedAddBf16IntoFp32(g[i], grads[i]);
      continue;
    }
#endif
    g[i].add_(grads[i].to(at::kFloat));
  }
}

bool DeviceGradAccumulator::Prepare(size_t micro_batches) {
  if (!enabled_ || micro_batches < 2) return false;
  if (!buffers_.empty()) return true;
  const ModelLayout& layout = env_->layout;
  try {
    buffers_.resize(layout.blocks.size());
    const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(env_->runtime->device());
    for (const int64_t block : layout.StreamedDenseBlocks(resident_layers_)) {
      buffers_[block] = at::zeros({layout.blocks[block].numel}, fp32);
      device_bytes_ += static_cast<int64_t>(buffers_[block].nbytes());
    }
  } catch (const std::exception& e) {
    buffers_.clear();
    device_bytes_ = 0;
    enabled_ = false;
    if (!compat::IsOutOfMemory(e)) throw;
    std::fprintf(stderr,
                 "megatrain: device gradient accumulation off (no device memory for the "
                 "streamed blocks' fp32 gradients); summing micro-batches on the host\n");
    return false;
  }
  return true;
}

}  // namespace megatrain::engine
