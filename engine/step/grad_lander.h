// Gradient landing: block gradients from the device into the host store,
// with the accumulator thread that finishes them on the host.
//
// Note [Gradient landing]
// A dense block's first contribution of a pass is copied (fp32) straight
// into the store's gradient, so with one micro-batch per step the host
// does no gradient work at all; its squared norm is computed on the device
// and copied beside it. Later contributions land in pinned staging and are
// added on the host, in micro-batch order. The embedding's contribution
// (d hidden_0, [B*T, C] fp32) lands in staging and is scatter-added by
// token. A resident block's final gradient stays on the device: only its
// squared norm crosses. When a block's last contribution has landed, the
// accumulator thread calls the pass's BlockFinalCallback with its squared
// norm, fp32 values summed in fp64 (known without a pass over the block
// where the device computed it or the scatter tracked it).
//
//   kCompute: gradient into slot r -> record grad_ready(r)
//   kD2H:     wait grad_ready(r) -> copy to the store or staging r
//                                -> record staged(r)
//   host:     accumulator thread waits staged(r) -> grad += staging (fp32)
//             -> slot r free again
//
// Note [Bounded gradient staging]
// Pinned gradient staging does not grow with the model. Each gradient slot
// has staging for the embedding's contribution only (d hidden_0, B*T*C
// fp32: the step's shape, not the model's); a dense block's later
// contribution (host accumulation) lands through a ring of
// kGradChunkBuffers chunks of at most kGradChunkElements fp32 (256 MiB
// pinned in all): the enqueuing thread copies chunk after chunk as the
// accumulator thread frees them, each chunk added to the store's gradient
// when its copy is done. Every element still receives the same fp32 adds
// in micro-batch order, so the sums are bit for bit those of staging the
// whole block; the slot is free again after its last chunk was added.
// The first contribution of a block (or its whole sum) goes straight into
// the store and needs no staging.
//
// Note [Gradient ring]
// Without clipping (max_grad_norm 0) a block's update is queued as soon as
// its gradient is final (Note [Optimizer overlap] in trainer.h), so no
// gradient needs to outlive its update. With memory.gradient_landing ring
// the store keeps no gradient arena but the embedding's (HostStore's
// gradient_ring; the table's gradient is a scatter-add over a step's
// tokens; none when the embedding is resident, HostStoreOptions::
// embedding_grad_in_host); every other host block's gradient lands in
// kGradRingBuffers pinned buffers of one size, GradRingNumels: the largest
// streamed decoder layer (when every layer is resident: the model's
// largest decoder layer, or the head if smaller; an untied head V x C,
// often the largest block, sizes nothing). A block that fits
// a buffer lands whole in the next buffer in turn; a larger one (the
// head) lands in pieces of a buffer's size, [0, n), [n, 2n), ..., each in
// the next buffer in turn, each handed on by its own call of the
// BlockFinalCallback (FinalGradient: the piece's elements, its buffer,
// and the whole block's squared norm, computed on the device before the
// first piece lands, so that the non-finite check of Note [Non-finite
// steps] is decided for the whole block before any piece is updated).
// The consumer (the trainer's AdamW of those elements) calls the piece's
// release when it has read the buffer; before a buffer takes the next
// piece, the enqueuing thread waits for that release: the ring bounds how
// far the GPU's backward runs ahead of the CPU AdamW. Each landing must be
// the block's whole gradient of the step: one micro-batch per pass, or
// several summed on the device (Note [Device gradient accumulation] in
// executor.h, or a one-wave layer-major pass, Note [Layer-major schedule]
// in step_plan.h); the executor refuses any other pass with
// FAILED_PRECONDITION, and the trainer chooses the ring only where that
// holds (memory.gradient_landing auto) or refuses the option (ring).
// AdamW is elementwise, so the update of a block in pieces reads the same
// fp32 values and computes the same bits as from the arena.
//
// With data parallelism (Note [Ring shards] in gradient_reducer.h) each
// rank's ring lands only the rank's reduce-scattered shard of a block,
// [begin, end) = ShardOf(numel, rank, L), so its buffers are sized by
// the shard: GradRingNumels of ceil(numel / L) (ExecutorOptions::
// grad_shard_world = L). The pieces are [begin, begin + n), ..., the
// FinalGradient's begin counted in the whole block, and the norm that
// travels with them is the shard's; the trainer replaces it by the
// block's (every rank's shard norm, ReduceRingShard) before deciding on
// the block. A rank that owns no element of a block still lands one
// empty piece, so that it takes part in the block's ReduceRingShard.
// Ownership of a ring buffer: the enqueuing thread from AcquireRing to
// the queued piece; the accumulator thread until the callback took it;
// then the trainer's AdamW slices of that piece (this rank's optimizer
// queue only), the last of which releases it. No other rank ever reads
// it: each rank updates exactly its own shard (Note [Sharded optimizer]).
//
// Host bytes (issue 19): kGradRingBuffers x 4 x the largest ring block
// but one, whatever the vocabulary: llama-3b 3 x 0.40 GB (0.33 B/param;
// one buffer of its head and one of a layer took 0.55), llama-8b 3 x 0.87
// GB (0.33; 0.37). Three buffers, not two: the head's pieces land while
// the AdamW of the first ones runs, so that the GPU waits for the head's
// update only until the first piece is updated, about a quarter of the
// head's AdamW (llama-3b: ~17 of ~68 ms), where one head-sized buffer
// made the third layer after the head wait for all of it (after its
// whole D2H); with two buffers the last piece would wait for the second
// to last.
//
// Ownership: owns the device gradient slots, the pinned staging and norm
// buffers, their events and the accumulator thread (joined by the
// destructor, which the executor calls after the streams drained). Uses
// the StepEnv (store, runtime, pool, timer, d2h_bytes, weight gate).
// Thread-safety: every method on the enqueuing thread; the accumulator
// thread runs the landings and the callback. Streams: kCompute (slot
// fills, norms), kD2H (copies).
#ifndef MEGATRAIN_ENGINE_STEP_GRAD_LANDER_H_
#define MEGATRAIN_ENGINE_STEP_GRAD_LANDER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/runtime/host_buffer.h"
#include "engine/model/param_layout.h"
#include "engine/step/final_gradient.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

