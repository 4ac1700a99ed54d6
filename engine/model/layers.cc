// Dense decoder layer math (see layers.h for sources and precision rules).
#include "engine/model/layers.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/model/fused_ops.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

// Inverse RoPE frequencies [Dr/2] fp32 for base `theta`, with `rs` applied
// (HF modeling_rope_utils.py: _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
// _compute_longrope_parameters). LongRoPE picks its factors by seq_len.
at::Tensor InverseFrequencies(const ModelConfig& c, double theta, const RopeScaling& rs,
                              int64_t seq_len) {
  const int64_t dim = c.RotaryDim();
  at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;
  if (rs.type == RopeScalingType::kLongRope) {
    const std::vector<double>& f =
        seq_len > rs.original_max_position_embeddings ? rs.long_factor : rs.short_factor;
    at::Tensor ext = at::tensor(std::vector<float>(f.begin(), f.end()));
    return 1.0 / (ext * at::pow(theta, exponent));
  }
  at::Tensor inv_freq = 1.0 / at::pow(theta, exponent);
  if (rs.type == RopeScalingType::kLinear) return inv_freq / rs.factor;
  if (rs.type == RopeScalingType::kLlama3) {
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / rs.low_freq_factor;
    const double high_freq_wavelen = old_len / rs.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq);
    at::Tensor smooth =
        (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    at::Tensor is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    return at::where(is_medium, smoothed, scaled);
  }
  return inv_freq;
}

// LongRoPE's factor on cos and sin (HF _compute_longrope_parameters): the
// configured attention_factor, else sqrt(1 + ln(s) / ln(original)) with
// s = max_position_embeddings / original_max_position_embeddings.
double RopeAttentionFactor(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::kLongRope) return 1.0;
  if (rs.attention_factor > 0) return rs.attention_factor;
  const double original = static_cast<double>(rs.original_max_position_embeddings);
  const double s = static_cast<double>(c.max_position_embeddings) / original;
  return s <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s) / std::log(original));
}

// cos and sin [T, Dr] fp32 of positions [0, T).
std::pair<at::Tensor, at::Tensor> RopeTables(const at::Tensor& inv_freq, int64_t seq_len,
                                             double factor, const at::Device& device) {
  at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat);  // [T]
  at::Tensor freqs = at::outer(positions, inv_freq);                     // [T, Dr/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                          // [T, Dr]
  if (factor == 1.0) return {emb.cos().to(device), emb.sin().to(device)};
  return {(emb.cos() * factor).to(device), (emb.sin() * factor).to(device)};
}

// Note [RoPE precision]
// The rotation is computed in fp32 and rounded to x's dtype once. HF builds
// cos and sin in fp32 and casts them to the dtype of the hidden states,
// which under autocast with fp32 weights (the engine's precision model,
// layers.h) is the fp32 residual stream; q and k (bf16 matmul outputs)
// times fp32 cos promote to fp32, and SDPA's autocast rounds the result to
// bf16. Rounding cos, sin and each product to bf16 instead would add three
// roundings per element. With Dr < Dh only the first Dr dimensions rotate
// (HF Phi-3 apply_rotary_pos_emb: q_rot, q_pass).
//
// Note [RoPE kernels]
// HF's form, (x * cos + rotate_half(x) * sin) with rotate_half(x) =
// cat(-x2, x1), is per element of the halves x1, x2:
//   y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2,
// and its adjoint, for the gradient g of y:
//   gx1 = g1 * c1 + g2 * s2,  gx2 = g2 * c2 - g1 * s1.
// RopeFunction computes exactly these products and sums in fp32 (a + (-b)
// is a - b in IEEE arithmetic, and each product is the same product), so
// its output and gradient are bit for bit those of the composite form and
// of autograd through it. It reads x in its dtype (the fp32 promotion
// happens on load), writes the halves straight into the rounded output
// and runs on [B, T, heads, Dh], the layout the projections produce:
// five elementwise kernels each way instead of about a dozen, on
// contiguous data instead of the transposed [B, heads, T, Dh] view. With
// the fused kernels (CUDA builds, `fused_kernels`) it is one kernel each
// way (fused::LaunchRotaryBf16) computing the same roundings in the same
// order, so on or off gives the same bits; the five ATen kernels cost
// about 2 ms per llama-1b layer at 8 x 2048, their broadcast tables and
// half-width views keeping them off the vectorised path (kernel profile
// in docs/performance.md, "Fused RoPE").

