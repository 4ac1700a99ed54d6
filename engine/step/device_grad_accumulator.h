// Device gradient accumulation (Note [Device gradient accumulation] in
// executor.h): an fp32 gradient buffer per streamed dense block, summing a
// step's micro-batches on the device before the block lands once.
//
// Ownership: owns the buffers (allocated at the first pass with more than
// one micro-batch, kept for the executor's life); uses the StepEnv.
// Thread-safety: the enqueuing thread only. Streams: kCompute.
#ifndef MEGATRAIN_ENGINE_STEP_DEVICE_GRAD_ACCUMULATOR_H_
#define MEGATRAIN_ENGINE_STEP_DEVICE_GRAD_ACCUMULATOR_H_

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

// Adds one micro-batch's gradient `grads` (one tensor per parameter of
// `bl`, any float dtype; extra trailing tensors ignored) into `dst`
// ([numel] fp32, device): a copy for the block's `first` contribution of
// the pass, else fp32 adds, so that contributions summed in micro-batch
// order are bit for bit the host's sum. Enqueued on the current stream.
void AccumulateInto(const BlockLayout& bl, const at::Tensor& dst,
                    const std::vector<at::Tensor>& grads, bool first);

class DeviceGradAccumulator {
 public:
  // `enabled`: ExecutorOptions::device_grad_accumulation; the blocks are
  // the layout's streamed dense blocks past `resident_layers`.
  DeviceGradAccumulator(StepEnv* env, bool enabled, int64_t resident_layers)
      : env_(env), enabled_(enabled), resident_layers_(resident_layers) {}

  // Whether a pass of `micro_batches` sums on the device, allocating the
  // buffers the first time (zeroed, so that alignment gaps stay zero). On
  // device out of memory, turns itself off for good and says so once on
  // stderr; other LibTorch exceptions propagate.
  bool Prepare(size_t micro_batches);

  // [numel] fp32 buffer of streamed dense `block` (after Prepare is true).
  const at::Tensor& buffer(int64_t block) const { return buffers_[block]; }

  // Bytes allocated so far (0 before the first pass that used it).
  int64_t device_bytes() const { return device_bytes_; }

 private:
  StepEnv* env_;
  bool enabled_;
  int64_t resident_layers_;
  std::vector<at::Tensor> buffers_;  // per block; undefined for the others
  int64_t device_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_DEVICE_GRAD_ACCUMULATOR_H_