// Per pass and block: how many gradient contributions are still to come,
// and whether the first has been seen (the first overwrites, later ones
// add). Enqueuing thread only.
class GradContributions {
 public:
  void Begin(const std::vector<int64_t>& per_block) {
    remaining_ = per_block;
    seen_.assign(per_block.size(), false);
  }
  bool seen(int64_t block) const { return seen_[block]; }
  struct Mark {
    bool first = false;  // the block's first contribution of the pass
    bool final = false;  // its last
  };
  // Counts one contribution of `block`.
  Mark Count(int64_t block) {
    Mark mark;
    mark.first = !seen_[block];
    seen_[block] = true;
    mark.final = --remaining_[block] == 0;
    return mark;
  }

 private:
  std::vector<int64_t> remaining_;
  std::vector<bool> seen_;
};

// Note [Bounded gradient staging]: fp32 elements per chunk of a dense
// block's later contribution (8 Mi: 32 MiB), and the chunks in the ring.
inline constexpr int64_t kGradChunkElements = int64_t{1} << 23;
inline constexpr int kGradChunkBuffers = 8;

// Note [Resident norm ring]
// A resident block's landing carries only its squared norm (8 bytes) to
// the host. It takes a word of its own ring, not a gradient slot, so that
// the enqueuing thread never waits for it: with data parallelism its norm
// follows an all-reduce over the ranks (Note [Resident blocks on every
// rank] in gradient_reducer.h), and holding one of the two gradient slots
// until then let the compute stream run at most two layers ahead of the
// all-reduces. Slots of the ring are reused in order; a pass with more
// resident blocks than this waits for the oldest.
inline constexpr int kResidentNormSlots = 64;

// Elements of one chunk buffer for gradient slots of `max_numel` in chunks
// of `chunk_elements`.
inline int64_t GradChunkNumel(int64_t max_numel, int64_t chunk_elements = kGradChunkElements) {
  return max_numel < chunk_elements ? max_numel : chunk_elements;
}