// y's rotary part (or x's gradient, `adjoint`) from x (or y's gradient)
// [B, T, heads, >= Dr] and cos, sin [T, Dr] fp32, into `out` (same shape,
// any floating dtype): Note [RoPE kernels].
// With `fused` the one-kernel form where it applies (FusedRotaryApplies),
// with the same values bit for bit.
void RotateInto(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool adjoint,
                const at::Tensor& out, bool fused) {
#ifdef MEGATRAIN_FUSED_KERNELS
  if (fused && FusedRotaryApplies(x, cos, sin, out)) {
    FusedRotateInto(x, cos, sin, adjoint, out);
    return;
  }
#else
  (void)fused;
#endif
  // [T, Dr], or [B, T, Dr] per token (Note [Document attention]).
  const int64_t rows = cos.dim() == 3 ? cos.size(0) : 1;
  const int64_t t = cos.size(-2), rotary = cos.size(-1), half = rotary / 2;
  const at::Tensor c = cos.view({rows, t, 1, rotary});
  const at::Tensor s = sin.view({rows, t, 1, rotary});
  const at::Tensor xc = at::mul(x.narrow(-1, 0, rotary), c);  // fp32 [B, T, heads, Dr]
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  const at::Tensor s1 = s.narrow(-1, 0, half), s2 = s.narrow(-1, half, half);
  at::Tensor out1 = out.narrow(-1, 0, half), out2 = out.narrow(-1, half, half);
  if (!adjoint) {
    at::sub_out(out1, xc.narrow(-1, 0, half), at::mul(x2, s1));     // x1 c1 - x2 s1
    at::add_out(out2, xc.narrow(-1, half, half), at::mul(x1, s2));  // x2 c2 + x1 s2
  } else {
    at::add_out(out1, xc.narrow(-1, 0, half), at::mul(x2, s2));     // g1 c1 + g2 s2
    at::sub_out(out2, xc.narrow(-1, half, half), at::mul(x1, s1));  // g2 c2 - g1 s1
  }
  if (rotary < x.size(-1)) {  // the pass-through dimensions
    out.narrow(-1, rotary, x.size(-1) - rotary).copy_(x.narrow(-1, rotary, x.size(-1) - rotary));
  }
}

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin, bool fused) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["fused"] = fused;
    at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    RotateInto(x, cos, sin, /*adjoint=*/false, y, fused);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    at::NoGradGuard no_grad;
    const at::Tensor& g = grad_outputs[0];
    at::Tensor gx =
        at::empty(g.sizes(), g.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
    RotateInto(g, saved[0], saved[1], /*adjoint=*/true, gx, ctx->saved_data["fused"].toBool());
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The gated MLP's activation (HF ACT2FN: silu, gelu_pytorch_tanh, gelu).
at::Tensor Activation(const at::Tensor& x, MlpActivation a) {
  switch (a) {
    case MlpActivation::kSilu:
      return at::silu(x);
    case MlpActivation::kGeluTanh:
      return at::gelu(x, "tanh");
    case MlpActivation::kGelu:
      return at::gelu(x);
  }
  return at::silu(x);
}

// cap * tanh(x / cap) (HF Gemma2: logits / cap, tanh, * cap).
at::Tensor SoftCap(const at::Tensor& x, double cap) { return at::tanh(x / cap) * cap; }

// HF repeat_kv: [B, KV, T, Dh] -> [B, KV*n_rep, T, Dh].
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

// One chunk's act(gate(x)) * up(x) [N, F] from its gate and up outputs
// (the MLP's elementwise part; differentiable). With `fused` (Note [Fused
// kernels] in fused_math.h) bf16 CUDA tensors take the fused kernel.
at::Tensor GatedProduct(const at::Tensor& gate, const at::Tensor& up, MlpActivation a, bool fused) {
#ifdef MEGATRAIN_FUSED_KERNELS
  if (fused && FusedGatedProductApplies(gate, up)) return FusedGatedProduct(gate, up, a);
#else
  (void)fused;
#endif
  return Activation(gate, a) * up;
}

// Note [Chunked MLP]: the gated MLP over chunks of rows, saving only its
// inputs. Inputs: x [N, C], gate_proj and up_proj [F, C], down_proj [C, F]
// (one dtype), the activation (as int64) and the rows per chunk.
struct ChunkedMlpFunction : public torch::autograd::Function<ChunkedMlpFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& gate_proj, const at::Tensor& up_proj,
                            const at::Tensor& down_proj, int64_t activation, int64_t chunk_rows,
                            bool fused) {
    ctx->save_for_backward({x, gate_proj, up_proj, down_proj});
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    const auto a = static_cast<MlpActivation>(activation);
    const int64_t rows = x.size(0);
    at::Tensor out = at::empty({rows, down_proj.size(0)}, x.options());  // [N, C]
    for (int64_t start = 0; start < rows; start += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - start);
      const at::Tensor xs = x.narrow(0, start, n);
      at::Tensor p = GatedProduct(at::linear(xs, gate_proj), at::linear(xs, up_proj), a, fused);
      out.narrow(0, start, n).copy_(at::linear(p, down_proj));
    }
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &gate_proj = saved[1], &up_proj = saved[2];
    const at::Tensor& down_proj = saved[3];
    const auto a = static_cast<MlpActivation>(ctx->saved_data["activation"].toInt());
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const bool fused = ctx->saved_data["fused"].toBool();
    const at::Tensor grad_y = grad_outputs[0].to(x.scalar_type());  // [N, C]
    const int64_t rows = x.size(0);
    at::Tensor grad_x = at::empty_like(x, at::MemoryFormat::Contiguous);
    // Weight gradients summed over chunks in fp32, rounded once.
    const at::TensorOptions f32 = x.options().dtype(at::kFloat);
    at::Tensor grad_gate = at::zeros(gate_proj.sizes(), f32);
    at::Tensor grad_up = at::zeros(up_proj.sizes(), f32);
    at::Tensor grad_down = at::zeros(down_proj.sizes(), f32);
    for (int64_t start = 0; start < rows; start += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - start);
      const at::Tensor xs = x.narrow(0, start, n);
      const at::Tensor dy = grad_y.narrow(0, start, n);  // [n, C]
      at::Tensor g, u;
      {
        at::NoGradGuard no_grad;
        g = at::linear(xs, gate_proj).requires_grad_(true);  // [n, F]
        u = at::linear(xs, up_proj).requires_grad_(true);
      }
      at::Tensor p, dg, du;
      {
        at::AutoGradMode enable_grad(true);
        p = GatedProduct(g, u, a, fused);
        at::Tensor dp = at::matmul(dy, down_proj);  // [n, F]
        auto grads = torch::autograd::grad({p}, {g, u}, {dp});
        dg = std::move(grads[0]);
        du = std::move(grads[1]);
      }
      p = p.detach();
      grad_down.add_(at::matmul(dy.t(), p));   // [C, F]
      grad_gate.add_(at::matmul(dg.t(), xs));  // [F, C]
      grad_up.add_(at::matmul(du.t(), xs));
      grad_x.narrow(0, start, n).copy_(at::matmul(dg, gate_proj) + at::matmul(du, up_proj));
    }
    const at::ScalarType dt = x.scalar_type();
    return {grad_x,       grad_gate.to(dt), grad_up.to(dt), grad_down.to(dt),
            at::Tensor(), at::Tensor(),     at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyRotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                bool fused_kernels) {
  return RopeFunction::apply(x, cos.to(at::kFloat), sin.to(at::kFloat), fused_kernels);
}

int64_t MlpChunkRows(int64_t rows, int64_t intermediate, int64_t element_size,
                     int64_t max_chunk_bytes) {
  const int64_t row_bytes = intermediate * element_size;
  if (rows * row_bytes <= max_chunk_bytes) return rows;
  return std::max<int64_t>(1, max_chunk_bytes / row_bytes);
}

