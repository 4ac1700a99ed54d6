// The host cast of streamed weights (memory.weight_stream host_cast): CPU
// threads cast each streamed block's fp32 master into bf16 in a ring of
// pinned staging buffers just ahead of its H2D copy, so that the link
// carries 2 bytes per parameter without a bf16 copy kept in host memory.
//
// Note [Host cast]
// Under bf16 compute the slots of Note [Weight streaming] (weight_slots.h)
// can load a block from three sources: the bf16 copy (2 bytes/param of host
// memory, 2 of H2D), the fp32 master cast on the device (no copy, 4 of
// H2D), or, with host_cast, the fp32 master cast on the host (no copy, 2
// of H2D). For host_cast a worker thread of the stager walks the pass's
// loads in the order the slots issue them (the ranges BeginPass is given),
// chunk by chunk of at most chunk_numel elements:
//
//   worker:   gate(block) -> wait ring buffer n%R free -> CastToBf16 on the
//             pool into it -> mark chunk n ready
//   enqueuer: wait chunk n ready -> H2D copy of it into the slot (kH2D)
//             -> record copied(n%R) -> buffer given back to the worker,
//             which host-waits copied(n%R) before rewriting it
//
// Ordering. The cast reads the master, which the CPU AdamW of the previous
// step rewrites: the worker calls the executor's weight gate (the one the
// slots call before a load, Note [Optimizer overlap] in trainer.h) for a
// block before it casts any of its chunks, so a chunk holds the master
// after that block's update, as the bf16 copy would. A walk starts only at
// BeginPass, when every update of the previous step is queued (the trainer
// queues them before the next pass), and within a pass a block is loaded
// only before its gradient of the pass is final, so no update of the pass
// runs under a cast. A ring buffer is rewritten only after the copy that
// read it completed (its event), and the copy is enqueued only after the
// worker published the chunk (the stager's mutex orders both).
//
// Bits. CastToBf16 (optim/adamw.h) is FloatToBf16 on every element, the
// rounding of the bf16 copy (AdamWUpdate's bf16_out and
// HostStore::RefreshStreamingCopy): host_cast loads the same bits as
// weight_stream bf16 and fp32 (tests/engine/step/memory_modes_test.cc).
//
// Size. The ring holds one largest block plus one chunk (HostCastRingOf),
// so that while the device computes with one block the worker can cast the
// whole next one ahead of its copy: the cast is off the critical path as
// long as the host casts a block in the time the device spends on one.
//
// A pass that ends early (an error, an abandoned step) leaves chunks
// unconsumed: the next BeginPass starts a new walk, and the worker drops
// the old one at its next chunk (each chunk is tagged with its pass).
//
// Ownership: owns the pinned ring, its events and the worker thread
// (joined, and the ring's last copies waited for, by the destructor); uses
// the StepEnv of its executor (store, runtime, pool, weight gate).
// Thread-safety: BeginPass and CopyRange on the enqueuing thread only; the
// worker runs the gate and the pool's ParallelFor. Streams: copies on kH2D.
#ifndef MEGATRAIN_ENGINE_STEP_HOST_CAST_H_
#define MEGATRAIN_ENGINE_STEP_HOST_CAST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/host_buffer.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

// Elements per chunk of the host cast: 4 Mi (8 MiB of bf16, 0.16 ms of H2D
// at 50 GB/s, far above a copy's launch cost; small enough that the first
// copy of a block starts soon after its cast starts).
inline constexpr int64_t kHostCastChunkElements = int64_t{1} << 22;

// The pinned ring of the host cast for blocks of up to `max_numel`
// elements (Note [Host cast]).
struct HostCastRing {
  int64_t chunk_numel = 0;   // elements cast and copied at a time
  int64_t stride_numel = 0;  // chunk_numel rounded up to 64 (128-byte aligned buffers)
  int64_t num_buffers = 0;   // ceil(max_numel / chunk_numel) + 1; 0 for no block
  int64_t pinned_bytes() const { return num_buffers * stride_numel * 2; }
};
HostCastRing HostCastRingOf(int64_t max_numel, int64_t chunk_elements = kHostCastChunkElements);

class HostCastStager {
 public:
  // Elements [begin, end) of `block`'s master: one load of a pass.
  struct Range {
    int64_t block = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  // Allocates the ring for blocks of up to `max_numel` (> 0) elements in
  // chunks of `chunk_elements` (>= 1), pinned on a CUDA runtime, and starts
  // the worker. RESOURCE_EXHAUSTED when the ring cannot be allocated.
  static absl::StatusOr<std::unique_ptr<HostCastStager>> Create(StepEnv* env, int64_t max_numel,
                                                                int64_t chunk_elements);
  ~HostCastStager();
  HostCastStager(const HostCastStager&) = delete;
  HostCastStager& operator=(const HostCastStager&) = delete;

  // Starts the walk of a pass whose loads are `ranges`, in the order
  // CopyRange will ask for them; drops what is left of the previous walk.
  void BeginPass(std::vector<Range> ranges);

  // Enqueues on kH2D the copy of the bf16 cast of elements [begin, end) of
  // `block` (the next range of the walk) to `device_dst` ([end - begin]
  // bf16, device), waiting on this thread for each chunk's cast (timed as a
  // gate wait). Returns the H2D bytes. Throws std::runtime_error when the
  // worker failed (a CUDA error), with its message.
  int64_t CopyRange(int64_t block, int64_t begin, int64_t end, void* device_dst);

  // Bytes of the pinned ring.
  int64_t pinned_bytes() const { return static_cast<int64_t>(ring_.bytes()); }

 private:
  enum class BufferState { kFree, kCasting, kReady, kCopying };
  struct Buffer {
    BufferState state = BufferState::kFree;
    int64_t pass = -1;  // kReady: the walk it belongs to
    int64_t seq = -1;   // kReady: its chunk number in that walk
    int64_t block = -1, first = 0;
  };

  HostCastStager(StepEnv* env, HostCastRing geometry, HostBuffer ring);
  void WorkerLoop();
  // Casts the chunks of one walk; returns early when a newer walk starts
  // or the stager stops.
  void CastWalk(int64_t pass, const std::vector<Range>& ranges,
                const std::function<void(int64_t)>& gate);
  // Waits until buffer `b` is not a ready chunk of walk `pass`, then until
  // its last copy completed, and claims it. False when the walk is over.
  bool ClaimBuffer(int64_t b, int64_t pass);
  bf16_bits* buffer_data(int64_t b) const {
    return static_cast<bf16_bits*>(ring_.data()) + b * geometry_.stride_numel;
  }

  StepEnv* const env_;
  const HostCastRing geometry_;
  HostBuffer ring_;                                   // num_buffers x stride_numel bf16
  std::vector<std::unique_ptr<DeviceEvent>> copied_;  // per buffer, on kH2D
  int64_t consumer_seq_ = 0;                          // enqueuing thread: next chunk to copy

  absl::Mutex mu_;
  std::vector<Buffer> buffers_ ABSL_GUARDED_BY(mu_);
  int64_t pass_ ABSL_GUARDED_BY(mu_) = 0;  // the current walk; 0: none yet
  std::vector<Range> ranges_ ABSL_GUARDED_BY(mu_);
  std::function<void(int64_t)> gate_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);  // the worker's failure; sticky
  std::thread worker_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_HOST_CAST_H_
