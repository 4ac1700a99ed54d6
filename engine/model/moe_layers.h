// Stateless layer functions of the mixture-of-experts families (mixtral,
// qwen2_moe, qwen3_moe, gpt_oss), in the style of engine/model/layers.h: weights
// are views bound at call time (BindMoeDecoderLayerWeights over a flat
// buffer laid out by MoeDecoderLayerBlock), activations go in and out, and
// no autograd graph outlives a call. Backward is autograd on a recompute, as
// for the dense layers: the executor calls MoeDecoderLayerForward on leaves
// and takes torch::autograd::grad of (output, aux-loss term) with
// (grad_output, 1) (Note [Load-balancing loss in a streamed backward]).
//
// Dimension legend as in layers.h, plus E experts, k experts per token
// (num_experts_per_tok), Fe expert intermediate size, Fs shared-expert
// intermediate size, M = N*k routed token slots.
//
// Precision: routers run in fp32 on fp32 casts of their input and weights
// and the routing weights stay fp32; RMSNorm statistics are fp32; the expert
// matmuls run in the compute dtype; the combine sums in fp32 (as the dense
// residual stream). All of it holds for every compute dtype.
//
// Note [Deterministic MoE dispatch]
// Token slots (token n, choice j; flat index n*k + j) are sorted by expert
// with a stable sort, so within an expert they stay in token order. Expert
// e's rows are one contiguous range of the sorted activations; the experts
// run as one grouped GEMM (compat::GroupedMm: at::_grouped_mm where LibTorch
// has it, a per-expert loop otherwise). The results return to slot order by
// the inverse permutation (a gather; its backward is a scatter to distinct
// rows, so no atomics collide) and each token's k contributions are added
// in choice order 0, 1, ..., k-1. No step depends on thread timing, so fp32
// runs are bitwise reproducible. Experts that receive no tokens are empty
// ranges: their weights get zero gradient.
//
// Formulas: transformers 5 models/mixtral/modular_mixtral.py
// (MixtralTopKRouter, MixtralExperts), models/qwen2_moe/modular_qwen2_moe.py
// (shared expert, sigmoid gate), models/qwen3_moe/modular_qwen3_moe.py,
// models/gpt_oss/modular_gpt_oss.py (GptOssTopKRouter, GptOssExperts
// _apply_gate, eager_attention_forward with sinks), modeling_rope_utils.py
// (_compute_yarn_parameters), and load_balancing_loss_func in
// modeling_mixtral.py (Switch Transformers, arXiv:2101.03961 eq. 4-6).
#ifndef MEGATRAIN_ENGINE_MOE_LAYERS_H_
#define MEGATRAIN_ENGINE_MOE_LAYERS_H_

#include <ATen/ATen.h>

#include <vector>

#include "engine/model/layers.h"
#include "engine/model/moe_config.h"
#include "engine/model/param_layout.h"

