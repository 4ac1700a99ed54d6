// Reference Llama-family model (see reference_llama.h).
#include "tests/testing/reference_llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "engine/runtime/torch_compat.h"  // MEGATRAIN_TORCH_AT_LEAST
#include "tests/testing/fused_attention_emulation.h"

namespace megatrain::testing {
namespace {

using engine::ModelConfig;

at::Tensor Param(const ReferenceParams& p, const std::string& name) {
  auto it = p.find(name);
  return it == p.end() ? at::Tensor() : it->second;
}

// Matmul "under autocast": both operands in the compute dtype.
at::Tensor Mm(const at::Tensor& x, const at::Tensor& w, bool bf16) {
  if (!bf16) return at::matmul(x, w.t());
  return at::matmul(x.to(at::kBFloat16), w.to(at::kBFloat16).t());
}

// Llama: w * x_hat in x's dtype; Gemma: x_hat * (1 + w) in fp32, then x's
// dtype (weights as streamed: bf16 copies under bf16).
at::Tensor Norm(const ModelConfig& c, const at::Tensor& x, const at::Tensor& w, bool bf16) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf / at::sqrt(xf.square().mean(-1, true) + c.rms_norm_eps);
  at::Tensor wc = bf16 ? w.to(at::kBFloat16) : w;
  if (c.norm_kind == engine::NormKind::kRmsOnePlusWeight) {
    return (y * (wc.to(at::kFloat) + 1.0)).to(x.scalar_type());
  }
  return wc * y.to(x.scalar_type());
}

// Inverse frequencies of the rotary dimensions in double, then fp32.
at::Tensor InvFreq(const ModelConfig& c, double theta, const engine::RopeScaling& rs,
                   int64_t seq_len) {
  std::vector<float> out;
  const int64_t dim = c.RotaryDim();
  for (int64_t i = 0; i < dim / 2; ++i) {
    double f = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
    if (rs.type == engine::RopeScalingType::kLongRope) {  // Phi-3 LongRoPE
      f /= seq_len > rs.original_max_position_embeddings ? rs.long_factor[i] : rs.short_factor[i];
    }
    if (rs.type == engine::RopeScalingType::kLinear) f /= rs.factor;
    if (rs.type == engine::RopeScalingType::kLlama3) {
      // Llama 3.1 technical report / HF _compute_llama3_parameters.
      const double wavelen = 2 * M_PI / f;
      const double low = rs.original_max_position_embeddings / rs.low_freq_factor;
      const double high = rs.original_max_position_embeddings / rs.high_freq_factor;
      if (wavelen > low) {
        f /= rs.factor;
      } else if (wavelen >= high) {
        const double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
    out.push_back(static_cast<float>(f));
  }
  return at::tensor(out);
}

// x [B, heads, T, Dh]: rotate pairs (i, i + Dr/2) of the first Dr = 2 *
// cos.size(-1) dimensions by angle pos * inv_freq[i]; the rest pass. In
// fp32, rounded to x's dtype once (HF under autocast: fp32 cos and sin
// promote the bf16 q and k).
at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = cos.size(-1);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
  at::Tensor rotated = at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
  if (2 * half == x.size(-1)) return rotated;
  return at::cat({rotated, x.narrow(-1, 2 * half, x.size(-1) - 2 * half)}, -1);
}

// LongRoPE's scale of cos and sin (Phi-3), in double.
double RopeMagnitude(const ModelConfig& c) {
  const auto& rs = c.rope_scaling;
  if (rs.type != engine::RopeScalingType::kLongRope) return 1.0;
  if (rs.attention_factor > 0) return rs.attention_factor;
  const double s = double(c.max_position_embeddings) / rs.original_max_position_embeddings;
  return s <= 1
             ? 1.0
             : std::sqrt(1 + std::log(s) / std::log(double(rs.original_max_position_embeddings)));
}

at::Tensor GatedActivation(const ModelConfig& c, const at::Tensor& gate) {
  switch (c.hidden_activation) {
    case engine::MlpActivation::kSilu:
      return gate * at::sigmoid(gate);
    case engine::MlpActivation::kGeluTanh: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * gate * (1 + at::tanh(k * (gate + 0.044715 * gate * gate * gate)));
    }
    case engine::MlpActivation::kGelu:
      return 0.5 * gate * (1 + at::erf(gate / std::sqrt(2.0)));
  }
  return gate;
}

}  // namespace