at::Tensor GatedMlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                    const at::Tensor& down_proj, MlpActivation activation, int64_t max_chunk_bytes,
                    bool fused_kernels) {
  const int64_t width = x.size(-1), rows = x.numel() / width;
  const int64_t chunk_rows = MlpChunkRows(rows, gate_proj.size(0),
                                          static_cast<int64_t>(x.element_size()), max_chunk_bytes);
  if (chunk_rows >= rows) {  // the plain ops (what HF computes)
    return at::linear(
        GatedProduct(at::linear(x, gate_proj), at::linear(x, up_proj), activation, fused_kernels),
        down_proj);
  }
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = down_proj.size(0);
  return ChunkedMlpFunction::apply(x.reshape({rows, width}), gate_proj, up_proj, down_proj,
                                   static_cast<int64_t>(activation), chunk_rows, fused_kernels)
      .view(out_shape);
}

RopeCache BuildRopeCache(const ModelConfig& config, int64_t seq_len, const at::Device& device) {
  RopeCache cache;
  std::tie(cache.cos, cache.sin) =
      RopeTables(InverseFrequencies(config, config.rope_theta, config.rope_scaling, seq_len),
                 seq_len, RopeAttentionFactor(config), device);
  if (config.rope_local_base_freq > 0) {  // Gemma 3 sliding layers: unscaled
    std::tie(cache.local_cos, cache.local_sin) =
        RopeTables(InverseFrequencies(config, config.rope_local_base_freq, RopeScaling(), seq_len),
                   seq_len, 1.0, device);
  }
  return cache;
}

at::Tensor BuildAttentionMask(const ModelConfig& config, int64_t seq_len,
                              const at::Device& device) {
  if (!config.AnySlidingLayer() || config.sliding_window <= 0 || config.sliding_window >= seq_len) {
    return at::Tensor();
  }
  // Query q attends to key k iff 0 <= q - k < sliding_window (HF
  // masking_utils sliding_window_overlay combined with causal).
  at::Tensor q = at::arange(seq_len, at::kLong).unsqueeze(1);
  at::Tensor k = at::arange(seq_len, at::kLong).unsqueeze(0);
  at::Tensor distance = q - k;
  return (distance >= 0).logical_and(distance < config.sliding_window).to(device);
}

PackedDocuments MakePackedDocuments(absl::Span<const int32_t> position_ids, int64_t micro_batch,
                                    int64_t seq_len, const at::Device& device) {
  const int64_t n = micro_batch * seq_len;
  // [2, B*T] int64: the position ids, then the document ids.
  at::Tensor ids = at::empty({2, n}, at::kLong);
  int64_t* positions = ids.data_ptr<int64_t>();
  int64_t* documents = positions + n;
  std::vector<int32_t> ends;  // cumulative lengths, 0 first
  for (int64_t i = 0; i < n; ++i) {
    positions[i] = position_ids[static_cast<size_t>(i)];
    if (positions[i] == 0) ends.push_back(static_cast<int32_t>(i));
    documents[i] = static_cast<int64_t>(ends.size()) - 1;
  }
  ends.push_back(static_cast<int32_t>(n));
  PackedDocuments docs;
  for (size_t d = 1; d < ends.size(); ++d) {
    docs.max_seqlen = std::max<int64_t>(docs.max_seqlen, ends[d] - ends[d - 1]);
  }
  at::Tensor cu = at::tensor(ends, at::kInt);  // [S + 1]
  if (device.is_cuda()) {                      // pinned, so the copies do not wait on the host
    ids = ids.pin_memory();
    cu = cu.pin_memory();
  }
  ids = ids.to(device, /*non_blocking=*/true);
  docs.position_ids = ids[0].view({micro_batch, seq_len});
  docs.document_ids = ids[1].view({micro_batch, seq_len});
  docs.cu_seqlens = cu.to(device, /*non_blocking=*/true);
  return docs;
}

at::Tensor RopeAtPositions(const at::Tensor& table, const at::Tensor& position_ids) {
  return table.index_select(0, position_ids.reshape({-1}))
      .view({position_ids.size(0), position_ids.size(1), table.size(1)});
}

at::Tensor DocumentAttentionMask(const PackedDocuments& docs, int64_t window) {
  // Query i sees key j iff same document and 0 <= i - j (< window).
  const at::Tensor& ids = docs.document_ids;  // [B, T]
  const int64_t t = ids.size(1);
  const at::Tensor qi = at::arange(t, ids.options()).unsqueeze(1);
  const at::Tensor ki = at::arange(t, ids.options()).unsqueeze(0);
  at::Tensor allowed = (ids.unsqueeze(2) == ids.unsqueeze(1)).logical_and(ki <= qi);  // [B, T, T]
  if (window > 0) allowed = allowed.logical_and(qi - ki < window);
  return allowed.unsqueeze(1);
}

std::vector<at::Tensor> DecoderLayerWeights::List() const {
  std::vector<at::Tensor> out;
  // Fused tensors stand for their row views.
  const bool fused_qkv = qkv_proj.defined(), fused_mlp = gate_up_proj.defined();
  for (const at::Tensor* t :
       {&input_layernorm, &qkv_proj, &q_proj, &q_bias, &k_proj, &k_bias, &v_proj, &v_bias, &o_proj,
        &o_bias, &q_norm, &k_norm, &post_attention_layernorm, &pre_feedforward_layernorm,
        &post_feedforward_layernorm, &gate_up_proj, &gate_proj, &up_proj, &down_proj}) {
    if (fused_qkv && (t == &q_proj || t == &k_proj || t == &v_proj)) continue;
    if (fused_mlp && (t == &gate_proj || t == &up_proj)) continue;
    if (t->defined()) out.push_back(*t);
  }
  return out;
}

std::vector<at::Tensor> BindBlockParams(const BlockLayout& block, const at::Tensor& flat) {
  std::vector<at::Tensor> out;
  out.reserve(block.params.size());
  for (const ParamSpec& p : block.params) {
    out.push_back(flat.narrow(0, p.offset, p.numel).view(p.shape));
  }
  return out;
}

