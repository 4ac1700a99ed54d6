// Device weight slots (weight_slots.h).
#include "engine/step/weight_slots.h"

#include <algorithm>

#include "absl/base/internal/raw_logging.h"

namespace megatrain::engine {

WeightSlots::WeightSlots(StepEnv* env, int num_slots, int64_t max_numel,
                         int64_t cast_chunk_elements, std::unique_ptr<HostCastStager> host_cast)
    : env_(env), host_cast_(std::move(host_cast)) {
  const auto options = at::TensorOptions().dtype(env->compute_dtype).device(env->runtime->device());
  if (cast_chunk_elements > 0) {
    cast_staging_ =
        at::empty({CastStagingNumel(max_numel, cast_chunk_elements)}, options.dtype(at::kFloat));
    device_bytes_ += static_cast<int64_t>(cast_staging_.nbytes());
  }
  const int64_t slot_numel = ShardedSlotNumel(max_numel, env->weight_sharding.world);
  for (int k = 0; k < num_slots; ++k) {
    slots_.push_back(at::empty({slot_numel}, options));
    device_bytes_ += static_cast<int64_t>(slots_.back().nbytes());
    weights_ready_.push_back(env->runtime->CreateEvent());
    slot_free_.push_back(env->runtime->CreateEvent());
  }
}

void WeightSlots::BeginPass(const std::vector<int64_t>& blocks, bool sharded) {
  sharded_ = sharded && env_->weight_sharding.world > 1;
  uses_ = AssignWeightSlots(blocks, static_cast<int>(slots_.size()));
  next_load_ = 0;
  released_.assign(uses_.size(), false);
  if (host_cast_ != nullptr) {  // Note [Host cast]: the loads, in the order IssueLoads issues them
    std::vector<HostCastStager::Range> ranges;
    for (const WeightSlotUse& use : uses_) {
      if (!use.load) continue;
      const auto [begin, end] = LoadRange(use.block);
      ranges.push_back({use.block, begin, end});
    }
    host_cast_->BeginPass(std::move(ranges));
  }
}

std::pair<int64_t, int64_t> WeightSlots::LoadRange(int64_t block) const {
  const int64_t numel = env_->store->block_numel(block);
  if (!sharded_) return {0, numel};
  // Note [Sharded weight streaming]: this rank's shard.
  const StepEnv::WeightSharding& sharding = env_->weight_sharding;
  const int64_t shard = (numel + sharding.world - 1) / sharding.world;
  const int64_t begin = std::min(numel, sharding.rank * shard);
  return {begin, std::min(numel, begin + shard)};
}

void WeightSlots::IssueLoads() {
  DeviceRuntime* runtime = env_->runtime;
  while (next_load_ < static_cast<int>(uses_.size())) {
    const WeightSlotUse& use = uses_[next_load_];
    if (use.load) {
      if (use.prev_user >= 0 && !released_[use.prev_user]) return;
      if (use.prev_user >= 0) runtime->Wait(StreamKind::kH2D, *slot_free_[use.slot]);
      env_->WaitWeights(use.block);
      const int token = env_->timer.Begin(StreamKind::kH2D);
      const int64_t bytes = Load(use.block, slots_[use.slot]);
      env_->timer.End(StreamKind::kH2D, token);
      runtime->Record(StreamKind::kH2D, *weights_ready_[use.slot]);
      env_->h2d_bytes += bytes;
      env_->h2d_weight_bytes += bytes;
    }
    ++next_load_;
  }
}

int64_t WeightSlots::Load(int64_t block, const at::Tensor& slot) {
  const auto [begin, end] = LoadRange(block);
  const int64_t bytes = CopyRange(block, slot, begin, end);
  if (!sharded_) return bytes;
  // Note [Sharded weight streaming]: this rank's shard, then the gather.
  const StepEnv::WeightSharding& sharding = env_->weight_sharding;
  const int64_t shard = (env_->store->block_numel(block) + sharding.world - 1) / sharding.world;
  auto scope = env_->runtime->Use(StreamKind::kH2D);
  sharding.all_gather(block, slot.data_ptr(), shard, static_cast<int>(slot.element_size()));
  return bytes;
}

int64_t WeightSlots::CopyRange(int64_t block, const at::Tensor& slot, int64_t begin, int64_t end) {
  DeviceRuntime* runtime = env_->runtime;
  if (begin >= end) return 0;
  if (host_cast_ != nullptr) {  // Note [Host cast]: bf16 chunks cast by the host
    return host_cast_->CopyRange(block, begin, end,
                                 static_cast<char*>(slot.data_ptr()) + begin * 2);
  }
  if (!cast_staging_.defined()) {
    const int64_t element_bytes =
        env_->store->streaming_bytes(block) / env_->store->block_numel(block);
    const auto* source = static_cast<const char*>(env_->store->streaming_data(block));
    runtime->CopyHostToDevice(static_cast<char*>(slot.data_ptr()) + begin * element_bytes,
                              source + begin * element_bytes,
                              static_cast<size_t>((end - begin) * element_bytes));
    return (end - begin) * element_bytes;
  }
  // Note [Weight streaming]: fp32 chunks through the staging buffer, each
  // cast on kH2D after its copy and before the next chunk's copy.
  ABSL_RAW_CHECK(!env_->store->options().streaming_bf16, "weight slots: cast without fp32 master");
  auto scope = runtime->Use(StreamKind::kH2D);
  const float* master = env_->store->master(block);
  const int64_t chunk = cast_staging_.numel();
  for (int64_t first = begin; first < end; first += chunk) {
    const int64_t count = std::min(chunk, end - first);
    runtime->CopyHostToDevice(cast_staging_.data_ptr(), master + first,
                              static_cast<size_t>(count) * 4);
    slot.narrow(0, first, count).copy_(cast_staging_.narrow(0, 0, count));
  }
  return (end - begin) * 4;
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