at::Tensor ReferenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& allowed, bool sliding, double scale, double softcap,
                              AttentionRounding rounding) {
  const bool reduced = q.scalar_type() != at::kFloat;
  if (reduced && softcap <= 0 && rounding == AttentionRounding::kFusedKernel) {
    return FusedAttentionEmulation(q, k, v, allowed, scale);
  }
#if MEGATRAIN_TORCH_AT_LEAST(2, 1)
  if (reduced && softcap <= 0 && rounding == AttentionRounding::kLibTorch) {
    std::optional<at::Tensor> mask;
    if (sliding) mask = allowed;
    return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0,
                                            /*is_causal=*/!sliding, scale);
  }
#endif
  at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(2, 3)) * scale;
  if (softcap > 0) scores = softcap * at::tanh(scores / softcap);
  scores = scores.masked_fill(allowed.logical_not(), -1e30);
  at::Tensor probs = at::softmax(scores, -1);  // [B, H, T, T] fp32
  if (rounding == AttentionRounding::kFp32) {
    return at::matmul(probs, v.to(at::kFloat)).to(q.scalar_type());
  }
  return at::matmul(probs.to(q.scalar_type()), v);
}

ReferenceParams ParamsFromStore(const engine::HostStore& store) {
  ReferenceParams params;
  const engine::ModelLayout& layout = store.layout();
  for (size_t b = 0; b < layout.blocks.size(); ++b) {
    const float* master = store.master(static_cast<int64_t>(b));
    for (const engine::ParamSpec& p : layout.blocks[b].params) {
      at::Tensor t = at::from_blob(const_cast<float*>(master + p.offset), p.shape, at::kFloat)
                         .clone()
                         .requires_grad_(true);
      params[p.hf_name] = t;
    }
  }
  return params;
}

at::Tensor ReferenceLogits(const ModelConfig& c, const ReferenceParams& p,
                           const at::Tensor& input_ids, bool bf16) {
  return ReferenceLogits(c, p, input_ids, bf16, AttentionRounding::kLibTorch);
}