DecoderLayerWeights DecoderLayerWeightsFromParams(const BlockLayout& block,
                                                  const std::vector<at::Tensor>& params) {
  DecoderLayerWeights w;
  w.layer_idx = block.layer_idx;
  const std::pair<const char*, at::Tensor*> slots[] = {
      {"input_layernorm.weight", &w.input_layernorm},
      {"self_attn.qkv_proj.weight", &w.qkv_proj},
      {"mlp.gate_up_proj.weight", &w.gate_up_proj},
      {"pre_feedforward_layernorm.weight", &w.pre_feedforward_layernorm},
      {"post_feedforward_layernorm.weight", &w.post_feedforward_layernorm},
      {"self_attn.q_proj.weight", &w.q_proj},
      {"self_attn.q_proj.bias", &w.q_bias},
      {"self_attn.k_proj.weight", &w.k_proj},
      {"self_attn.k_proj.bias", &w.k_bias},
      {"self_attn.v_proj.weight", &w.v_proj},
      {"self_attn.v_proj.bias", &w.v_bias},
      {"self_attn.o_proj.weight", &w.o_proj},
      {"self_attn.o_proj.bias", &w.o_bias},
      {"self_attn.q_norm.weight", &w.q_norm},
      {"self_attn.k_norm.weight", &w.k_norm},
      {"post_attention_layernorm.weight", &w.post_attention_layernorm},
      {"mlp.gate_proj.weight", &w.gate_proj},
      {"mlp.up_proj.weight", &w.up_proj},
      {"mlp.down_proj.weight", &w.down_proj},
  };
  for (size_t i = 0; i < block.params.size(); ++i) {
    for (const auto& [name, slot] : slots) {
      if (block.params[i].local_name == name) *slot = params[i];
    }
  }
  if (w.qkv_proj.defined()) {  // rows: q [H*Dh], k [KV*Dh], v [KV*Dh]
    const int64_t q_rows = w.o_proj.size(1);
    const int64_t kv_rows = (w.qkv_proj.size(0) - q_rows) / 2;
    w.q_proj = w.qkv_proj.narrow(0, 0, q_rows);
    w.k_proj = w.qkv_proj.narrow(0, q_rows, kv_rows);
    w.v_proj = w.qkv_proj.narrow(0, q_rows + kv_rows, kv_rows);
  }
  if (w.gate_up_proj.defined()) {  // rows: gate [F], up [F]
    const int64_t f = w.gate_up_proj.size(0) / 2;
    w.gate_proj = w.gate_up_proj.narrow(0, 0, f);
    w.up_proj = w.gate_up_proj.narrow(0, f, f);
  }
  return w;
}

DecoderLayerWeights BindDecoderLayerWeights(const BlockLayout& block, const at::Tensor& flat) {
  return DecoderLayerWeightsFromParams(block, BindBlockParams(block, flat));
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // The residual stream is fp32; weight * normed promotes to fp32 then.
  if (at::promote_types(weight.scalar_type(), x.scalar_type()) == at::kFloat) {
    at::Tensor fused = compat::FusedRmsNorm(x, weight, eps);  // Note [Fused RMSNorm]
    if (fused.defined()) return fused;
  }
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
  return weight * normed;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, NormKind kind) {
  if (kind == NormKind::kRms) return RmsNorm(x, weight, eps);
  // HF Gemma2RMSNorm: (x_hat * (1 + w.float())).type_as(x), all in fp32.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
}

namespace {

// Queries per block of SoftcappedAttention: `max_chunk_bytes` of fp32 scores
// against all T keys (at least one query).
int64_t SoftcapQueriesPerBlock(const at::Tensor& q, int64_t max_chunk_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, 4 * q.size(0) * q.size(1) * q.size(2));
  return std::max<int64_t>(1, max_chunk_bytes / row_bytes);
}

// Keys block [start, start + n) of queries can see: [key_begin, start + n).
int64_t SoftcapKeyBegin(int64_t start, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, start - window + 1) : 0;
}

// Intermediates of one block's forward that its backward reads (Note
// [Soft-capped attention]), each [B, H, n, S]: tanh(scores * scale / cap)
// in the compute dtype, the fp32 softmax output, and the probabilities in
// the compute dtype (the same tensor as probs32 when that is fp32).
struct SoftcapBlockSaved {
  at::Tensor tanh;
  at::Tensor probs32;
  at::Tensor probs;
};

// scores * scale / cap in place, as HF computes it (matmul * scaling, then
// / softcap). When `scale` is a power of two the product with it is exact
// in any float format, so one division by cap / scale rounds exactly as the
// two steps do and saves a pass over the block.
void ScaleScoresOverCap(at::Tensor& scores, double scale, double cap) {
  int exponent = 0;
  if (std::frexp(scale, &exponent) == 0.5) {
    scores.div_(cap / scale);
  } else {
    scores.mul_(scale).div_(cap);
  }
}

// One block of soft-capped attention: queries q_block [B, H, n, Dh] at
// positions [start, start + n) against keys / values [B, H, S, Dh] at
// positions [key_begin, start + n). Scores, the cap and the mask in the
// compute dtype, softmax in fp32, probabilities back in the compute dtype
// for PV (HF eager_attention_forward: softmax(..., dtype=float32) reads the
// compute-dtype scores, so no fp32 copy of them is made here either).
// Returns [B, H, n, Dh]; `saved` receives what SoftcapBlockBackward reads.
// Runs without autograd (its in-place steps round exactly as HF's
// out-of-place ones).
at::Tensor SoftcappedAttentionBlock(const at::Tensor& q_block, const at::Tensor& k_seen,
                                    const at::Tensor& v_seen, int64_t start, int64_t key_begin,
                                    double scale, double cap, int64_t window,
                                    const at::Tensor& document_ids, SoftcapBlockSaved* saved) {
  at::NoGradGuard no_grad;
  const int64_t n = q_block.size(2);
  at::Tensor tanh = at::matmul(q_block, k_seen.transpose(-2, -1));  // [B, H, n, S]
  ScaleScoresOverCap(tanh, scale, cap);
  tanh.tanh_();
  at::Tensor scores = tanh * cap;
  const at::TensorOptions positions = q_block.options().dtype(at::kLong);
  at::Tensor qi = at::arange(start, start + n, positions).unsqueeze(1);
  at::Tensor ki = at::arange(key_begin, start + n, positions).unsqueeze(0);
  at::Tensor blocked = ki > qi;
  if (window > 0) blocked = blocked.logical_or(qi - ki >= window);
  if (document_ids.defined()) {  // Note [Document attention]: [B, 1, n, S]
    const at::Tensor doc_q = document_ids.narrow(1, start, n).unsqueeze(2);
    const at::Tensor doc_k = document_ids.narrow(1, key_begin, start + n - key_begin).unsqueeze(1);
    blocked = blocked.logical_or(doc_q != doc_k).unsqueeze(1);
  }
  scores.masked_fill_(blocked, -std::numeric_limits<double>::infinity());
  at::Tensor probs32 = at::softmax(scores, -1, at::kFloat);
  scores.reset();
  at::Tensor probs = probs32.to(q_block.scalar_type());
  at::Tensor out = at::matmul(probs, v_seen);  // [B, H, n, Dh]
  *saved = {std::move(tanh), std::move(probs32), std::move(probs)};
  return out;
}

