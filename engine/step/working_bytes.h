// The size formulas of one step's transient working memory on the device
// (or, on the CPU, in host memory): a decoder layer's recompute and
// backward, and the loss chunks. Pure functions of the model and the step's
// shape, below everything in step/ that sizes or allocates: LayerGraphs
// (layer_graphs.cc), the schedule choice (schedule_choice.h, Note [Auto
// resident layers]) and admission (engine/job/training_job.cc) read them.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_ENGINE_STEP_WORKING_BYTES_H_
#define MEGATRAIN_ENGINE_STEP_WORKING_BYTES_H_

#include <cstdint>

#include "engine/model/model_config.h"
#include "engine/model/precision.h"

namespace megatrain::engine {

// Activations of one decoder layer's recompute and backward at `tokens` (B x
// T) tokens, in bytes: 12 [B, T, max(C, F)] tensors of `compute_bytes`
// (2 or 4) per element (activation checkpointing's per-layer autograd graph
// and its gradients). Pure.
int64_t LayerActivationBytes(const ModelConfig& config, int64_t tokens, int64_t compute_bytes);

// The autograd graph one dense decoder layer keeps from its forward to its
// backward at `tokens` (B x T) tokens (Note [Kept layer graphs] in
// executor.h), in bytes: an upper bound of the tensors its operations
// save with plain causal SDPA attention, tokens x `compute_bytes` (2 or 4)
// x elements per token:
//   8 C        the input norm's fp32 input and output and its compute-dtype
//              copy, the attention output, the fp32 residual sum and the
//              pre-MLP norm's output (fp32 counted as two elements)
//   + 6 H Dh   q, k and v twice (projected, then after RoPE), with k and v
//              counted at q's H heads (repeated for the non-GQA kernels)
//   + 3 F      the gate, up and their product
//   + 2 (H + KV) Dh with qk_norm (q, k before their norm), 4 C with
//     sandwich norms, and F + 4 C without `fused` kernels (the activation's
//     input and the unfused norms' intermediates).
// llama-1b at 8 x 2048 in bf16 with the fused kernels: 1.74 GB against
// the 1.24 GB the allocator's peak showed per layer and micro-batch
// (docs/performance.md, "Kept layer graphs"). Soft-capped and sliding
// attention keep more (the schedule choice keeps no graphs for them).
// Pure.
int64_t KeptGraphBytes(const ModelConfig& config, int64_t tokens, int64_t compute_bytes,
                       bool fused);

// One layer's recompute and backward and the loss chunks, in bytes (Note
// [Auto resident layers] in schedule_choice.h): 12 [B, T, max(C, F)] compute-dtype tensors
// (activation checkpointing's per-layer autograd graph and its
// gradients), the largest decoder layer's parameter gradients in fp32 and
// the compute dtype, and 4 GiB for a loss chunk (kLossChunkLogitBytes of
// fp32 logits in engine/model/layers.h, their compute-dtype copy, the
// log-softmax and the gradient).
int64_t WorkingBytes(const ModelConfig& config, ComputeDtype compute_dtype, int64_t micro_batch,
                     int64_t seq_len);

// Bytes of one micro-batch's head and loss at a time (Note [Loss working
// bytes] in the .cc): the logits of one loss chunk ([rows, V]; rows =
// `loss_chunk_tokens`, or the executor's auto kLossChunkLogitBytes / (4 V),
// at least 64, never more than the micro-batch's B * T tokens) in the
// compute dtype and in fp32, their fp32 log-softmax and fp32 gradient. They
// live where the step runs: device memory on a GPU, host memory on the CPU.
// Pure.
int64_t LossWorkingBytes(const ModelConfig& config, ComputeDtype compute_dtype, int64_t tokens,
                         int64_t loss_chunk_tokens = 0);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_WORKING_BYTES_H_
