// Device gradient accumulation (device_grad_accumulator.h).
#include "engine/step/device_grad_accumulator.h"

#include <cstdio>

#include "engine/model/layers.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {

void AccumulateInto(const BlockLayout& bl, const at::Tensor& dst,
                    const std::vector<at::Tensor>& grads, bool first) {
  // The host's adds: fp32 values of each contribution, in micro-batch order.
  std::vector<at::Tensor> g = BindBlockParams(bl, dst);
  for (size_t i = 0; i < g.size(); ++i) {
    if (first) {
      g[i].copy_(grads[i]);
    } else {
      g[i].add_(grads[i].to(at::kFloat));
    }
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