// Note [Soft-capped attention backward]: the gradients of one block from
// its saved intermediates, which it consumes in place, instead of autograd
// over the forward's steps (six elementwise kernels: dP to fp32, the softmax
// gradient, masked_fill, * cap, tanh', / cap). With dP = dO V^T and the
// FlashAttention identity rowsum(dP * P) = rowsum(dO * O) (Dao et al. 2022,
// appendix B.2), precomputed per query as `delta` [B, H, n, 1] fp32:
//   dV = P^T dO
//   dS = P * (dP - delta) * (1 - tanh^2)      (softmax, then cap * tanh(x / cap))
//   dQ = scale * dS K,  dK = scale * dS^T Q
// in three passes over the block: tanh <- P32 * (1 - tanh^2) (fp32 math,
// stored in the compute dtype), dP -= delta, dP *= tanh. Every pass
// computes in fp32 and rounds once to the compute dtype (autograd rounded
// four times: the softmax gradient, * cap, tanh', / cap); dQ's scale adds
// one rounding unless it is a power of two. `delta` reads the rounded
// output O where autograd's rowsum(dP * P) cancels dP's own rounding: in
// bf16 the gradients are up to 1.25x as far from fp32 ones as autograd's
// (softcapped_attention_test). Masked keys have P = 0, so their dS is 0
// without the mask. grad_q_block [B, H, n, Dh] (compute dtype) is written;
// grad_k_seen / grad_v_seen [B, H, S, Dh] (fp32 accumulators) are added to.
void SoftcapBlockBackward(SoftcapBlockSaved saved, const at::Tensor& grad_out,
                          const at::Tensor& delta, const at::Tensor& q_block,
                          const at::Tensor& k_seen, const at::Tensor& v_seen, double scale,
                          at::Tensor grad_q_block, at::Tensor grad_k_seen, at::Tensor grad_v_seen) {
  at::NoGradGuard no_grad;
  grad_v_seen.add_(at::matmul(saved.probs.transpose(-2, -1), grad_out));
  saved.probs.reset();
  at::Tensor grad = at::matmul(grad_out, v_seen.transpose(-2, -1));  // dP [B, H, n, S]
  at::tanh_backward_out(saved.tanh, saved.probs32, saved.tanh);
  saved.probs32.reset();
  grad.sub_(delta).mul_(saved.tanh);  // dS / scale
  saved.tanh.reset();
  grad_q_block.copy_(at::matmul(grad, k_seen).mul_(scale));
  grad_k_seen.add_(at::matmul(grad.transpose(-2, -1), q_block), scale);
}

// Bytes one block of n queries against S keys keeps from forward to
// backward when the blocks' intermediates are kept (Note [Soft-capped
// attention]): SoftcapBlockSaved's tensors.
int64_t SoftcapKeptBlockBytes(const at::Tensor& q, int64_t n, int64_t keys) {
  const int64_t elements = q.size(0) * q.size(1) * n * keys;
  const int64_t element = static_cast<int64_t>(q.element_size());
  return elements * (4 + (element == 4 ? element : 2 * element));
}

// Bytes of every block's kept graph for q [B, H, T, Dh].
int64_t SoftcapKeptBytes(const at::Tensor& q, int64_t chunk, int64_t window) {
  const int64_t t = q.size(2);
  int64_t bytes = 0;
  for (int64_t start = 0; start < t; start += chunk) {
    const int64_t n = std::min(chunk, t - start);
    bytes += SoftcapKeptBlockBytes(q, n, start + n - SoftcapKeyBegin(start, window));
  }
  return bytes;
}

