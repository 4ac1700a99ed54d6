// Resident blocks (resident_blocks.h).
#include "engine/step/resident_blocks.h"

#include "absl/strings/str_cat.h"
#include "engine/model/layers.h"
#include "engine/optim/tensor_adamw.h"

namespace megatrain::engine {
namespace {

// Whether `block` keeps a compute-dtype copy beside its fp32 master: an
// untied embedding is read in fp32 only (the gather, like the host path's);
// a tied one is also lm_head, which the head reads in the compute dtype
// (the host path's streaming copy).
bool HasComputeCopy(const ModelLayout& layout, int64_t block, at::ScalarType compute_dtype,
                    bool tied) {
  return compute_dtype != at::kFloat && (block != layout.embedding_block() || tied);
}

std::vector<int64_t> ResidentBlockList(const ModelLayout& layout, int64_t resident_layers,
                                       bool resident_embedding) {
  std::vector<int64_t> blocks;
  for (int64_t l = 0; l < resident_layers; ++l) blocks.push_back(layout.layer_block(l));
  if (resident_embedding) blocks.push_back(layout.embedding_block());
  return blocks;
}

}  // namespace

ResidentBlocks::ResidentBlocks(StepEnv* env, int64_t resident_layers, bool resident_embedding)
    : env_(env) {
  const ModelLayout& layout = env->layout;
  blocks_ = ResidentBlockList(layout, resident_layers, resident_embedding);
  if (resident_embedding) embedding_index_ = static_cast<int>(blocks_.size()) - 1;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(env->runtime->device());
  for (const int64_t block : blocks_) {
    const int64_t numel = layout.blocks[block].numel;
    Block b;
    b.block = block;
    b.master = at::empty({numel}, fp32);
    b.exp_avg = at::empty({numel}, fp32);
    b.exp_avg_sq = at::empty({numel}, fp32);
    b.grad = at::zeros({numel}, fp32);
    b.weights = HasComputeCopy(layout, block, env->compute_dtype, env->config.tie_word_embeddings)
                    ? at::empty({numel}, fp32.dtype(env->compute_dtype))
                    : b.master;
    for (const at::Tensor* t : {&b.master, &b.exp_avg, &b.exp_avg_sq, &b.grad}) {
      device_bytes_ += static_cast<int64_t>(t->nbytes());
    }
    if (!b.weights.is_same(b.master)) device_bytes_ += static_cast<int64_t>(b.weights.nbytes());
    blocks_state_.push_back(std::move(b));
  }
}

at::Tensor ResidentBlocks::EmbeddingTable() const {
  if (embedding_index_ < 0) return at::Tensor();
  // The [V, C] table inside the block (which may end in alignment padding).
  const ModelLayout& layout = env_->layout;
  return BindBlockParams(layout.blocks[layout.embedding_block()],
                         blocks_state_[embedding_index_].master)[0];
}

at::Tensor ResidentBlocks::TiedLmHead() const {
  if (embedding_index_ < 0) return at::Tensor();
  const ModelLayout& layout = env_->layout;
  return BindBlockParams(layout.blocks[layout.embedding_block()],
                         blocks_state_[embedding_index_].weights)[0];
}

absl::Status ResidentBlocks::Schedule(const AdamWStepParams& hp, std::vector<bool> apply) {
  if (apply.size() != blocks_state_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("resident update: ", apply.size(), " flags for ",
                                                   blocks_state_.size(), " resident blocks"));
  }
  if (update_.has_value()) {
    return absl::FailedPreconditionError(
        "resident update: the previous one has not been enqueued yet (no pass since)");
  }
  update_ = hp;
  apply_ = std::move(apply);
  return absl::OkStatus();
}

void ResidentBlocks::ApplyPending() {
  if (!update_.has_value()) return;
  const int token = env_->timer.Begin(StreamKind::kCompute);
  // All applied blocks in one call (Note [Fused device AdamW]).
  std::vector<AdamWTensorSet> sets;
  for (size_t i = 0; i < blocks_state_.size(); ++i) {
    if (!apply_[i]) continue;
    const Block& b = blocks_state_[i];
    sets.push_back({b.master, b.grad, b.exp_avg, b.exp_avg_sq, b.weights});
  }
  MultiTensorAdamWStep(*update_, sets);
  env_->timer.End(StreamKind::kCompute, token);
  update_.reset();
}

absl::Status ResidentBlocks::SyncToStore(bool grads) {
  if (blocks_state_.empty()) return absl::OkStatus();
  HostStore* store = env_->store;
  try {
    auto scope = env_->runtime->Use(StreamKind::kCompute);
    ApplyPending();
    for (const Block& b : blocks_state_) {
      const int64_t numel = env_->layout.blocks[b.block].numel;
      HostTensor(store->master(b.block), numel, at::kFloat).copy_(b.master);
      HostTensor(store->exp_avg(b.block), numel, at::kFloat).copy_(b.exp_avg);
      HostTensor(store->exp_avg_sq(b.block), numel, at::kFloat).copy_(b.exp_avg_sq);
      if (bf16_bits* bf16 = store->streaming_bf16(b.block); bf16 != nullptr) {
        HostTensor(bf16, numel, at::kBFloat16).copy_(b.weights);
      }
      // (A store with a gradient ring has no host gradient for it.)
      if (grads && store->grad(b.block) != nullptr) {
        HostTensor(store->grad(b.block), numel, at::kFloat).copy_(b.grad);
      }
    }
    env_->runtime->Synchronize();
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  return absl::OkStatus();
}

absl::Status ResidentBlocks::LoadFromStore() {
  if (blocks_state_.empty()) return absl::OkStatus();
  update_.reset();
  HostStore* store = env_->store;
  try {
    auto scope = env_->runtime->Use(StreamKind::kCompute);
    for (Block& b : blocks_state_) {
      const int64_t numel = env_->layout.blocks[b.block].numel;
      b.master.copy_(HostTensor(store->master(b.block), numel, at::kFloat));
      b.exp_avg.copy_(HostTensor(store->exp_avg(b.block), numel, at::kFloat));
      b.exp_avg_sq.copy_(HostTensor(store->exp_avg_sq(b.block), numel, at::kFloat));
      // A decoder layer with bf16 compute: the store's bf16 copy, or the
      // master cast on the device (the same bits; Note [Weight streaming]
      // in weight_slots.h).
      if (!b.weights.is_same(b.master)) {
        if (bf16_bits* bf16 = store->streaming_bf16(b.block); bf16 != nullptr) {
          b.weights.copy_(HostTensor(bf16, numel, at::kBFloat16));
        } else {
          b.weights.copy_(b.master);
        }
      }
    }
    env_->runtime->Synchronize();
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