// Note [Gradient ring]: buffers in the ring, all of GradRingNumels.
inline constexpr int kGradRingBuffers = 3;

// Elements of each ring buffer (Note [Gradient ring]), for landings of
// whole blocks (`shard_world` 1) or of shards of ceil(numel /
// shard_world) elements (Note [Ring shards] in gradient_reducer.h):
// kGradRingBuffers times the largest of `layer_numels` (the streamed decoder layers'
// blocks); when no layer streams (every one resident), the smaller of
// `head_numel` (the head block) and `largest_layer_numel` (the model's
// largest decoder layer, resident or not; 0: none), so that the ring's
// bytes do not grow when auto keeps every layer on the device. A block
// larger than a buffer (an untied head) lands in pieces of that size.
// Empty when the chosen size is 0.
std::vector<int64_t> GradRingNumels(const std::vector<int64_t>& layer_numels, int64_t head_numel,
                                    int64_t largest_layer_numel, int shard_world = 1);

// Pinned bytes of a GradLander: `num_slots` staging buffers of
// `slot_staging_bytes` (the embedding's contribution; 0 when it is
// resident) and an fp64 norm each, the gradient ring of `ring_numels`
// (Note [Gradient ring]; empty without it) or else the chunk ring for
// slots of `max_numel` in chunks of `chunk_elements` (the ring's landings
// are whole: no later contribution is added on the host).
inline int64_t GradLanderPinnedBytes(int num_slots, int64_t max_numel, int64_t slot_staging_bytes,
                                     int64_t chunk_elements,
                                     const std::vector<int64_t>& ring_numels) {
  int64_t ring_bytes = 0;
  for (const int64_t numel : ring_numels) ring_bytes += 4 * numel;
  const int64_t chunk_ring =
      ring_numels.empty() ? kGradChunkBuffers * 4 * GradChunkNumel(max_numel, chunk_elements) : 0;
  return num_slots * (slot_staging_bytes + static_cast<int64_t>(sizeof(double))) + chunk_ring +
         ring_bytes + kResidentNormSlots * static_cast<int64_t>(sizeof(double));
}

class GradLander {
 public:
  // Called once per block (per piece with the ring) per pass on the
  // accumulator thread when the block's gradient is final
  // (StreamingExecutor's BlockFinalCallback).
  using FinalCallback = BlockFinalCallback;

  // Allocates `num_slots` device gradient buffers of `max_numel` fp32, as
  // many pinned staging buffers of `staging_bytes` (the embedding's
  // contribution, Note [Bounded gradient staging]; 0 for a resident
  // embedding), with `ring_numels` (GradRingNumels; empty: no ring) the
  // gradient ring (Note [Gradient ring]; the store must have
  // HostStoreOptions::gradient_ring), else the chunk ring of
  // GradChunkNumel(max_numel, chunk_elements) elements per chunk, and
  // starts the accumulator thread. RESOURCE_EXHAUSTED for pinned memory;
  // LibTorch exceptions for device memory.
  static absl::StatusOr<std::unique_ptr<GradLander>> Create(
      StepEnv* env, int num_slots, int64_t max_numel, size_t staging_bytes, int64_t chunk_elements,
      const std::vector<int64_t>& ring_numels);
  // Stops and joins the accumulator thread after it ran every queued
  // landing. The caller has drained the streams.
  ~GradLander();

  // Starts a pass: `contributions` per block (StepPlan), the callback, and
  // whether the store's embedding gradient is already zero for its first
  // scatter (StreamingExecutor::AssumeEmbeddingGradZero).
  void BeginPass(const std::vector<int64_t>& contributions, FinalCallback on_block_final,
                 bool embedding_grad_zero);
  GradContributions& contributions() { return contributions_; }