namespace megatrain::engine {

// RoPE tables [T, Dh] fp32 for the model: YaRN (inverse frequencies blended
// between interpolation and extrapolation, cos and sin times the attention
// factor) when configured, else BuildRopeCache of the dense config.
RopeCache BuildMoeRopeCache(const MoeModelConfig& config, int64_t seq_len,
                            const at::Device& device);

// Attention mask of decoder layer `layer_idx`: undefined for plain causal
// attention, else boolean [T, T] (true = attend) for its sliding window.
at::Tensor BuildMoeLayerAttentionMask(const MoeModelConfig& config, int64_t layer_idx,
                                      int64_t seq_len, const at::Device& device);

// Views of one MoE MLP's weights. Absent ones are undefined.
struct MoeMlpWeights {
  at::Tensor router;              // [E, C]
  at::Tensor router_bias;         // [E] (gpt_oss)
  at::Tensor gate_up_proj;        // [E, 2*Fe, C] (kGateUpRows) | [E, C, 2*Fe] (gpt_oss)
  at::Tensor gate_up_proj_bias;   // [E, 2*Fe] (gpt_oss)
  at::Tensor down_proj;           // [E, C, Fe] (kGateUpRows) | [E, Fe, C] (gpt_oss)
  at::Tensor down_proj_bias;      // [E, C] (gpt_oss)
  at::Tensor shared_gate_proj;    // [Fs, C] (qwen2_moe)
  at::Tensor shared_up_proj;      // [Fs, C]
  at::Tensor shared_down_proj;    // [C, Fs]
  at::Tensor shared_expert_gate;  // [1, C]
};

// Views of one decoder layer of a MoE model: attention and norms (and, for
// a dense layer of qwen2/3_moe, its SwiGLU MLP) in `dense`, gpt_oss's
// per-head attention sinks, and the MoE MLP.
struct MoeDecoderLayerWeights {
  DecoderLayerWeights dense;
  at::Tensor sinks;  // [H] (gpt_oss)
  MoeMlpWeights moe;
  bool is_moe = false;
};

// From per-parameter tensors in the order of `block`
// (MoeDecoderLayerBlock), e.g. autograd leaves.
MoeDecoderLayerWeights MoeDecoderLayerWeightsFromParams(const BlockLayout& block,
                                                        const std::vector<at::Tensor>& params);

// Views into `flat` ([block.numel], any dtype and device) following
// `block`. `flat` must outlive the views.
MoeDecoderLayerWeights BindMoeDecoderLayerWeights(const BlockLayout& block, const at::Tensor& flat);

// What the router decided for N tokens.
struct RouterOutput {
  at::Tensor logits;       // [N, E] fp32: Linear(C->E) (+ bias), what the aux loss reads
  at::Tensor topk_weight;  // [N, k] fp32: the routing weights of the chosen experts
  at::Tensor topk_index;   // [N, k] int64: the chosen experts, in top-k order
};

// Router of the family on x [N, C] (any float dtype; computed in fp32).
//   kSoftmaxTopK: p = softmax(logits); top-k of p; / sum if norm_topk_prob.
//   kTopKSoftmax: top-k of logits; softmax over the k.
// Differentiable w.r.t. x and the router weights through topk_weight and
// logits (the selection itself has no gradient).
RouterOutput Route(const MoeConfig& config, const MoeMlpWeights& w, const at::Tensor& x);

// Token slots sorted by expert (Note [Deterministic MoE dispatch]).
struct ExpertDispatch {
  at::Tensor sorted_slot;                  // [M] int64: flat slot index n*k + j, by expert
  at::Tensor sorted_token;                 // [M] int64: token n of each sorted slot
  at::Tensor inverse;                      // [M] int64: sorted position of slot n*k + j
  at::Tensor offsets;                      // [E] int32, device: cumulative end row of each expert
  std::vector<int64_t> tokens_per_expert;  // [E] on the host
};

// Sorts the slots of topk_index [N, k] int64 by expert. Reads the [E]
// counts back to the host (one device sync per MoE layer: the per-expert
// loop needs them; at::_grouped_mm does not, and a later version can drop
// the copy there).
ExpertDispatch SortByExpert(const at::Tensor& topk_index, int64_t num_experts);

// The experts on their sorted rows: x_sorted [M, C] in the compute dtype
// -> [M, C] in the compute dtype (expert e on rows of its range).
// kSwiGlu: down(silu(gate) * up); kClampedSwiGlu: gpt_oss _apply_gate with
// biases. Weights must be in the compute dtype on x's device.
at::Tensor ExpertsForward(const MoeConfig& config, const MoeMlpWeights& w,
                          const at::Tensor& x_sorted, const ExpertDispatch& dispatch);

// One MoE MLP: x [N, C] (fp32 residual-normed input, any dtype) -> [N, C]
// fp32: sum_j topk_weight[n, j] * expert_{topk_index[n, j]}(x_n) (+ the
// qwen2_moe shared expert times sigmoid(shared_expert_gate(x_n))).
// `jitter` is undefined or [N, C] fp32: mixtral's train-time
// router_jitter_noise multiplier (MakeRouterJitter), applied to x before
// routing and experts as HF does. `router` (if non-null) receives the
// router's decision (for the load-balancing loss).
at::Tensor MoeMlpForward(const MoeConfig& config, const MoeMlpWeights& w, const at::Tensor& x,
                         const at::Tensor& jitter, at::ScalarType compute_dtype,
                         RouterOutput* router);

// Note [Router jitter]
// Mixtral's train-time router_jitter_noise (HF MixtralSparseMoeBlock.forward:
// `if self.training and self.jitter_noise > 0: hidden_states *=
// torch.empty_like(hidden_states).uniform_(1 - jitter_noise, 1 + jitter_noise)`)
// multiplies the MoE block's input, so router and experts both see the
// jittered tokens. HF draws it from torch's global generator, in the order
// the forwards consume it; a streamed executor that recomputes each layer's
// forward for its backward (activation checkpointing), in an order that
// depends on the schedule, must instead be able to draw the same noise
// twice. So the noise is a pure function of a 64-bit key and the element's
// position: key = RouterJitterKey(seed, step, micro_batch, layer_idx) (a
// SplitMix64 chain), and element i = n*C + c of the [N, C] multiplier is
//   x = lowbias32(lowbias32(i mod 2^32 XOR key_lo) XOR ((i div 2^32 + key_hi) mod 2^32)),
//   u = (x >> 8) * 2^-24          (24 bits: exact in fp32, in [0, 1))
//   jitter = (1 - eps) + (2 eps) * u   (two fp32 roundings, in that order)
// lowbias32 is C. Wellons' 32-bit integer hash (hash-prospector: x ^= x >> 16;
// x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16). It runs
// as int64 tensor ops on the values' device, every product below 2^63:
// exact integer arithmetic, so any device computes the same bits (tested on
// the CPU against a scalar uint32 implementation; CUDA runs the same ops,
// moe_executor_cuda_test compares it with CPU-drawn reference noise), and
// the noise is the same between a forward and its recompute, across
// schedules and waves, and across a resume (the trainer passes its step
// number). The distribution is HF's (uniform on [1 - eps,
// 1 + eps)); the draws are not (no implementation outside this one can
// reproduce torch's generator order under recomputation anyway).

// The key of one layer's jitter in one micro-batch of one optimizer step.
uint64_t RouterJitterKey(uint64_t seed, int64_t step, int64_t micro_batch, int64_t layer_idx);

// Mixtral's jitter (Note [Router jitter]): [N, C] fp32 on `device`, values
// in [1 - router_jitter_noise, 1 + router_jitter_noise), a function of
// `key` alone; undefined when the noise is 0. Temporaries: int64 chunks of
// at most 2^22 elements.
at::Tensor MakeRouterJitter(const MoeConfig& config, int64_t num_tokens, int64_t hidden,
                            uint64_t key, const at::Device& device);

// Output of one decoder layer.
struct MoeLayerOutput {
  at::Tensor hidden;         // [B, T, C] fp32
  at::Tensor router_logits;  // [B*T, E] fp32; undefined for a dense layer
};

// One decoder layer: attention of the family (q/k/v/o biases, qwen3 q/k
// norms, gpt_oss sinks, the layer's sliding window) then the MoE MLP or,
// for qwen2/3_moe dense layers, the dense SwiGLU MLP. x [B, T, C] fp32;
// weights in the compute dtype except that routers may be any dtype (they
// are cast to fp32). `mask` from BuildMoeLayerAttentionMask(layer_idx).
// `documents` (null: shared) isolates packed documents as
// DecoderLayerForward does (Note [Document attention] in layers.h; `mask`
// is then not used).
MoeLayerOutput MoeDecoderLayerForward(const MoeModelConfig& config, int64_t layer_idx,
                                      const MoeDecoderLayerWeights& w, const at::Tensor& x,
                                      const RopeCache& rope, const at::Tensor& mask,
                                      const at::Tensor& jitter, at::ScalarType compute_dtype,
                                      const PackedDocuments* documents = nullptr);

// Note [Load-balancing loss in a streamed backward]
// HF's load_balancing_loss_func concatenates the router logits of every MoE
// layer (L' layers, N tokens each) and computes
//   aux = E * sum_e f_e * P_e,   f_e = (times e is among a token's top-k) / (L' N),
//                                P_e = sum_{rows} softmax(logits)[row, e] / (L' N),
// with f from a top-k of softmax(logits) (no gradient) and no padding mask
// when the batch has no attention mask (our case: packed sequences). f needs
// every layer, so the executor accumulates LoadBalancingStats during the
// forward, reads the loss after it, and in the backward adds, per layer,
// router_aux_loss_coef * LoadBalancingLayerTerm (a differentiable function
// of that layer's logits whose gradient is the exact gradient of aux with
// respect to them; the terms sum to aux). The training loss is
// CE + router_aux_loss_coef * aux, aux reported on its own.
struct LoadBalancingStats {
  at::Tensor expert_counts;  // [E] fp32: top-k selections per expert, summed over layers
  at::Tensor prob_sums;      // [E] fp32: softmax probabilities summed over rows and layers
  int64_t num_rows = 0;      // L' * N
};

// Adds one layer's router logits [N, E] fp32 to `stats` (detached).
void AccumulateLoadBalancing(const MoeConfig& config, const at::Tensor& router_logits,
                             LoadBalancingStats* stats);

// aux from accumulated stats: [] fp32 (0 when no rows).
at::Tensor LoadBalancingLoss(const MoeConfig& config, const LoadBalancingStats& stats);

// E * sum_e f_e * sum_n softmax(router_logits)[n, e] / (L' N) for one
// layer's logits (with their graph), f from the complete `stats`: [] fp32.
at::Tensor LoadBalancingLayerTerm(const MoeConfig& config, const at::Tensor& router_logits,
                                  const LoadBalancingStats& stats);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MOE_LAYERS_H_
