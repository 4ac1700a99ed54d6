// Stateless layer functions of the Llama-family decoder. A layer is a
// function of its weights, bound at call time as views into a flat device
// buffer, and its input activations: no module objects and no autograd graph
// that outlives one call.
//
// Dimension legend for engine/ (written once): B micro_batch, T seq_len,
// C hidden_size, F intermediate_size, H attention heads, KV key/value heads,
// Dh head_dim, L layers, V vocab_size, N tokens in a chunk. Tensors are
// row-major; nn.Linear weights are [out, in].
//
// Precision: the residual stream between layers is fp32 (as in HF models
// under bf16 autocast with fp32 weights); matmuls and attention run in the
// compute dtype (bf16, or fp32 with or without TF32); RMSNorm statistics are
// fp32 (HF LlamaRMSNorm).
//
// Formulas: HF transformers models/llama/modeling_llama.py (RMSNorm, RoPE
// rotate_half, repeat_kv, SwiGLU MLP), models/qwen3/modeling_qwen3.py
// (q_norm/k_norm), models/mistral (sliding window), and
// modeling_rope_utils.py (_compute_llama3_parameters).
#ifndef MEGATRAIN_ENGINE_LAYERS_H_
#define MEGATRAIN_ENGINE_LAYERS_H_

#include <ATen/ATen.h>

#include <vector>

#include "engine/model_config.h"
#include "engine/param_layout.h"

namespace megatrain::engine {

// RoPE tables for positions [0, T): cos and sin, [T, Dh] fp32, on the device.
struct RopeCache {
  at::Tensor cos;
  at::Tensor sin;
};

// Builds RoPE tables, applying `rope_scaling` (linear or llama3) to the
// inverse frequencies inv_freq[i] = rope_theta^(-2i/Dh).
RopeCache BuildRopeCache(const ModelConfig& config, int64_t seq_len, const at::Device& device);

// Attention mask for the config: undefined for plain causal attention, else
// a boolean [T, T] sliding-window causal mask (true = attend).
at::Tensor BuildAttentionMask(const ModelConfig& config, int64_t seq_len, const at::Device& device);

// Views of one decoder layer's weights inside a flat buffer. Absent
// parameters (biases, q/k norms) are undefined tensors.
struct DecoderLayerWeights {
  at::Tensor input_layernorm;           // [C]
  at::Tensor q_proj, q_bias;            // [H*Dh, C], [H*Dh]
  at::Tensor k_proj, k_bias;            // [KV*Dh, C], [KV*Dh]
  at::Tensor v_proj, v_bias;            // [KV*Dh, C], [KV*Dh]
  at::Tensor o_proj, o_bias;            // [C, H*Dh], [C]
  at::Tensor q_norm, k_norm;            // [Dh]
  at::Tensor post_attention_layernorm;  // [C]
  at::Tensor gate_proj, up_proj;        // [F, C]
  at::Tensor down_proj;                 // [C, F]

  // The defined tensors in layout order (for autograd::grad).
  std::vector<at::Tensor> List() const;
};

// Views into `flat` ([block.numel], any dtype, any device) following the
// layout of a decoder-layer block. `flat` must outlive the views.
DecoderLayerWeights BindDecoderLayerWeights(const BlockLayout& block, const at::Tensor& flat);

// The same from per-parameter tensors in layout order (e.g. autograd leaves).
DecoderLayerWeights DecoderLayerWeightsFromParams(const BlockLayout& block,
                                                  const std::vector<at::Tensor>& params);

// Views of `flat` for every parameter of `block`, in layout order.
std::vector<at::Tensor> BindBlockParams(const BlockLayout& block, const at::Tensor& flat);

// HF LlamaRMSNorm: x * rsqrt(mean(x^2, -1) + eps) computed in fp32, cast to
// x's dtype, times `weight`. x [..., D], weight [D]. Result dtype follows
// type promotion of weight and x's dtype.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// One decoder layer: x [B, T, C] fp32 -> [B, T, C] fp32.
//   h = x + o_proj(attn(rope(q(n1)), rope(k(n1)), v(n1)))   n1 = RMSNorm(x)
//   y = h + down(silu(gate(n2)) * up(n2))                   n2 = RMSNorm(h)
// Weights must already be in `compute_dtype` on x's device.
at::Tensor DecoderLayerForward(const ModelConfig& config, const DecoderLayerWeights& w,
                               const at::Tensor& x, const RopeCache& rope,
                               const at::Tensor& attention_mask, at::ScalarType compute_dtype);

// Result of the head (final norm + lm_head + cross-entropy) on a micro-batch.
struct HeadResult {
  at::Tensor loss_sum;        // [] fp64 on the device: sum of token losses
                              // (nats) over labels != -100; read it at the
                              // end of the step to avoid a host sync here
  at::Tensor grad_hidden;     // [B, T, C] fp32: d(loss_scale * loss_sum)/d hidden
  at::Tensor grad_norm;       // [C] compute dtype
  at::Tensor grad_lm_head;    // [V, C] compute dtype
};

// Final RMSNorm, lm_head and token cross-entropy (ignore_index -100) with
// their backward, computing logits `chunk_tokens` rows at a time so that the
// [B*T, V] logits never exist at once. Gradients are of
// loss_scale * loss_sum (the executor passes 1 / counted tokens of the
// global batch). hidden [B, T, C] fp32; labels [B, T] int64; norm_weight
// [C] and lm_head [V, C] in compute dtype.
HeadResult HeadForwardBackward(const ModelConfig& config, const at::Tensor& hidden,
                               const at::Tensor& labels, const at::Tensor& norm_weight,
                               const at::Tensor& lm_head, double loss_scale, int64_t chunk_tokens,
                               at::ScalarType compute_dtype);

// Logits of every position: hidden [B, T, C] fp32 -> [B, T, V] fp32
// (final RMSNorm and lm_head in the compute dtype, then widened).
at::Tensor HeadLogits(const ModelConfig& config, const at::Tensor& hidden,
                      const at::Tensor& norm_weight, const at::Tensor& lm_head,
                      at::ScalarType compute_dtype);

// Loss only (evaluation): returns the loss sum, [] fp64 on the device.
at::Tensor HeadLoss(const ModelConfig& config, const at::Tensor& hidden,
                                    const at::Tensor& labels, const at::Tensor& norm_weight,
                                    const at::Tensor& lm_head, int64_t chunk_tokens,
                                    at::ScalarType compute_dtype);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_LAYERS_H_