// Note [Soft-capped attention] forward and backward: when the caller will
// take a gradient and every block's SoftcapBlockSaved fits
// `max_kept_bytes`, forward keeps them (the recomputation of activation
// checkpointing then does the block's forward only once); otherwise forward
// keeps only q, k, v and its output, and the backward recomputes one block
// of queries at a time and takes its gradient before the next, so no more
// than one block's intermediates exist at once. Either way the backward is
// SoftcapBlockBackward's (Note [Soft-capped attention backward]), dK and dV
// gather the blocks' contributions in fp32 and are rounded once.
struct SoftcappedAttentionFunction : public torch::autograd::Function<SoftcappedAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, double scale, double cap,
                            int64_t window, int64_t max_chunk_bytes, int64_t max_kept_bytes,
                            const at::Tensor& document_ids) {
    ctx->saved_data["scale"] = scale;
    if (document_ids.numel() > 0) ctx->saved_data["document_ids"] = document_ids;
    ctx->saved_data["cap"] = cap;
    ctx->saved_data["window"] = window;
    ctx->saved_data["max_chunk_bytes"] = max_chunk_bytes;
    const int64_t t = q.size(2), chunk = SoftcapQueriesPerBlock(q, max_chunk_bytes);
    const bool keep = max_kept_bytes > 0 && SoftcapKeptBytes(q, chunk, window) <= max_kept_bytes;
    std::vector<at::Tensor> kept;  // per block: SoftcapBlockSaved's three tensors
    at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);  // [B, H, T, Dh]
    for (int64_t start = 0; start < t; start += chunk) {
      const int64_t n = std::min(chunk, t - start), key_begin = SoftcapKeyBegin(start, window);
      const int64_t keys = start + n - key_begin;
      SoftcapBlockSaved saved;
      at::Tensor block = SoftcappedAttentionBlock(
          q.narrow(2, start, n), k.narrow(2, key_begin, keys), v.narrow(2, key_begin, keys), start,
          key_begin, scale, cap, window, document_ids.numel() > 0 ? document_ids : at::Tensor(),
          &saved);
      out.narrow(2, start, n).copy_(block);
      if (keep) kept.insert(kept.end(), {saved.tanh, saved.probs32, saved.probs});
    }
    if (keep) ctx->saved_data["kept"] = kept;
    ctx->save_for_backward({q, k, v, out});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const double cap = ctx->saved_data["cap"].toDouble();
    const int64_t window = ctx->saved_data["window"].toInt();
    at::Tensor document_ids;
    if (auto it = ctx->saved_data.find("document_ids"); it != ctx->saved_data.end()) {
      document_ids = it->second.toTensor();
    }
    const int64_t t = q.size(2);
    const int64_t chunk = SoftcapQueriesPerBlock(q, ctx->saved_data["max_chunk_bytes"].toInt());
    std::vector<at::Tensor> kept;
    if (auto it = ctx->saved_data.find("kept"); it != ctx->saved_data.end()) {
      kept = it->second.toTensorVector();
      ctx->saved_data.erase(it);  // each block's intermediates are freed once used
    }
    at::NoGradGuard no_grad;
    // Contiguous once (it arrives as the transpose of o_proj's input
    // gradient): each block reads it in two matmuls and the rowsum.
    const at::Tensor grad_out = grad_outputs[0].to(q.scalar_type()).contiguous();
    // rowsum(dO * O) [B, H, T, 1]: products exact in fp32, summed in fp32.
    const at::Tensor delta = at::mul(grad_out.to(at::kFloat), out).sum(-1, /*keepdim=*/true);
    at::Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
    at::Tensor grad_k = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
    at::Tensor grad_v = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
    size_t block_index = 0;
    for (int64_t start = 0; start < t; start += chunk, ++block_index) {
      const int64_t n = std::min(chunk, t - start), key_begin = SoftcapKeyBegin(start, window);
      const int64_t keys = start + n - key_begin;
      const at::Tensor q_block = q.narrow(2, start, n), k_seen = k.narrow(2, key_begin, keys);
      const at::Tensor v_seen = v.narrow(2, key_begin, keys);
      SoftcapBlockSaved block;
      if (!kept.empty()) {
        block = {std::move(kept[3 * block_index]), std::move(kept[3 * block_index + 1]),
                 std::move(kept[3 * block_index + 2])};
      } else {
        SoftcappedAttentionBlock(q_block, k_seen, v_seen, start, key_begin, scale, cap, window,
                                 document_ids, &block);
      }
      SoftcapBlockBackward(std::move(block), grad_out.narrow(2, start, n),
                           delta.narrow(2, start, n), q_block, k_seen, v_seen, scale,
                           grad_q.narrow(2, start, n), grad_k.narrow(2, key_begin, keys),
                           grad_v.narrow(2, key_begin, keys));
    }
    return {grad_q,
            grad_k.to(k.scalar_type()),
            grad_v.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor SoftcappedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, double cap, int64_t window) {
  return SoftcappedAttention(q, k, v, scale, cap, window, kAttentionChunkBytes,
                             kAttentionKeptBytes);
}

at::Tensor SoftcappedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, double cap, int64_t window, int64_t max_chunk_bytes,
                               int64_t max_kept_bytes, const at::Tensor& document_ids) {
  // Keep the graphs only when a gradient will be taken (the recomputation
  // of activation checkpointing), never in a no-grad forward.
  const bool backward_follows =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  // An autograd function's tensor arguments must be defined: no documents
  // travel as an empty tensor.
  return SoftcappedAttentionFunction::apply(
      q, k, v, scale, cap, window, max_chunk_bytes, backward_follows ? max_kept_bytes : int64_t{0},
      document_ids.defined() ? document_ids : at::empty({0}, q.options().dtype(at::kLong)));
}

namespace {

// Note [Document attention]: q, k, v [B, H, T, Dh] (kv heads repeated) ->
// [B, H, T, Dh], each query against the earlier keys of its document (and
// within `window` > 0).
at::Tensor DocumentCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const PackedDocuments& docs, int64_t window, double scale) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dh = q.size(3);
  const auto tokens = [&](const at::Tensor& x) {  // [B*T, H, Dh]
    return x.transpose(1, 2).reshape({b * t, h, dh});
  };
  at::Tensor out = compat::VarlenCausalAttention(tokens(q), tokens(k), tokens(v), docs.cu_seqlens,
                                                 docs.max_seqlen, scale, window);
  if (out.defined()) return out.reshape({b, t, h, dh}).transpose(1, 2);
  return compat::ScaledDotProductAttention(q, k, v, DocumentAttentionMask(docs, window),
                                           /*is_causal=*/false, scale);
}

at::Tensor AttendRepeatingKv(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& attention_mask, bool sliding,
                             int64_t window, const PackedDocuments* docs);

// Attention sub-layer: n1 [B, T, C] compute dtype -> [B, T, C] (o_proj
// output, compute dtype).
at::Tensor AttentionBlock(const ModelConfig& c, const DecoderLayerWeights& w, const at::Tensor& n1,
                          const RopeCache& rope, const at::Tensor& attention_mask,
                          at::ScalarType cd, const PackedDocuments* docs, bool fused) {
  const int64_t b = n1.size(0), t = n1.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;
  const bool sliding = c.AttentionType(w.layer_idx) == LayerType::kSlidingAttention;
  at::Tensor q = Linear(n1, w.q_proj, w.q_bias).view({b, t, h, dh});   // [B, T, H, Dh]
  at::Tensor k = Linear(n1, w.k_proj, w.k_bias).view({b, t, kv, dh});  // [B, T, KV, Dh]
  at::Tensor v = Linear(n1, w.v_proj, w.v_bias).view({b, t, kv, dh});
  if (c.qk_norm) {  // Qwen3, Gemma 3: per-head RMSNorm over Dh before RoPE
    q = RmsNorm(q, w.q_norm, c.rms_norm_eps, c.norm_kind).to(cd);
    k = RmsNorm(k, w.k_norm, c.rms_norm_eps, c.norm_kind).to(cd);
  }
  const bool local_rope = sliding && rope.local_cos.defined();
  at::Tensor cos = local_rope ? rope.local_cos : rope.cos;  // [T, Dr]
  at::Tensor sin = local_rope ? rope.local_sin : rope.sin;
  if (docs != nullptr) {  // Note [Document attention]: [B, T, Dr]
    cos = RopeAtPositions(cos, docs->position_ids);
    sin = RopeAtPositions(sin, docs->position_ids);
  }
  q = ApplyRotaryEmbedding(q, cos, sin, fused).transpose(1, 2);  // [B, H, T, Dh]
  k = ApplyRotaryEmbedding(k, cos, sin, fused).transpose(1, 2);  // [B, KV, T, Dh]
  v = v.transpose(1, 2);
  at::Tensor attn;
  const int64_t window = sliding ? c.sliding_window : 0;
  const bool plain_causal =
      c.attn_logit_softcapping <= 0 && docs == nullptr && !(sliding && attention_mask.defined());
  if (plain_causal && kv < h && compat::GqaAttentionApplies(q)) {
    // k, v [B, KV, T, Dh] unrepeated: the repeat's copy and the backward's
    // sum over each group are left to the kernel.
    attn = compat::CausalGqaAttention(q, k, v, c.AttentionScale());
  } else {
    attn = AttendRepeatingKv(c, q, RepeatKv(k, h / kv), RepeatKv(v, h / kv), attention_mask,
                             sliding, window, docs);
  }                                                     // [B, H, T, Dh]
  attn = attn.transpose(1, 2).reshape({b, t, h * dh});  // [B, T, H*Dh]
  return Linear(attn, w.o_proj, w.o_bias);
}

