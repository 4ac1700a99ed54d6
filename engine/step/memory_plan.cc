// The executor's memory plan (Note [Executor memory plan] in executor.h).
#include <algorithm>
#include <vector>

#include "engine/step/executor.h"
#include "engine/model/layers.h"
#include "engine/model/param_layout.h"
#include "engine/step/grad_lander.h"
#include "engine/step/host_cast.h"
#include "engine/step/input_stager.h"
#include "engine/step/layer_graphs.h"
#include "engine/step/weight_slots.h"

namespace megatrain::engine {

static_assert(ExecutorOptions{}.mlp_chunk_bytes == kMlpChunkBytes,
              "ExecutorOptions::mlp_chunk_bytes defaults to layers.h's constant");
static_assert(ExecutorOptions{}.cast_chunk_elements == kCastChunkElements,
              "ExecutorOptions::cast_chunk_elements defaults to weight_slots.h's constant");
static_assert(ExecutorOptions{}.host_cast_chunk_elements == kHostCastChunkElements,
              "ExecutorOptions::host_cast_chunk_elements defaults to host_cast.h's constant");
static_assert(ExecutorOptions{}.grad_chunk_elements == kGradChunkElements,
              "ExecutorOptions::grad_chunk_elements defaults to grad_lander.h's constant");

ExecutorMemoryPlan PlanExecutorMemory(const ModelConfig& config, const ExecutorOptions& options) {
  const ModelLayout layout = ModelLayout::Create(config);
  ExecutorMemoryPlan plan;
  // Largest block that visits a device slot: streamed layers, head, and
  // the embedding table only when it doubles as lm_head and is not
  // resident. The gradient ring's buffers hold the largest streamed
  // decoder layer (Note [Gradient ring] in grad_lander.h).
  std::vector<int64_t> ring_layer_numels;
  int64_t largest_layer_numel = 0;  // resident or not
  for (int64_t i = 0; i < static_cast<int64_t>(layout.blocks.size()); ++i) {
    if (layout.blocks[i].layer_idx >= 0) {
      largest_layer_numel = std::max(largest_layer_numel, layout.blocks[i].numel);
    }
    if (i == layout.embedding_block() &&
        (!config.tie_word_embeddings || options.resident_embedding)) {
      continue;
    }
    const int64_t layer = layout.blocks[i].layer_idx;
    if (layer >= 0 && layer < options.resident_layers) continue;
    plan.max_slot_numel = std::max(plan.max_slot_numel, layout.blocks[i].numel);
    if (layer >= 0) ring_layer_numels.push_back(layout.blocks[i].numel);
  }
  if (options.gradient_ring) {
    plan.grad_ring_numels =
        GradRingNumels(ring_layer_numels, layout.blocks[layout.head_block()].numel,
                       largest_layer_numel, options.grad_shard_world);
  }
  const int64_t esize = options.compute_dtype == ComputeDtype::kBf16 ? 2 : 4;
  const int64_t tokens = options.micro_batch * options.seq_len;
  const int64_t layer_input_bytes = tokens * config.hidden_size * 4;  // [B, T, C] fp32
  plan.weight_slot_bytes = options.num_weight_slots * esize *
                           ShardedSlotNumel(plan.max_slot_numel, options.weight_shard_world);
  if (options.stream_fp32_master && options.host_cast) {  // Note [Host cast]
    plan.host_cast_staging_bytes =
        HostCastRingOf(plan.max_slot_numel, options.host_cast_chunk_elements).pinned_bytes();
  } else if (options.stream_fp32_master) {
    plan.cast_staging_bytes =
        4 * CastStagingNumel(plan.max_slot_numel, options.cast_chunk_elements);
  }
  plan.grad_slot_bytes = options.num_grad_slots * int64_t{4} * plan.max_slot_numel;
  // Gradient staging: the embedding's d hidden_0 per slot (not for a
  // resident one) and the chunk ring or the gradient ring (Notes [Bounded
  // gradient staging] and [Gradient ring] in grad_lander.h); the ring
  // apart.
  for (const int64_t numel : plan.grad_ring_numels) plan.grad_ring_bytes += 4 * numel;
  plan.grad_staging_bytes =
      GradLanderPinnedBytes(options.num_grad_slots, plan.max_slot_numel,
                            options.resident_embedding ? 0 : layer_input_bytes,
                            options.grad_chunk_elements, plan.grad_ring_numels) -
      plan.grad_ring_bytes;
  plan.input_staging_bytes =
      InputStagerPinnedBytes(tokens, config.hidden_size, !options.resident_embedding);
  if (options.offload_activations && layout.num_layers() > 1) {
    const int64_t wave = options.schedule == StepSchedule::kLayerMajor ? options.wave : 1;
    plan.activation_offload_bytes = wave * (layout.num_layers() - 1) * layer_input_bytes;
    plan.activation_ring_bytes = 2 * layer_input_bytes;
  }
  // Resident blocks: fp32 master, gradient and two moments (16 bytes per
  // element), plus the compute-dtype copy of decoder layers and a tied
  // table (lm_head) under bf16 (an untied embedding is read in fp32).
  for (int64_t l = 0; l < options.resident_layers; ++l) {
    plan.resident_bytes += layout.blocks[layout.layer_block(l)].numel * (16 + (esize == 2 ? 2 : 0));
  }
  if (options.resident_embedding) {
    plan.resident_bytes += layout.blocks[layout.embedding_block()].numel *
                           (16 + (esize == 2 && config.tie_word_embeddings ? 2 : 0));
  }
  if (options.device_grad_accumulation) {
    for (const int64_t block : layout.StreamedDenseBlocks(options.resident_layers)) {
      plan.grad_accumulation_bytes += layout.blocks[block].numel * 4;
    }
  }
  if (options.cuda_graphs && config.moe == nullptr) {  // Note [Layer graphs]
    plan.layer_graph_bytes =
        LayerGraphBytes(config, options.num_weight_slots, options.resident_layers, tokens, esize,
                        largest_layer_numel);
  }
  return plan;
}

}  // namespace megatrain::engine
