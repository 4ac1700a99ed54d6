// Stateless layer functions of the dense decoder families (Llama, Mistral,
// Qwen2/3, Gemma 2/3, Phi-3). A layer is a
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
// (q_norm/k_norm), models/mistral (sliding window),
// models/gemma2/modular_gemma2.py (Gemma2RMSNorm (1 + w), sandwich norms,
// embedding normalizer, query_pre_attn_scalar, soft-capping),
// models/gemma3/modular_gemma3.py (local/global RoPE, q/k norms),
// models/phi3/modular_phi3.py (fused projections, partial rotary), and
// modeling_rope_utils.py (_compute_llama3_parameters,
// _compute_longrope_parameters).
//
// Every family difference is read from ModelConfig fields (norm_kind,
// hidden_activation, sandwich_norms, layer_types, ...), never from
// model_type.
//
// Note [Embedding scale]: Gemma multiplies the embedding output by
// sqrt(hidden_size) rounded to the activation dtype (HF: `normalizer =
// torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype)`). The engine
// applies it at the start of decoder layer 0 (DecoderLayerWeights::layer_idx
// == 0), rounded to the compute dtype, so that the embedding stays a plain
// row lookup on every path (host gather, resident gather, scatter-add
// backward) and its gradient comes out of layer 0's autograd already scaled.
//
// Note [Soft-capped attention]: cap * tanh(scores / cap) between QK^T and
// the softmax (Gemma 2) cannot be expressed to LibTorch's fused
// scaled_dot_product_attention, so those layers run SoftcappedAttention:
// scores in the compute dtype for a block of queries at a time against only
// the keys it can see (causal, and the window on sliding layers), capped,
// masked, softmax in fp32, probabilities back in the compute dtype for PV
// (HF eager_attention_forward). It is an autograd function over blocks of
// queries (FlashAttention's recomputation idea, Dao et al. 2022, section
// 3.1, at block rather than tile granularity) with a hand-written backward
// (Note [Soft-capped attention backward] in layers.cc: three elementwise
// passes over a block instead of autograd's eight). When a gradient follows
// (the recomputation of activation checkpointing) and every block's
// intermediates (tanh, fp32 and compute-dtype probabilities) fit
// kAttentionKeptBytes, forward keeps them and backward reads them, so the
// block's forward runs once per recomputation; otherwise forward saves only
// q, k, v and its output and backward recomputes one block at a time and
// takes that block's gradient before the next, so no [B, H, T, T] tensor
// exists: forward holds one block's scores (<= kAttentionChunkBytes fp32),
// backward one block's intermediates and dP (about 2 x
// kAttentionChunkBytes in bf16). Both keep fp32 accumulators for dK and dV
// ([B, H, T, Dh] each). With a power-of-two scale (Gemma 2's
// query_pre_attn_scalar 256), scale and / cap are one division that rounds
// as HF's two steps do. Layers without
// soft-capping use the fused kernel.
//
// Note [Chunked MLP]
// Under activation checkpointing's recomputation autograd keeps four
// [B*T, F] tensors of the gated MLP (act's input and output, up's output,
// and their product, down's input) and backward makes three more of the
// same size: ~7 x T x F x 2 bytes, 196 KiB per token for llama-8b in bf16
// (25 GiB at 128k tokens), more than the rest of the layer. When one
// [rows, F] tensor of a micro-batch would take more than kMlpChunkBytes,
// GatedMlp runs as an autograd function over chunks of rows: forward
// computes down(act(gate(x)) * up(x)) one chunk at a time without autograd
// and saves only x and the three weights; backward, for each chunk,
// recomputes gate(x) and up(x) (not down), differentiates act(g) * u
// under autograd (so every activation's derivative is LibTorch's own, as
// in the reference), and takes dX = dG gate + dU up, and dW_down += dY^T P,
// dW_gate += dG^T X, dW_up += dU^T X into fp32 accumulators rounded to the
// compute dtype once (the soft-capped attention's dK, dV rule). So no
// [B*T, F] tensor exists: forward holds one chunk's gate, up and product,
// backward one chunk's recomputed gate and up, the product, and their
// gradients (~7 chunks of <= kMlpChunkBytes), plus three fp32 weight
// accumulators ([F, C] each). The cost is one more gate and up matmul per
// chunk in backward (2/3 of the MLP's forward again; ~4% of a llama-8b step
// at 128k tokens, where attention dominates). Rows are the flattened
// [B*T], so chunks cross sequence boundaries; each row's values are those
// of the unchunked MLP, and the weight gradients are sums over the same
// rows in another grouping (fp32 within 1e-5 of the reference, bf16
// within its rounding). Below the threshold the plain ops run, unchanged.
// The MoE families' dense layers and shared experts (moe_layers.cc) go
// through GatedMlp at the default threshold; their routed experts do not.
// The final norm, lm_head and cross-entropy are chunked the same way by
// HeadForwardBackward / HeadLoss (`chunk_tokens` rows of logits at a time,
// ExecutorOptions::loss_chunk_tokens): no [B*T, V] tensor exists either.
//
// Note [Document attention]
// With data.packing.document_attention: isolated (engine/spec/
// document_attention.h) a micro-batch carries position ids
// (MicroBatch::position_ids) and the layers get them as PackedDocuments:
// each token attends only to the earlier tokens of its own document
// (causal within a document, and within the window on sliding layers),
// and RoPE rotates it by its position in that document (rows of the
// tables built for seq_len, so LongRoPE's factors are those of seq_len as
// in shared rows), so every document computes what it would alone in a
// row of seq_len tokens of its own, padded (HF's packing with
// position ids, `DataCollatorWithFlattening`; Megatron-LM's
// reset_position_ids + reset_attention_mask). On CUDA in bf16 / fp16 the
// attention is flash attention's variable-length kernel over the
// flattened [B*T] tokens with cumulative document lengths
// (compat::VarlenCausalAttention: no mask exists); elsewhere (the CPU,
// fp32 / tf32 compute) SDPA with a boolean [B, 1, T, T] block-diagonal
// causal mask built per layer call (B x T x T bytes, freed after the
// call); soft-capped layers (Note [Soft-capped attention]) add the
// same-document test to their block masks. The layers then never run
// from CUDA graphs (each micro-batch has its own documents). Without
// PackedDocuments (shared) nothing here changes.
#ifndef MEGATRAIN_ENGINE_LAYERS_H_
#define MEGATRAIN_ENGINE_LAYERS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

