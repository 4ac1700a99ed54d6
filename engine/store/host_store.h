// The host-memory model store: every byte of model state lives here.
//
// Per block (embedding, each decoder layer, head; see param_layout.h) there
// is one contiguous flat buffer per kind:
//   master      fp32 master weights                         4 B/param
//   grad        fp32 gradients, accumulated over micro-batches 4 B/param
//               (gradient_ring: the embedding block's only, none when
//               the embedding is resident on the device; the others
//               land in the executor's pinned ring and reach the
//               optimizer from there)
//   exp_avg     fp32 AdamW first moment                      4 B/param
//   exp_avg_sq  fp32 AdamW second moment                     4 B/param
//   streaming   bf16 copy of master, what the device reads   2 B/param
//               (bf16 compute with memory.weight_stream bf16 only;
//               fp32/tf32, and bf16 with weight_stream fp32, stream the
//               master itself: Note [Weight streaming] in
//               step/weight_slots.h)
// Each kind is one mmap'd arena with blocks at 4 KiB-aligned offsets. The
// arenas the device copies from (streaming, or master when it is streamed)
// and into (grad) are pinned when a CUDA device is used (Note [Pinned host
// memory]).
//
// Thread-safety: the store itself is immutable after Create(); the memory
// of different blocks may be read and written concurrently by different
// threads. Ordering between the device pipeline and the CPU optimizer on one
// block is the executor's job (see executor.h).
#ifndef MEGATRAIN_ENGINE_HOST_STORE_H_
#define MEGATRAIN_ENGINE_HOST_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/host_buffer.h"
#include "engine/model/model_config.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/stats.h"

namespace megatrain::engine {

struct HostStoreOptions {
  bool streaming_bf16 = false;  // keep a bf16 streaming copy (bf16 compute)
  bool pin = false;             // pin the arenas the device reads and the gradients
  bool optimizer_state = true;  // allocate grad, exp_avg and exp_avg_sq
  // With optimizer_state: keep exp_avg and exp_avg_sq here (false: they
  // live on the NVMe tier, Note [NVMe tier] in nvme_tier.h, and exp_avg()
  // and exp_avg_sq() are nullptr).
  bool moments_in_host = true;
  // With optimizer_state: no gradient arena but for the embedding block
  // (its scatter-add needs the whole table); every other block's gradient
  // lives in a buffer of the executor's gradient ring while its update
  // runs (Note [Gradient ring] in step/grad_lander.h), handed to the
  // optimizer by the executor (FinalGradient), not through the store.
  bool gradient_ring = false;
  // With gradient_ring: keep the embedding block's gradient arena. False
  // when the embedding is resident on the device (Note [Resident
  // embedding] in step/executor.h), whose gradient lives there: the store
  // then keeps no gradient at all and grad() of the embedding is nullptr
  // (4 bytes x V x C less: 0.26 B/param for llama-8b, 0.44 for llama-3b).
  bool embedding_grad_in_host = true;
};

class HostStore {
 public:
  // Allocates the arenas (zeroed). Errors: INVALID_ARGUMENT / UNIMPLEMENTED
  // from config.Validate(); RESOURCE_EXHAUSTED when memory cannot be mapped
  // or pinned (with the bytes asked for).
  static absl::StatusOr<std::unique_ptr<HostStore>> Create(const ModelConfig& config,
                                                           const HostStoreOptions& options);

  // Bytes Create() would allocate, by kind, without allocating: the numbers
  // used for admission control.
  static HostStoreBytes EstimateBytes(const ModelConfig& config, const HostStoreOptions& options);

  // One data-parallel rank's view of a shared store (Note [Shared host
  // store] in step/gradient_reducer.h): master(), exp_avg(), exp_avg_sq()
  // and streaming_bf16() are `weights`' (not owned; it must outlive the
  // view), grad() is the view's own arena (the rank's landing buffer,
  // pinned as `weights`' options say). bytes() counts only that arena, so
  // summing the shared store's and the views' bytes counts the weights and
  // moments once. INVALID_ARGUMENT when `weights` has no optimizer state,
  // or uses the gradient ring and `private_landing` names any block but
  // the embedding (Note [Ring shards] in step/gradient_reducer.h: the
  // view's ring takes the others' shards; the view then keeps a gradient
  // of the embedding only where it lands it, embedding_grad_in_host);
  // RESOURCE_EXHAUSTED as Create.
  //
  // Note [Shard-only landing]: `private_landing` (empty: every block)
  // names the blocks whose gradient this rank lands whole (the host path:
  // summed on the host, or all-reduced there); only those get the view's
  // own buffer. Every other block's grad() is `weights`' gradient itself:
  // the rank lands there only its own shard of the reduced gradient
  // (Note [Device reduce-scatter] in step/gradient_reducer.h), disjoint
  // from every other rank's, or nothing (a resident block), so that the
  // ranks add no landing arena to the host's footprint.
  static absl::StatusOr<std::unique_ptr<HostStore>> CreateGradientView(
      const HostStore& weights, const std::vector<bool>& private_landing = {});
  // Whether this view lands only its shard of `block` in the shared
  // gradient (Note [Shard-only landing]): false for a store that owns its
  // gradients and for the blocks a view lands whole.
  bool lands_shard_only(int64_t block) const {
    return !private_offsets_.empty() && private_offsets_[block] < 0;
  }
  // The store whose weights a view reads (null for a store that owns them).
  const HostStore* weights_owner() const { return weights_; }

