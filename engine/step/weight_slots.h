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
// Note [Weight streaming]
// Under bf16 compute a slot is loaded from one of three host sources
// (memory.weight_stream, HostStore's streaming_bf16 option):
//   bf16: the store's bf16 copy (2 bytes/param of host memory, rewritten by
//         the CPU AdamW), copied straight into the slot;
//   fp32: the fp32 master itself, copied in chunks of at most
//         kCastChunkElements into a device fp32 staging buffer and cast
//         into the slot on kH2D (no host copy; twice the H2D bytes);
//   host_cast: the fp32 master cast to bf16 by CPU threads into a pinned
//         ring just ahead of its copy (no host copy, the bf16 H2D bytes;
//         Note [Host cast] in host_cast.h).
// They give the same bits (host_cast rounds with FloatToBf16 too): the host copy is FloatToBf16
// (round to nearest, ties to even; bf16.h) and LibTorch's fp32 -> bf16 cast rounds to nearest even
// too (c10::BFloat16's round_to_nearest_even on the CPU, cvt.rn.bf16.f32 on CUDA). They differ only
// in the payload of a NaN, which a master weight never holds (Note [Non-finite steps] in
// trainer.h). tests/engine/step/memory_modes_test.cc checks both.
// The copy and the cast of a chunk run in order on kH2D, so one staging
// buffer serves every slot without an event.
//
// Note [Sharded weight streaming]
// With data parallelism over W ranks of one host (StepEnv::weight_sharding,
// world W > 1), a training pass loads every streamed block once in total
// across the ranks rather than once per rank: rank r copies only its
// shard, elements [r*S, min((r+1)*S, numel)) with S = ceil(numel / W)
// (c10d's layout, as Note [Shard layout] in store/shard_layout.h), from
// host memory into the same range of its slot (bf16 copy, or the fp32
// master cast chunk by chunk), and the ranks then all-gather the W shards
// into every rank's slot over the devices' links (NCCL over NVLink), on
// kH2D, so that weights_ready covers both. Host memory and each PCIe
// link then carry 1/W of the weight bytes; the peer links carry the rest.
// Slots hold W*S elements (at most W-1 of padding, never read). The
// gathers are collectives: every rank issues them in the same order,
// which the plan fixes (loads are issued in use order, each once its
// slot's previous user is released, at the same program points on every
// rank). Evaluation and logits passes run on one rank and load whole
// blocks. The bits equal a whole-block load (a gather is a copy).
//
// Ownership: owns the slots and their events; uses the StepEnv of its
// executor (timer, h2d_bytes, weight gate). Thread-safety: the enqueuing
// thread only. Streams: loads on kH2D, waits and releases on kCompute.
#ifndef MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_
#define MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/step/host_cast.h"
#include "engine/step/step_env.h"
#include "engine/step/step_plan.h"

namespace megatrain::engine {

// Elements per chunk of the fp32 -> bf16 cast on the device: 16 Mi (a 64
// MiB fp32 staging buffer). Bounds the staging's device memory whatever
// the model (llama-8b's untied head is 525 M parameters); the chunk's
// cast (~0.05 ms on an H100) is small beside its copy (~1.3 ms at 50 GB/s).
inline constexpr int64_t kCastChunkElements = int64_t{1} << 24;

// Elements of the fp32 staging buffer for slots of `max_numel` cast in
// chunks of `chunk_elements`.
inline int64_t CastStagingNumel(int64_t max_numel, int64_t chunk_elements = kCastChunkElements) {
  return max_numel < chunk_elements ? max_numel : chunk_elements;
}

// Elements of a slot that holds blocks of up to `max_numel` elements
// gathered from `world` shards (Note [Sharded weight streaming]): world *
// ceil(max_numel / world).
inline int64_t ShardedSlotNumel(int64_t max_numel, int world) {
  return world <= 1 ? max_numel : (max_numel + world - 1) / world * world;
}

class WeightSlots {
 public:
  // Allocates `num_slots` device buffers of `max_numel` elements of the
  // compute dtype, and with `cast_chunk_elements` > 0 (bf16 compute
  // streaming the fp32 master, Note [Weight streaming]) the fp32 staging
  // buffer of CastStagingNumel(max_numel, cast_chunk_elements) elements.
  // With `host_cast` (bf16 compute, weight_stream host_cast; then
  // cast_chunk_elements is 0) loads copy the stager's bf16 chunks instead
  // (Note [Host cast]). Throws LibTorch's exceptions (the executor maps them).
  WeightSlots(StepEnv* env, int num_slots, int64_t max_numel, int64_t cast_chunk_elements,
              std::unique_ptr<HostCastStager> host_cast = nullptr);

  // Starts a pass whose uses are `blocks` (StepPlan::weight_uses); with
  // `sharded` and a sharding world above 1, its loads are shards gathered
  // over the ranks (Note [Sharded weight streaming]).
  void BeginPass(const std::vector<int64_t>& blocks, bool sharded = false);

  // Issues the loads up to `use` and makes kCompute wait for it; returns
  // the block's weights, [numel] compute dtype, device.
  at::Tensor Acquire(int use);

  // `use`'s work is enqueued on kCompute: its slot may be reloaded after
  // it; issues the loads that waited for it.
  void Release(int use);

  // Bytes of the slots' device buffers (the cast staging included).
  int64_t device_bytes() const { return device_bytes_; }
  // Pinned host bytes of the host cast's ring (0 without it).
  int64_t pinned_bytes() const { return host_cast_ != nullptr ? host_cast_->pinned_bytes() : 0; }

 private:
  // Issues, in use order, every load whose slot's previous user is released.
  void IssueLoads();
  // Elements [begin, end) of `block` this executor loads from the host:
  // all of it, or its shard in a sharded pass.
  std::pair<int64_t, int64_t> LoadRange(int64_t block) const;
  // Enqueues on kH2D the load of `block` into `slot`: a copy, with
  // cast_staging_ copies and casts chunk by chunk, with host_cast_ copies of
  // the host's casts. Returns the H2D bytes.
  int64_t Load(int64_t block, const at::Tensor& slot);
  // Enqueues on kH2D the host-to-device copy of elements [begin, end) of
  // `block`'s streaming source into the same range of `slot`. Returns the
  // H2D bytes.
  int64_t CopyRange(int64_t block, const at::Tensor& slot, int64_t begin, int64_t end);

  StepEnv* env_;
  std::vector<at::Tensor> slots_;  // [max numel] compute dtype
  at::Tensor cast_staging_;        // [CastStagingNumel] fp32, device; undefined without the cast
  std::unique_ptr<HostCastStager> host_cast_;                // weight_stream host_cast only
  std::vector<std::unique_ptr<DeviceEvent>> weights_ready_;  // per slot, on kH2D
  std::vector<std::unique_ptr<DeviceEvent>> slot_free_;      // per slot, on kCompute
  std::vector<WeightSlotUse> uses_;
  int next_load_ = 0;  // next use whose load is not issued yet
  std::vector<bool> released_;
  bool sharded_ = false;  // this pass's loads are gathered shards
  int64_t device_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_WEIGHT_SLOTS_H_
