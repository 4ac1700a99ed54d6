// Device weight slots (weight_slots.h).
#include "engine/step/weight_slots.h"

#include "absl/base/internal/raw_logging.h"

namespace megatrain::engine {

WeightSlots::WeightSlots(StepEnv* env, int num_slots, int64_t max_numel) : env_(env) {
  const auto options = at::TensorOptions().dtype(env->compute_dtype).device(env->runtime->device());
  for (int k = 0; k < num_slots; ++k) {
    slots_.push_back(at::empty({max_numel}, options));
    device_bytes_ += static_cast<int64_t>(slots_.back().nbytes());
    weights_ready_.push_back(env->runtime->CreateEvent());
    slot_free_.push_back(env->runtime->CreateEvent());
  }
}

void WeightSlots::BeginPass(const std::vector<int64_t>& blocks) {
  uses_ = AssignWeightSlots(blocks, static_cast<int>(slots_.size()));
  next_load_ = 0;
  released_.assign(uses_.size(), false);
}

void WeightSlots::IssueLoads() {
  DeviceRuntime* runtime = env_->runtime;
  while (next_load_ < static_cast<int>(uses_.size())) {
    const WeightSlotUse& use = uses_[next_load_];
    if (use.load) {
      if (use.prev_user >= 0 && !released_[use.prev_user]) return;
      if (use.prev_user >= 0) runtime->Wait(StreamKind::kH2D, *slot_free_[use.slot]);
      env_->WaitWeights(use.block);
      const int64_t bytes = env_->store->streaming_bytes(use.block);
      const int token = env_->timer.Begin(StreamKind::kH2D);
      runtime->CopyHostToDevice(slots_[use.slot].data_ptr(), env_->store->streaming_data(use.block),
                                static_cast<size_t>(bytes));
      env_->timer.End(StreamKind::kH2D, token);
      runtime->Record(StreamKind::kH2D, *weights_ready_[use.slot]);
      env_->h2d_bytes += bytes;
    }
    ++next_load_;
  }
}

at::Tensor WeightSlots::Acquire(int use) {
  IssueLoads();
  ABSL_RAW_CHECK(next_load_ > use, "executor: a load was not issued before its use");
  const WeightSlotUse& u = uses_[use];
  // A block still in its slot was made ready by an earlier wait on this stream.
  if (u.load) env_->runtime->Wait(StreamKind::kCompute, *weights_ready_[u.slot]);
  return slots_[u.slot].narrow(0, 0, env_->layout.blocks[u.block].numel);
}

void WeightSlots::Release(int use) {
  env_->runtime->Record(StreamKind::kCompute, *slot_free_[uses_[use].slot]);
  released_[use] = true;
  IssueLoads();
}

}  // namespace megatrain::engine
