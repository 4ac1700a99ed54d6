// Resident blocks (Notes [Resident layers] and [Resident embedding] in
// executor.h): decoder layers 0..N-1, then the embedding when resident,
// kept on the device with their fp32 master, AdamW moments and fp32
// gradient, and updated there.
//
// Ownership: owns the device tensors; uses the StepEnv. The store's copies
// of these blocks are current only after SyncToStore. Thread-safety: the
// enqueuing thread only. Streams: kCompute (updates, accumulation, copies).
#ifndef MEGATRAIN_ENGINE_STEP_RESIDENT_BLOCKS_H_
#define MEGATRAIN_ENGINE_STEP_RESIDENT_BLOCKS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/optim/adamw.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

class ResidentBlocks {
 public:
  // Allocates the device state of layers 0..resident_layers-1 and, when
  // `resident_embedding`, of the embedding (uninitialised but the
  // gradients, zero; LoadFromStore fills them). Throws LibTorch's
  // exceptions on device out of memory.
  ResidentBlocks(StepEnv* env, int64_t resident_layers, bool resident_embedding);

  // Blocks in index order (StreamingExecutor::resident_blocks()).
  const std::vector<int64_t>& blocks() const { return blocks_; }
  bool empty() const { return blocks_.empty(); }
  // Index of the embedding, or -1 when it is not resident.
  int embedding_index() const { return embedding_index_; }
  // Decoder layer `layer` (< resident_layers) is resident block `layer`.
  // [numel] compute dtype weights (the master itself for fp32/tf32).
  const at::Tensor& weights(size_t index) const { return blocks_state_[index].weights; }
  // [numel] fp32 gradient, accumulated over the pass's micro-batches.
  const at::Tensor& grad(size_t index) const { return blocks_state_[index].grad; }
  // The embedding's [V, C] fp32 table (a view of its master); undefined
  // when the embedding is not resident.
  at::Tensor EmbeddingTable() const;
  // A tied embedding's [V, C] table as lm_head, in the compute dtype (a
  // view of its compute copy; of the master for fp32/tf32); undefined
  // when the embedding is not resident.
  at::Tensor TiedLmHead() const;

  // StreamingExecutor::ScheduleResidentUpdate: INVALID_ARGUMENT for a
  // wrong `apply` size, FAILED_PRECONDITION when one is already waiting.
  absl::Status Schedule(const AdamWStepParams& hp, std::vector<bool> apply);
  // Enqueues the waiting update, if any, on the current stream (timed as
  // compute).
  void ApplyPending();
  // StreamingExecutor::SyncResidentToStore / LoadResidentFromStore.
  // INTERNAL (or RESOURCE_EXHAUSTED) for LibTorch failures.
  absl::Status SyncToStore(bool grads);
  absl::Status LoadFromStore();

  // Bytes of the device tensors held.
  int64_t device_bytes() const { return device_bytes_; }

 private:
  struct Block {
    int64_t block = 0;
    at::Tensor master, exp_avg, exp_avg_sq, grad;  // [numel] fp32
    at::Tensor weights;  // [numel] compute dtype; master itself for fp32 and the embedding
  };

  StepEnv* env_;
  std::vector<Block> blocks_state_;
  std::vector<int64_t> blocks_;  // blocks_state_[i].block
  int embedding_index_ = -1;
  std::optional<AdamWStepParams> update_;  // waiting for the next pass
  std::vector<bool> apply_;
  int64_t device_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_RESIDENT_BLOCKS_H_
