// Device weight slots: K compute-dtype buffers that streamed blocks are
// loaded into, in the order of a plan's weight uses (Note [Streaming
// pipeline] in executor.h).
//
//   kH2D:     load(use i+K-1) into slot (i+K-1)%K ... waits slot_free
//   kCompute: wait weights_ready(i) -> layer math -> record slot_free(i)
//
// A load is issued as soon as the previous user of its slot is released,
// so up to K-1 loads run ahead of the compute stream; a block still in a
// slot is not loaded again (AssignWeightSlots).
//
// Ownership: owns the slots and their events; uses the StepEnv of its
// executor (timer, h2d_bytes, weight gate). Thread-safety: the enqueuing
// thread only. Streams: loads on kH2D, waits and releases on kCompute.
#ifndef MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_
#define MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/step/step_env.h"
#include "engine/step/step_plan.h"

namespace megatrain::engine {

class WeightSlots {
 public:
  // Allocates `num_slots` device buffers of `max_numel` elements of the
  // compute dtype. Throws LibTorch's exceptions (the executor maps them).
  WeightSlots(StepEnv* env, int num_slots, int64_t max_numel);

  // Starts a pass whose uses are `blocks` (StepPlan::weight_uses).
  void BeginPass(const std::vector<int64_t>& blocks);

  // Issues the loads up to `use` and makes kCompute wait for it; returns
  // the block's weights, [numel] compute dtype, device.
  at::Tensor Acquire(int use);

  // `use`'s work is enqueued on kCompute: its slot may be reloaded after
  // it; issues the loads that waited for it.
  void Release(int use);

  // Bytes of the slots' device buffers.
  int64_t device_bytes() const { return device_bytes_; }

 private:
  // Issues, in use order, every load whose slot's previous user is released.
  void IssueLoads();

  StepEnv* env_;
  std::vector<at::Tensor> slots_;                            // [max numel] compute dtype
  std::vector<std::unique_ptr<DeviceEvent>> weights_ready_;  // per slot, on kH2D
  std::vector<std::unique_ptr<DeviceEvent>> slot_free_;      // per slot, on kCompute
  std::vector<WeightSlotUse> uses_;
  int next_load_ = 0;  // next use whose load is not issued yet
  std::vector<bool> released_;
  int64_t device_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_