  // The bind-zero-copy sequence: waits for a free gradient slot, zeroes it
  // when it last held another kind of block (alignment gaps stay zero),
  // copies `grads` (one per parameter of `bl`; undefined ones skipped)
  // into it. Enqueued on kCompute. Returns the slot for LandSlot.
  int AcquireSlot();
  // A word of the resident norm ring (Note [Resident norm ring]), waiting
  // while its previous landing is still queued.
  int AcquireResidentNormSlot();
  void FillSlot(int slot, const BlockLayout& bl, BlockKind kind,
                absl::Span<const at::Tensor> grads);
  // Lands `block`'s gradient contribution held in `slot`.
  void LandSlot(int slot, int64_t block);
  // Adds a later contribution `grads` of `bl` to what FillSlot put in
  // `slot` (AccumulateInto's fp32 adds; GradTo::kSlotSum, Note
  // [Layer-major schedule] in step_plan.h). Enqueued on kCompute.
  void AddToSlot(int slot, const BlockLayout& bl, const std::vector<at::Tensor>& grads);
  // Lands `block`'s whole gradient of the pass, summed in `slot` (the
  // caller counted its contributions).
  void LandSlotWhole(int slot, int64_t block);
  // Lands `block`'s whole gradient of the pass, `sum` ([numel] fp32,
  // device; Note [Device gradient accumulation] in executor.h).
  void LandWhole(int64_t block, const at::Tensor& sum);
  // Lands the embedding's contribution, d hidden_0 `grad_hidden` ([B, T,
  // C], device; sent as fp32) for the tokens `rows` ([B*T]): scatter-added
  // on the host.
  void LandEmbeddingRows(int64_t block, const at::Tensor& grad_hidden, std::vector<int32_t> rows);
  // A resident block's final gradient `grad` ([numel] fp32, device): only
  // its squared norm crosses, in order with the landed blocks'.
  void LandResidentNorm(int64_t block, const at::Tensor& grad);

  // Waits until every landing of the pass ran; returns the first error of
  // the accumulator thread (and clears it).
  absl::Status Drain();
  // After a failed pass (streams synchronised): drains and frees every slot.
  void Reset();

  // Bytes of the device gradient slots; of the pinned staging and norm
  // buffers.
  int64_t device_bytes() const { return device_bytes_; }
  int64_t pinned_bytes() const { return pinned_bytes_; }

 private:
  struct Task {
    // kResidentNorm: only the squared norm of a resident block's final
    // gradient (norm_host_[slot]).
    enum class Kind { kDense, kEmbeddingRows, kResidentNorm } kind = Kind::kDense;
    int slot = 0;  // grad slot (device buffer + pinned staging)
    int64_t block = 0;
    int64_t numel = 0;          // elements in staging (dense) or rows*C
    bool first = false;         // first contribution of the pass: overwrite
    bool final = false;         // last contribution of the pass
    bool direct = false;        // already in the store's gradient (dense, first);
                                // norm_host_[slot] then holds its L2 norm
    bool grad_zero = false;     // kEmbeddingRows: the store's gradient is already zero
    int chunk = -1;             // dense, not direct: the chunk buffer holding it
    int64_t offset = 0;         // of the chunk in the block, elements
    bool releases_slot = true;  // last task of its slot's landing
    int ring = -1;              // Note [Gradient ring]: the ring buffer its piece landed in
                                // (offset: the piece's first element in the block)
    bool handed_on = false;     // ring: the callback took the piece (and its release)
    bool first_piece = false;   // ring: the first piece of its landing (carries the norm)
    // Reduced over the ranks on the device (GradientReducer::
    // ReduceScatterOnDevice returned true): only this rank's shard lands.
    bool reduced = false;
    std::vector<int32_t> rows;  // token ids of kEmbeddingRows, [B*T]
    at::Tensor keep_alive;      // device tensors read by the D2H copies
    at::Tensor keep_alive_norm;
  };