at::Tensor ReferenceLogits(const ModelConfig& c, const ReferenceParams& p,
                           const at::Tensor& input_ids, bool bf16, AttentionRounding attention) {
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;
  const at::ScalarType cd = bf16 ? at::kBFloat16 : at::kFloat;
  at::Tensor embed = Param(p, "model.embed_tokens.weight");
  // nn.Embedding(padding_idx): the pad row takes no gradient from lookups.
  at::Tensor x = at::embedding(embed, input_ids.reshape({-1}), c.EmbeddingPaddingIdx())
                     .view({b, t, c.hidden_size});
  if (c.scale_embeddings) {  // Gemma: sqrt(C) rounded to the activation dtype
    x = x * at::scalar_tensor(std::sqrt(double(c.hidden_size))).to(cd).to(at::kFloat);
  }

  // Global and (Gemma 3) local RoPE tables, [T, Dr/2].
  const double magnitude = RopeMagnitude(c);
  at::Tensor angles = at::arange(t, at::kFloat).unsqueeze(1) *
                      InvFreq(c, c.rope_theta, c.rope_scaling, t).unsqueeze(0);
  at::Tensor cos = angles.cos() * magnitude, sin = angles.sin() * magnitude;
  at::Tensor local_cos = cos, local_sin = sin;
  if (c.rope_local_base_freq > 0) {
    at::Tensor local = at::arange(t, at::kFloat).unsqueeze(1) *
                       InvFreq(c, c.rope_local_base_freq, engine::RopeScaling(), t).unsqueeze(0);
    local_cos = local.cos();
    local_sin = local.sin();
  }
  // allowed[q][k]: causal, and within the window on sliding layers.
  at::Tensor qi = at::arange(t).unsqueeze(1), ki = at::arange(t).unsqueeze(0);
  at::Tensor causal = ki <= qi;
  at::Tensor windowed = causal.logical_and(qi - ki < std::max<int64_t>(c.sliding_window, 1));
  // Query head j reads key/value head j / (H / KV).
  std::vector<int64_t> kv_of_head;
  for (int64_t j = 0; j < h; ++j) kv_of_head.push_back(j / (h / kv));
  at::Tensor kv_index = at::tensor(kv_of_head);
  const double scale = c.query_pre_attn_scalar > 0 ? 1.0 / std::sqrt(c.query_pre_attn_scalar)
                                                   : 1.0 / std::sqrt(double(dh));

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    auto W = [&](const std::string& n) { return Param(p, pre + n); };
    // Phi-3's fused tensors, cut by rows.
    at::Tensor qkv = W("self_attn.qkv_proj.weight"), gate_up = W("mlp.gate_up_proj.weight");
    auto Weight = [&](const std::string& n) {
      if (qkv.defined() && n == "self_attn.q_proj") return qkv.narrow(0, 0, h * dh);
      if (qkv.defined() && n == "self_attn.k_proj") return qkv.narrow(0, h * dh, kv * dh);
      if (qkv.defined() && n == "self_attn.v_proj") return qkv.narrow(0, (h + kv) * dh, kv * dh);
      const int64_t f = c.intermediate_size;
      if (gate_up.defined() && n == "mlp.gate_proj") return gate_up.narrow(0, 0, f);
      if (gate_up.defined() && n == "mlp.up_proj") return gate_up.narrow(0, f, f);
      return W(n + ".weight");
    };
    auto Proj = [&](const at::Tensor& in, const std::string& n) {
      at::Tensor y = Mm(in, Weight(n), bf16);
      at::Tensor bias = W(n + ".bias");
      return bias.defined() ? y + bias.to(y.scalar_type()) : y;
    };
    const bool sliding = c.AttentionType(l) == engine::LayerType::kSlidingAttention;
    at::Tensor n1 = Norm(c, x, W("input_layernorm.weight"), bf16).to(cd);
    at::Tensor q = Proj(n1, "self_attn.q_proj").view({b, t, h, dh});
    at::Tensor k = Proj(n1, "self_attn.k_proj").view({b, t, kv, dh});
    at::Tensor v = Proj(n1, "self_attn.v_proj").view({b, t, kv, dh});
    if (c.qk_norm) {
      q = Norm(c, q, W("self_attn.q_norm.weight"), bf16).to(cd);
      k = Norm(c, k, W("self_attn.k_norm.weight"), bf16).to(cd);
    }
    const at::Tensor& lc = sliding ? local_cos : cos;
    const at::Tensor& ls = sliding ? local_sin : sin;
    q = Rope(q.permute({0, 2, 1, 3}), lc, ls);  // [B, H, T, Dh]
    k = Rope(k.permute({0, 2, 1, 3}), lc, ls).index_select(1, kv_index);
    v = v.permute({0, 2, 1, 3}).index_select(1, kv_index);
    at::Tensor attn = ReferenceAttention(q, k, v, sliding ? windowed : causal, sliding, scale,
                                         c.attn_logit_softcapping, attention);  // [B, H, T, Dh]
    attn = attn.permute({0, 2, 1, 3}).reshape({b, t, h * dh});
    at::Tensor attn_out = Proj(attn, "self_attn.o_proj");
    if (c.sandwich_norms) attn_out = Norm(c, attn_out, W("post_attention_layernorm.weight"), bf16);
    x = x + attn_out.to(at::kFloat);
    const std::string mlp_norm =
        c.sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
    at::Tensor n2 = Norm(c, x, W(mlp_norm), bf16).to(cd);
    at::Tensor gate = Proj(n2, "mlp.gate_proj");
    at::Tensor up = Proj(n2, "mlp.up_proj");
    at::Tensor mlp = Mm(GatedActivation(c, gate) * up, W("mlp.down_proj.weight"), bf16);
    if (c.sandwich_norms) mlp = Norm(c, mlp, W("post_feedforward_layernorm.weight"), bf16);
    x = x + mlp.to(at::kFloat);
  }
  at::Tensor normed = Norm(c, x, Param(p, "model.norm.weight"), bf16).to(cd);
  at::Tensor head = c.tie_word_embeddings ? embed : Param(p, "lm_head.weight");
  at::Tensor logits = Mm(normed, head, bf16).to(at::kFloat);  // [B, T, V]
  if (c.final_logit_softcapping > 0) {
    logits = c.final_logit_softcapping * at::tanh(logits / c.final_logit_softcapping);
  }
  return logits;
}

at::Tensor ReferenceLoss(const ModelConfig& c, const ReferenceParams& p,
                         const at::Tensor& input_ids, const at::Tensor& labels, bool bf16) {
  return ReferenceLoss(c, p, input_ids, labels, bf16, AttentionRounding::kLibTorch);
}

at::Tensor ReferenceLoss(const ModelConfig& c, const ReferenceParams& p,
                         const at::Tensor& input_ids, const at::Tensor& labels, bool bf16,
                         AttentionRounding attention) {
  at::Tensor logits = ReferenceLogits(c, p, input_ids, bf16, attention);
  logits = logits.view({logits.size(0) * logits.size(1), -1});
  at::Tensor flat_labels = labels.reshape({-1});
  at::Tensor mask = flat_labels != -100;
  at::Tensor logp = at::log_softmax(logits, -1);
  at::Tensor picked = logp.gather(1, flat_labels.clamp_min(0).unsqueeze(1)).squeeze(1);
  return -(picked * mask.to(at::kFloat)).sum() / mask.sum().to(at::kFloat);
}

double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  const double ref = b.to(at::kDouble).norm().item<double>();
  return diff / std::max(ref, 1e-30);
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace megatrain::testing