  const ModelConfig& config() const { return config_; }
  const ModelLayout& layout() const { return layout_; }
  const HostStoreOptions& options() const { return options_; }
  int64_t num_blocks() const { return static_cast<int64_t>(layout_.blocks.size()); }
  int64_t block_numel(int64_t block) const { return layout_.blocks[block].numel; }
  // Elements from an arena's start to `block` (a multiple of 1024), and the
  // elements of one arena: the same in every arena and in the NVMe tier's
  // files.
  int64_t block_offset(int64_t block) const { return block_offsets_[block]; }
  int64_t arena_numel() const { return arena_numel_; }

  // Flat fp32 buffers of `block`, block_numel(block) elements each. With
  // gradient_ring, grad() of a block other than the embedding is nullptr.
  float* master(int64_t block) const {
    return weights_ != nullptr ? weights_->master(block) : At<float>(master_, block);
  }
  float* grad(int64_t block) const {
    if (!private_offsets_.empty()) {  // Note [Shard-only landing]
      const int64_t offset = private_offsets_[block];
      return offset < 0 ? weights_->grad(block) : static_cast<float*>(grad_.data()) + offset;
    }
    if (!options_.gradient_ring) return At<float>(grad_, block);
    return block == layout_.embedding_block() ? static_cast<float*>(grad_.data()) : nullptr;
  }
  float* exp_avg(int64_t block) const {
    return weights_ != nullptr ? weights_->exp_avg(block) : At<float>(exp_avg_, block);
  }
  float* exp_avg_sq(int64_t block) const {
    return weights_ != nullptr ? weights_->exp_avg_sq(block) : At<float>(exp_avg_sq_, block);
  }
  // bf16 streaming copy; nullptr unless options().streaming_bf16.
  bf16_bits* streaming_bf16(int64_t block) const {
    if (weights_ != nullptr) return weights_->streaming_bf16(block);
    return options_.streaming_bf16 ? At<bf16_bits>(streaming_, block) : nullptr;
  }
  // What the device copies for `block`: the bf16 copy or the fp32 master.
  const void* streaming_data(int64_t block) const {
    return options_.streaming_bf16 ? static_cast<const void*>(streaming_bf16(block))
                                   : static_cast<const void*>(master(block));
  }
  // Size of streaming_data(block), in bytes.
  int64_t streaming_bytes(int64_t block) const {
    return block_numel(block) * (options_.streaming_bf16 ? 2 : 4);
  }
  bool streaming_pinned() const {
    if (weights_ != nullptr) return weights_->streaming_pinned();
    return options_.streaming_bf16 ? streaming_.pinned() : master_.pinned();
  }

  // Bytes held, by kind.
  HostStoreBytes bytes() const;

  // HF-style initialisation (modeling_llama.py `_init_weights`): Linear and
  // Embedding weights ~ N(0, initializer_range^2), RMSNorm weights 1, biases 0;
  // padding 0. Deterministic for a seed, independent of thread count.
  // Refreshes the streaming copy.
  void InitializeWeights(uint64_t seed, double initializer_range = 0.02);

  // Rewrites the bf16 streaming copy of `block` from its master (round to
  // nearest even). No-op without a bf16 copy.
  void RefreshStreamingCopy(int64_t block);
  void RefreshAllStreamingCopies();

  // Sets every gradient to zero.
  void ZeroGrads();

 private:
  HostStore(ModelConfig config, ModelLayout layout, HostStoreOptions options)
      : config_(std::move(config)), layout_(std::move(layout)), options_(options) {}

  template <typename T>
  T* At(const HostBuffer& arena, int64_t block) const {
    if (arena.data() == nullptr) return nullptr;
    return static_cast<T*>(arena.data()) + block_offsets_[block];
  }

  ModelConfig config_;
  ModelLayout layout_;
  HostStoreOptions options_;
  std::vector<int64_t> block_offsets_;  // elements from the arena start
  int64_t arena_numel_ = 0;
  HostBuffer master_, grad_, exp_avg_, exp_avg_sq_, streaming_;
  const HostStore* weights_ = nullptr;  // CreateGradientView: the shared store
  // Note [Shard-only landing]: per block, its offset in grad_ (elements),
  // or -1 for a block whose grad() is weights_'s; empty: grad_ is a whole
  // arena laid out as block_offsets_.
  std::vector<int64_t> private_offsets_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_HOST_STORE_H_