  explicit GradLander(StepEnv* env) : env_(env) {}
  // Enqueues the D2H copy of `numel` fp32 at `device_src` (in slot `slot`,
  // whose device work is enqueued) and queues its host task.
  // Reduces `task`'s whole device gradient over the ranks on kD2H (Note
  // [Device reduce-scatter] in gradient_reducer.h) and takes the norm of
  // the range this rank lands, [*begin, *end).
  void ReduceOnDevice(int slot, const float* device_src, Task* task, int64_t* begin, int64_t* end);
  // Throws std::runtime_error where `task` would write into another
  // rank's part of a shared gradient (Note [Shard-only landing]): only the
  // shard of a whole gradient reduced on the device (task.reduced) may
  // land.
  void CheckShardOnly(const Task& task) const;
  void Offload(int slot, int64_t block, int64_t numel, const float* device_src,
               at::Tensor keep_alive, Task::Kind kind, std::vector<int32_t> rows, bool whole);
  // The later contribution in `task` (dense, not direct) at `device_src`,
  // through the chunk ring (Note [Bounded gradient staging]).
  void OffloadChunks(const Task& task, const float* device_src);
  // Waits for a free chunk buffer; returns it, marked busy.
  int AcquireChunk();
  // The direct landing in `task` at `device_src` through the gradient ring:
  // elements [begin, end) of the block (all of it, or this rank's reduced
  // shard, Note [Ring shards] in gradient_reducer.h), in pieces of a ring
  // buffer (Note [Gradient ring]); one empty piece for an empty range.
  void OffloadRing(const Task& task, const float* device_src, int64_t begin, int64_t end);
  // Waits until the next ring buffer in turn is released; returns it,
  // marked busy.
  int AcquireRing();
  // Thread-safe: frees ring buffer `r` (FinalGradient::release).
  void ReleaseRing(int r);
  // The accumulator thread's half of a ring piece: hands it on.
  void RunRingPiece(Task& task);
  void Loop();
  void Run(Task& task);
  // The host half of an embedding landing: the scatter-add by token.
  void ScatterRows(const Task& task, float* grad, const float* src, double& known_sq);

  StepEnv* env_;
  std::vector<at::Tensor> slots_;    // [max numel] fp32, device
  std::vector<int> slot_kind_;       // BlockKind last written, -1 none
  std::vector<HostBuffer> staging_;  // pinned, fp32
  HostBuffer norm_host_;             // pinned, double per grad slot
  // Note [Resident norm ring]: pinned, kResidentNormSlots doubles, and
  // their events (kD2H, or kCompute for the wait).
  HostBuffer resident_norm_host_;
  std::vector<std::unique_ptr<DeviceEvent>> resident_ready_, resident_staged_;
  int next_resident_ = 0;
  std::vector<HostBuffer> chunks_;                          // pinned, GradChunkNumel fp32 each
  std::vector<std::unique_ptr<DeviceEvent>> chunk_staged_;  // per chunk, on kD2H
  int next_chunk_ = 0;
  std::vector<HostBuffer> ring_;  // pinned, GradRingNumels fp32 each; empty without the ring
  std::vector<std::unique_ptr<DeviceEvent>> ring_staged_;  // per ring buffer, on kD2H
  int next_ring_ = 0;
  std::vector<std::unique_ptr<DeviceEvent>> grad_ready_;  // per slot, on kCompute
  std::vector<std::unique_ptr<DeviceEvent>> staged_;      // per slot, on kD2H
  int next_slot_ = 0;
  int64_t device_bytes_ = 0, pinned_bytes_ = 0;

  // Per pass.
  GradContributions contributions_;   // enqueuing thread
  bool embedding_grad_zero_ = false;  // enqueuing thread
  FinalCallback on_block_final_;      // set before the pass's first task
  // Per block: squared norm of its gradient so far in this pass, -1 when
  // unknown (accumulator thread only; reset at the start of a pass).
  std::vector<double> known_sq_;

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> staging_busy_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> resident_busy_ ABSL_GUARDED_BY(mu_);  // Note [Resident norm ring]
  std::vector<bool> chunk_busy_ ABSL_GUARDED_BY(mu_);
  // Per ring buffer: holds a piece not released yet (Note [Gradient ring]).
  std::vector<bool> ring_busy_ ABSL_GUARDED_BY(mu_);
  bool task_running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread accumulator_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_GRAD_LANDER_H_