#include "engine/model/model_config.h"
#include "engine/model/param_layout.h"

namespace megatrain::engine {

// Bytes of fp32 attention scores one block of queries may hold in
// SoftcappedAttention (Note [Soft-capped attention]): 256 MiB keeps the
// blocks large enough for efficient matmuls (Gemma-2-2B, B = 1, H = 8,
// T = 8192: 1024 queries per block) while bounding backward's transient
// memory to ~0.5 GiB whatever T is.
inline constexpr int64_t kAttentionChunkBytes = int64_t{256} << 20;

// Bytes of fp32 logits one loss chunk holds when
// ExecutorOptions::loss_chunk_tokens is 0 (auto): rows = this / (4 V), at
// least 64. The chunk's working memory is about four times this (the
// logits in the compute dtype and fp32, the log-softmax, the gradient;
// WorkingBytes in engine/step/schedule_choice.h counts 4 GiB). 1 GiB, about
// 2,000 rows at a 128k vocabulary: each chunk's weight-gradient GEMM reads
// and writes the whole fp32 [V, C] accumulator (Note [Head weight
// gradient]), so the chunk sets how often per token that happens; 256 MiB
// (523 rows) cost llama-1b 5% of its step (docs/performance.md, "session
// 12").
inline constexpr int64_t kLossChunkLogitBytes = int64_t{1} << 30;

// Bytes of block intermediates SoftcappedAttention may keep from its
// forward to its backward when a gradient follows (Note [Soft-capped
// attention]): beyond it the backward recomputes each block. 4 GiB holds
// Gemma-2-2B's causal blocks at 8 x 2048 (about 1.3 GB) and at 1 x 8192
// (about 2.2 GB); only one layer's attention is differentiated at a time.
inline constexpr int64_t kAttentionKeptBytes = int64_t{4} << 30;

// Note [Chunked MLP]: the largest [rows, F] compute-dtype tensor the gated
// MLP may hold before it runs in chunks of rows. 1 GiB leaves every
// preset's usual micro-batches unchunked (llama-8b at 8 x 2048 in bf16:
// 470 MB; in fp32 940 MB) and bounds backward's transient MLP memory to
// ~7 GiB at any sequence length (llama-8b bf16: 37,449 rows per chunk).
inline constexpr int64_t kMlpChunkBytes = int64_t{1} << 30;

// RoPE tables for positions [0, T): cos and sin, [T, Dr] fp32 (Dr =
// config.RotaryDim()), on the device, already multiplied by the LongRoPE
// attention factor. local_cos / local_sin: the tables of sliding layers when
// they have their own base (rope_local_base_freq > 0), else undefined.
struct RopeCache {
  at::Tensor cos;
  at::Tensor sin;
  at::Tensor local_cos;
  at::Tensor local_sin;
};

// Builds RoPE tables, applying `rope_scaling` (linear, llama3 or longrope)
// to the inverse frequencies inv_freq[i] = rope_theta^(-2i/Dr). LongRoPE
// uses long_factor when seq_len > original_max_position_embeddings, as HF's
// longrope_frequency_update does for positions [0, seq_len).
RopeCache BuildRopeCache(const ModelConfig& config, int64_t seq_len, const at::Device& device);

// Note [Document attention]: a micro-batch's documents on the device.
// position_ids and document_ids are what the mask path reads, cu_seqlens
// and max_seqlen what the varlen kernel reads.
struct PackedDocuments {
  at::Tensor position_ids;  // [B, T] int64: each token's position in its document
  at::Tensor document_ids;  // [B, T] int64: its document's index in the micro-batch
                            // (row-major, ascending; rows never share one)
  at::Tensor cu_seqlens;    // [S + 1] int32: S documents' cumulative lengths over
                            // the flattened [B*T] tokens, 0 first, B*T last
  int64_t max_seqlen = 0;   // longest document, in tokens
};

// PackedDocuments of MicroBatch::position_ids ([B*T] host; each row starts
// at 0, then each id is 0 or the previous plus one: the executor checks
// that first) on `device`. On CUDA the copies are enqueued on the current
// stream from pinned memory. LibTorch errors are thrown (c10::Error).
PackedDocuments MakePackedDocuments(absl::Span<const int32_t> position_ids, int64_t micro_batch,
                                    int64_t seq_len, const at::Device& device);

// A RoPE table [T, Dr] read at each token's position: position_ids [B, T]
// int64 (values < T) -> [B, T, Dr] (Note [Document attention]).
at::Tensor RopeAtPositions(const at::Tensor& table, const at::Tensor& position_ids);

// The boolean [B, 1, T, T] mask of `docs` (true = attend): query i sees key
// j of the same document with j <= i, and i - j < window when window > 0.
at::Tensor DocumentAttentionMask(const PackedDocuments& docs, int64_t window);

// Rotary position embedding (HF apply_rotary_pos_emb with rotate_half) of
// x [B, T, heads, Dh] (compute dtype, or fp32; the last dimension
// contiguous) with cos, sin [T, Dr], or [B, T, Dr] per token (the tables
// gathered at position ids, Note [Document attention]) (Dr <= Dh, even;
// cast to fp32): the
// first Dr dimensions rotate, the rest pass through. Returns a contiguous
// [B, T, heads, Dh] tensor of x's dtype, computed in fp32 and rounded once
// (Notes [RoPE precision] and [RoPE kernels] in layers.cc); differentiable
// in x, with the same arithmetic as autograd through HF's formula.
// `fused_kernels`: one CUDA kernel each way where the build has them (bf16
// or fp32 x on CUDA), the same values bit for bit (Note [RoPE kernels]).
// Thread-compatible; LibTorch errors are thrown (c10::Error).
at::Tensor ApplyRotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                bool fused_kernels = false);