// AttentionBlock's attention with k, v repeated to q's heads [B, H, T, Dh]:
// soft-capped, per document, or SDPA (with the sliding mask on sliding
// layers).
at::Tensor AttendRepeatingKv(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& attention_mask, bool sliding,
                             int64_t window, const PackedDocuments* docs) {
  if (c.attn_logit_softcapping > 0) {  // Note [Soft-capped attention]
    return SoftcappedAttention(q, k, v, c.AttentionScale(), c.attn_logit_softcapping, window,
                               kAttentionChunkBytes, kAttentionKeptBytes,
                               docs != nullptr ? docs->document_ids : at::Tensor());
  }
  if (docs != nullptr) return DocumentCausalAttention(q, k, v, *docs, window, c.AttentionScale());
  return compat::ScaledDotProductAttention(q, k, v, sliding ? attention_mask : at::Tensor(),
                                           /*is_causal=*/true, c.AttentionScale());
}

// hidden = x + delta (fp32 [B, T, C]) and RmsNorm(hidden) in `cd`: with
// `fused` one kernel each way where FusedAddRmsNormApplies (Note [Fused
// kernels]), else the add, the norm and the cast.
std::pair<at::Tensor, at::Tensor> ResidualAddRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps,
                                                     NormKind kind, at::ScalarType cd, bool fused) {
#ifdef MEGATRAIN_FUSED_KERNELS
  if (fused && cd == at::kBFloat16 && FusedAddRmsNormApplies(x, delta, weight)) {
    return FusedAddRmsNorm(x, delta, weight, eps, kind);
  }
#else
  (void)fused;
#endif
  at::Tensor hidden = x + delta;
  at::Tensor normed = RmsNorm(hidden, weight, eps, kind).to(cd);
  return {std::move(hidden), std::move(normed)};
}

}  // namespace

at::Tensor DecoderLayerForward(const ModelConfig& c, const DecoderLayerWeights& w,
                               const at::Tensor& x_in, const RopeCache& rope,
                               const at::Tensor& attention_mask, at::ScalarType cd,
                               int64_t mlp_chunk_bytes, const PackedDocuments* documents,
                               bool fused_kernels) {
  at::Tensor x = x_in;
  if (c.scale_embeddings && w.layer_idx == 0) {  // Note [Embedding scale]
    const double normalizer =
        at::scalar_tensor(std::sqrt(static_cast<double>(c.hidden_size)), at::kDouble)
            .to(cd)
            .item<double>();
    x = x * normalizer;
  }
  const NormKind kind = c.norm_kind;
  const double eps = c.rms_norm_eps;

  // Attention block.
  at::Tensor n1 = RmsNorm(x, w.input_layernorm, eps, kind).to(cd);  // [B, T, C]
  at::Tensor attn =
      AttentionBlock(c, w, n1, rope, attention_mask, cd, documents, fused_kernels);  // [B, T, C]
  if (c.sandwich_norms) attn = RmsNorm(attn, w.post_attention_layernorm, eps, kind);

  // MLP block (gated: SwiGLU or GeGLU).
  const at::Tensor& pre_mlp_norm =
      c.sandwich_norms ? w.pre_feedforward_layernorm : w.post_attention_layernorm;
  auto [hidden, n2] = ResidualAddRmsNorm(x, attn, pre_mlp_norm, eps, kind, cd, fused_kernels);
  at::Tensor mlp = GatedMlp(n2, w.gate_proj, w.up_proj, w.down_proj, c.hidden_activation,
                            mlp_chunk_bytes, fused_kernels);  // [B, T, C]; Note [Chunked MLP]
  if (c.sandwich_norms) mlp = RmsNorm(mlp, w.post_feedforward_layernorm, eps, kind);
  return hidden + mlp;
}

namespace {

// A chunk's token cross-entropy from its logits_c [N, V] (compute dtype):
// the loss sum (0-dim, fp32 or fp64, on the device; no graph) and
// d(loss_scale * loss)/d logits_c [N, V] in logits_c's dtype. The fused
// kernel (Note [Fused cross-entropy]) overwrites logits_c with the
// gradient.
std::pair<at::Tensor, at::Tensor> ChunkLossAndGradient(const ModelConfig& c, at::Tensor logits_c,
                                                       const at::Tensor& labels, double loss_scale,
                                                       bool fused_kernels) {
#ifdef MEGATRAIN_FUSED_KERNELS
  if (fused_kernels && c.final_logit_softcapping <= 0 &&
      FusedCrossEntropyApplies(logits_c, labels)) {
    const at::Tensor row_loss = FusedCrossEntropyInPlace(logits_c, labels, loss_scale);
    return {row_loss.sum(at::kDouble), logits_c};
  }
#else
  (void)fused_kernels;
#endif
  logits_c.requires_grad_(true);
  at::Tensor logits = logits_c.to(at::kFloat);
  if (c.final_logit_softcapping > 0) logits = SoftCap(logits, c.final_logit_softcapping);
  at::Tensor loss = at::cross_entropy_loss(logits, labels, /*weight=*/{}, at::Reduction::Sum,
                                           /*ignore_index=*/-100);
  at::Tensor grad_logits = torch::autograd::grad({loss * loss_scale}, {logits_c})[0];
  return {loss.detach(), grad_logits};
}

}  // namespace