// Attention mask for the config's sliding layers: undefined when no layer
// slides over a window shorter than seq_len, else a boolean [T, T]
// sliding-window causal mask (true = attend). Full-attention layers ignore
// it (plain causal).
at::Tensor BuildAttentionMask(const ModelConfig& config, int64_t seq_len, const at::Device& device);

// Views of one decoder layer's weights inside a flat buffer. Absent
// parameters (biases, q/k norms, Gemma's extra norms) are undefined tensors.
// With fused checkpoint tensors (Phi-3) qkv_proj / gate_up_proj are the
// parameters and q/k/v_proj, gate/up_proj are row views of them.
struct DecoderLayerWeights {
  int64_t layer_idx = -1;   // from the block (Note [Embedding scale])
  at::Tensor qkv_proj;      // [(H+2KV)*Dh, C] when fused
  at::Tensor gate_up_proj;  // [2F, C] when fused
  at::Tensor pre_feedforward_layernorm, post_feedforward_layernorm;  // [C], sandwich_norms
  at::Tensor input_layernorm;                                        // [C]
  at::Tensor q_proj, q_bias;                                         // [H*Dh, C], [H*Dh]
  at::Tensor k_proj, k_bias;                                         // [KV*Dh, C], [KV*Dh]
  at::Tensor v_proj, v_bias;                                         // [KV*Dh, C], [KV*Dh]
  at::Tensor o_proj, o_bias;                                         // [C, H*Dh], [C]
  at::Tensor q_norm, k_norm;                                         // [Dh]
  at::Tensor post_attention_layernorm;                               // [C]
  at::Tensor gate_proj, up_proj;                                     // [F, C]
  at::Tensor down_proj;                                              // [C, F]

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

// RMSNorm of either kind: kRms is RmsNorm above; kRmsOnePlusWeight is HF
// Gemma2RMSNorm, (x_hat * (1 + weight)) in fp32, cast to x's dtype.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, NormKind kind);

// Causal attention with cap * tanh(scores / cap) (Note [Soft-capped
// attention]). q [B, H, T, Dh], k and v [B, H, T, Dh] (kv heads already
// repeated), all in one dtype; window > 0 limits query i to keys
// (i - window, i]. Returns [B, H, T, Dh] in q's dtype. Differentiable.
at::Tensor SoftcappedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, double cap, int64_t window);