// Note [Head weight gradient]
// Autograd runs only through the loss (logits in the compute dtype ->
// fp32 -> soft-cap -> cross-entropy); the two products of the logits'
// gradient G [N, V] are written out: dx = G @ lm_head, as autograd's
// matmul backward computes it, and dW += G^T @ x summed over the chunks
// in fp32. With bf16 compute on CUDA that sum is one GEMM per chunk whose
// epilogue adds into the fp32 accumulator (compat::AddmmIntoFp32), where
// autograd would round each chunk's dW to bf16 and add it with a separate,
// unvectorised mixed-dtype kernel: a whole [V, C] read-modify-write per
// chunk either way, but one pass instead of three (docs/performance-history.md,
// "2026-11-24 (kernel-profile)" and "(head-GEMM)"; kLossChunkLogitBytes sets how many rows
// share it). The fused sum is closer to the exact gradient, not farther;
// where the GEMM is missing (CPU, older torch) the per-chunk rounding
// stays as it was. Chunks are summed in row order in every schedule, so
// schedules, resume and tiers stay bit-identical to each other.
//
// Note [Fused cross-entropy]
// Per chunk, ATen's loss (logits_c.to(fp32), log_softmax, nll_loss and
// their backwards, the gradient cast back to bf16) moves about 32 bytes
// per logit through memory in seven kernels: at llama-1b, 8 x 2048 tokens
// and a 128,256 vocabulary, 67 GB per step. With `fused_kernels` on a CUDA
// build, bf16 compute and no soft-capping, one kernel per chunk
// (FusedCrossEntropyInPlace) reads each row of bf16 logits for its
// log-sum-exp, reads it again and writes the gradient
// scale * (softmax - onehot), rounded once to bf16, over the logits: 6
// bytes per logit, and no fp32 [N, V] tensor. The loss is summed per row
// in fp32 and over rows in fp64 (ATen sums a chunk's rows in fp32). Values
// differ from ATen's by fp32 rounding, so a bf16 gradient element may
// differ by one bf16 step (FusedCrossEntropyCudaTest bounds both); a given
// input always gives the same bits. Soft-capped logits (Gemma 2) keep the
// ATen path.
HeadResult HeadForwardBackward(const ModelConfig& c, const at::Tensor& hidden,
                               const at::Tensor& labels, const at::Tensor& norm_weight,
                               const at::Tensor& lm_head, double loss_scale, int64_t chunk_tokens,
                               at::ScalarType cd, bool fused_kernels) {
  const int64_t rows = hidden.size(0) * hidden.size(1);
  const int64_t width = hidden.size(2);
  at::Tensor h_leaf = hidden.detach().requires_grad_(true);
  at::Tensor norm_leaf = norm_weight.detach().requires_grad_(true);
  at::Tensor normed =
      RmsNorm(h_leaf, norm_leaf, c.rms_norm_eps, c.norm_kind).to(cd).view({rows, width});
  at::Tensor normed_values = normed.detach();
  at::Tensor flat_labels = labels.reshape({rows});

  at::Tensor grad_normed = at::empty_like(normed_values);  // [B*T, C]
  // dW summed over chunks in fp32, rounded to the compute dtype once.
  at::Tensor grad_head = at::zeros(lm_head.sizes(), lm_head.options().dtype(at::kFloat));
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
  for (int64_t start = 0; start < rows; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, rows - start);
    const at::Tensor x = normed_values.narrow(0, start, n);  // [N, C]
    // Note [Head weight gradient]
    const auto [loss, grad_logits] = ChunkLossAndGradient(
        c, at::matmul(x, lm_head.t()), flat_labels.narrow(0, start, n), loss_scale, fused_kernels);
    grad_normed.narrow(0, start, n).copy_(at::matmul(grad_logits, lm_head));  // [N, C]
    compat::AddmmIntoFp32(grad_head, grad_logits.t(), x);                     // [V, C]
    loss_sum.add_(loss);
  }
  auto grads = torch::autograd::grad({normed}, {h_leaf, norm_leaf}, {grad_normed});
  HeadResult out;
  out.loss_sum = loss_sum;
  out.grad_hidden = grads[0];
  out.grad_norm = grads[1];
  out.grad_lm_head = grad_head.to(cd);
  return out;
}

at::Tensor HeadLogits(const ModelConfig& c, const at::Tensor& hidden, const at::Tensor& norm_weight,
                      const at::Tensor& lm_head, at::ScalarType cd) {
  at::Tensor normed =
      RmsNorm(hidden, norm_weight, c.rms_norm_eps, c.norm_kind).to(cd);  // [B, T, C]
  at::Tensor logits = at::matmul(normed, lm_head.t()).to(at::kFloat);    // [B, T, V]
  return c.final_logit_softcapping > 0 ? SoftCap(logits, c.final_logit_softcapping) : logits;
}

at::Tensor HeadLoss(const ModelConfig& c, const at::Tensor& hidden, const at::Tensor& labels,
                    const at::Tensor& norm_weight, const at::Tensor& lm_head, int64_t chunk_tokens,
                    at::ScalarType cd) {
  const int64_t rows = hidden.size(0) * hidden.size(1);
  at::Tensor normed =
      RmsNorm(hidden, norm_weight, c.rms_norm_eps, c.norm_kind).to(cd).view({rows, -1});
  at::Tensor flat_labels = labels.reshape({rows});
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
  for (int64_t start = 0; start < rows; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, rows - start);
    at::Tensor logits = at::matmul(normed.narrow(0, start, n), lm_head.t()).to(at::kFloat);
    if (c.final_logit_softcapping > 0) logits = SoftCap(logits, c.final_logit_softcapping);
    loss_sum.add_(at::cross_entropy_loss(logits, flat_labels.narrow(0, start, n), {},
                                         at::Reduction::Sum, -100));
  }
  return loss_sum;
}

at::Tensor DecoderAttention(const ModelConfig& c, const DecoderLayerWeights& w,
                            const at::Tensor& n1, const RopeCache& rope,
                            const at::Tensor& attention_mask, at::ScalarType cd,
                            const PackedDocuments* documents, bool fused_kernels) {
  return AttentionBlock(c, w, n1, rope, attention_mask, cd, documents, fused_kernels);
}

}  // namespace megatrain::engine