// The same with blocks of `max_chunk_bytes` of fp32 scores (> 0) instead of
// kAttentionChunkBytes, and block graphs kept from forward to backward only
// while they take at most `max_kept_bytes` (0: always recompute in
// backward) instead of kAttentionKeptBytes: tests use it to get several
// blocks at short T and either backward. `document_ids` ([B, T] int64,
// PackedDocuments) also keeps each query to keys of its own document
// (Note [Document attention]); undefined: none.
at::Tensor SoftcappedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, double cap, int64_t window, int64_t max_chunk_bytes,
                               int64_t max_kept_bytes,
                               const at::Tensor& document_ids = at::Tensor());

// Rows per chunk of the gated MLP (Note [Chunked MLP]) for `rows` rows of
// `intermediate` (F) elements of `element_size` bytes: `rows` when
// rows * F * element_size <= max_chunk_bytes (no chunking), else
// max(1, max_chunk_bytes / (F * element_size)). All arguments > 0.
int64_t MlpChunkRows(int64_t rows, int64_t intermediate, int64_t element_size,
                     int64_t max_chunk_bytes);

// Gated MLP (HF LlamaMLP, Gemma's GeGLU): down(act(gate(x)) * up(x)).
// x [..., C] in the weights' dtype; gate_proj, up_proj [F, C]; down_proj
// [C, F] (any of them may be row views of a fused [2F, C] parameter).
// Returns [..., C] in x's dtype. Differentiable in x and the weights; runs
// in chunks of MlpChunkRows(rows, F, x.element_size(), max_chunk_bytes)
// rows when one [rows, F] tensor would exceed `max_chunk_bytes` (> 0;
// Note [Chunked MLP]), else as the plain ops. `fused_kernels`: act(gate) *
// up as one kernel each way on CUDA bf16 (Note [Fused kernels] in
// fused_math.h; ignored elsewhere and in CPU builds).
at::Tensor GatedMlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                    const at::Tensor& down_proj, MlpActivation activation,
                    int64_t max_chunk_bytes = kMlpChunkBytes, bool fused_kernels = false);

// One decoder layer: x [B, T, C] fp32 -> [B, T, C] fp32 (Llama form):
//   h = x + o_proj(attn(rope(q(n1)), rope(k(n1)), v(n1)))   n1 = RMSNorm(x)
//   y = h + down(act(gate(n2)) * up(n2))                    n2 = RMSNorm(h)
// With sandwich_norms (Gemma) the sub-layer outputs are normalised too:
//   h = x + post_attention_norm(attn(...)), n2 = pre_feedforward_norm(h),
//   y = h + post_feedforward_norm(mlp(n2)).
// Layer 0 first scales x (Note [Embedding scale]); sliding layers use
// `attention_mask` and rope's local tables. Weights must already be in
// `compute_dtype` on x's device. The MLP is GatedMlp with
// `mlp_chunk_bytes` (> 0; Note [Chunked MLP]; tests pass small values to
// get several chunks). `documents` (null: shared) isolates the packed
// documents of x (Note [Document attention]); rope's tables are then
// read at their position ids and `attention_mask` is not used.
// `fused_kernels` (ExecutorOptions::fused_kernels): GatedMlp's, the
// residual add + pre-MLP RMSNorm as one kernel each way (Note [Fused
// kernels] in fused_math.h; CUDA bf16 only, the ATen ops elsewhere), and
// the rotary embedding's (ApplyRotaryEmbedding).
at::Tensor DecoderLayerForward(const ModelConfig& config, const DecoderLayerWeights& w,
                               const at::Tensor& x, const RopeCache& rope,
                               const at::Tensor& attention_mask, at::ScalarType compute_dtype,
                               int64_t mlp_chunk_bytes = kMlpChunkBytes,
                               const PackedDocuments* documents = nullptr,
                               bool fused_kernels = false);

// The attention sub-layer of DecoderLayerForward, for layers that differ
// from it only in their MLP (the MoE families, engine/model/moe_layers.h):
// n1 [B, T, C] (the normed input, compute dtype) -> o_proj(attn(...))
// [B, T, C] compute dtype, before any post-attention norm or residual.
// `attention_mask` is used on the sliding layers of `config` (AttentionType);
// `documents` and `fused_kernels` (its rotary embedding's) as in
// DecoderLayerForward.
at::Tensor DecoderAttention(const ModelConfig& config, const DecoderLayerWeights& w,
                            const at::Tensor& n1, const RopeCache& rope,
                            const at::Tensor& attention_mask, at::ScalarType compute_dtype,
                            const PackedDocuments* documents = nullptr, bool fused_kernels = false);

// Result of the head (final norm + lm_head + cross-entropy) on a micro-batch.
struct HeadResult {
  at::Tensor loss_sum;      // [] fp64 on the device: sum of token losses
                            // (nats) over labels != -100; read it at the
                            // end of the step to avoid a host sync here
  at::Tensor grad_hidden;   // [B, T, C] fp32: d(loss_scale * loss_sum)/d hidden
  at::Tensor grad_norm;     // [C] compute dtype
  at::Tensor grad_lm_head;  // [V, C] compute dtype
};

// Final RMSNorm, lm_head, soft-capping of the logits when
// final_logit_softcapping > 0 (in fp32), and token cross-entropy
// (ignore_index -100) with
// their backward, computing logits `chunk_tokens` rows at a time so that the
// [B*T, V] logits never exist at once. Gradients are of
// loss_scale * loss_sum (the executor passes 1 / counted tokens of the
// global batch). hidden [B, T, C] fp32; labels [B, T] int64; norm_weight
// [C] and lm_head [V, C] in compute dtype. `fused_kernels`: the
// cross-entropy and its gradient as one kernel per chunk where the build
// has it (bf16 on CUDA, no soft-capping; Note [Fused cross-entropy] in
// layers.cc).
HeadResult HeadForwardBackward(const ModelConfig& config, const at::Tensor& hidden,
                               const at::Tensor& labels, const at::Tensor& norm_weight,
                               const at::Tensor& lm_head, double loss_scale, int64_t chunk_tokens,
                               at::ScalarType compute_dtype, bool fused_kernels = false);

// Logits of every position: hidden [B, T, C] fp32 -> [B, T, V] fp32
// (final RMSNorm and lm_head in the compute dtype, then widened and
// soft-capped when final_logit_softcapping > 0).
at::Tensor HeadLogits(const ModelConfig& config, const at::Tensor& hidden,
                      const at::Tensor& norm_weight, const at::Tensor& lm_head,
                      at::ScalarType compute_dtype);

// Loss only (evaluation): returns the loss sum, [] fp64 on the device.
at::Tensor HeadLoss(const ModelConfig& config, const at::Tensor& hidden, const at::Tensor& labels,
                    const at::Tensor& norm_weight, const at::Tensor& lm_head, int64_t chunk_tokens,
                    at::ScalarType compute_dtype);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_LAYERS_H_
