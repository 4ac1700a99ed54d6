// Reference Llama-family model (see reference_llama.h).
#include "tests/testing/reference_llama.h"

#include <cmath>
#include <vector>

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

at::Tensor Norm(const at::Tensor& x, const at::Tensor& w, double eps, bool bf16) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf / at::sqrt(xf.square().mean(-1, true) + eps);
  return (bf16 ? w.to(at::kBFloat16) : w) * y.to(x.scalar_type());
}

// Inverse frequencies in double, then fp32.
at::Tensor InvFreq(const ModelConfig& c) {
  std::vector<float> out;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.head_dim);
    const auto& rs = c.rope_scaling;
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

// x [B, heads, T, Dh]: rotate pairs (i, i + Dh/2) by angle pos * inv_freq[i].
at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  at::Tensor c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

}  // namespace

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
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;
  const at::ScalarType cd = bf16 ? at::kBFloat16 : at::kFloat;
  at::Tensor embed = Param(p, "model.embed_tokens.weight");
  at::Tensor x = embed.index_select(0, input_ids.reshape({-1})).view({b, t, c.hidden_size});

  at::Tensor angles = at::arange(t, at::kFloat).unsqueeze(1) * InvFreq(c).unsqueeze(0);  // [T, Dh/2]
  at::Tensor cos = angles.cos(), sin = angles.sin();
  // allowed[q][k]: causal, and within the sliding window when there is one.
  at::Tensor qi = at::arange(t).unsqueeze(1), ki = at::arange(t).unsqueeze(0);
  at::Tensor allowed = ki <= qi;
  if (c.sliding_window > 0) allowed = allowed.logical_and(qi - ki < c.sliding_window);
  // Query head j reads key/value head j / (H / KV).
  std::vector<int64_t> kv_of_head;
  for (int64_t j = 0; j < h; ++j) kv_of_head.push_back(j / (h / kv));
  at::Tensor kv_index = at::tensor(kv_of_head);

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    auto W = [&](const std::string& n) { return Param(p, pre + n); };
    auto Proj = [&](const at::Tensor& in, const std::string& n) {
      at::Tensor y = Mm(in, W(n + ".weight"), bf16);
      at::Tensor bias = W(n + ".bias");
      return bias.defined() ? y + bias.to(y.scalar_type()) : y;
    };
    at::Tensor n1 = Norm(x, W("input_layernorm.weight"), c.rms_norm_eps, bf16).to(cd);
    at::Tensor q = Proj(n1, "self_attn.q_proj").view({b, t, h, dh});
    at::Tensor k = Proj(n1, "self_attn.k_proj").view({b, t, kv, dh});
    at::Tensor v = Proj(n1, "self_attn.v_proj").view({b, t, kv, dh});
    if (c.qk_norm) {
      q = Norm(q, W("self_attn.q_norm.weight"), c.rms_norm_eps, bf16).to(cd);
      k = Norm(k, W("self_attn.k_norm.weight"), c.rms_norm_eps, bf16).to(cd);
    }
    q = Rope(q.permute({0, 2, 1, 3}), cos, sin);                     // [B, H, T, Dh]
    k = Rope(k.permute({0, 2, 1, 3}), cos, sin).index_select(1, kv_index);
    v = v.permute({0, 2, 1, 3}).index_select(1, kv_index);
    at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(2, 3)) / std::sqrt(double(dh));
    scores = scores.masked_fill(allowed.logical_not(), -1e30);
    at::Tensor probs = at::softmax(scores, -1).to(cd);
    at::Tensor attn = at::matmul(probs, v).permute({0, 2, 1, 3}).reshape({b, t, h * dh});
    x = x + Proj(attn, "self_attn.o_proj").to(at::kFloat);
    at::Tensor n2 = Norm(x, W("post_attention_layernorm.weight"), c.rms_norm_eps, bf16).to(cd);
    at::Tensor gate = Mm(n2, W("mlp.gate_proj.weight"), bf16);
    at::Tensor up = Mm(n2, W("mlp.up_proj.weight"), bf16);
    at::Tensor act = gate * at::sigmoid(gate) * up;
    x = x + Mm(act, W("mlp.down_proj.weight"), bf16).to(at::kFloat);
  }
  at::Tensor normed = Norm(x, Param(p, "model.norm.weight"), c.rms_norm_eps, bf16).to(cd);
  at::Tensor head = c.tie_word_embeddings ? embed : Param(p, "lm_head.weight");
  return Mm(normed, head, bf16).to(at::kFloat);  // [B, T, V]
}

at::Tensor ReferenceLoss(const ModelConfig& c, const ReferenceParams& p, const at::Tensor& input_ids,
                         const at::Tensor& labels, bool bf16) {
  at::Tensor logits = ReferenceLogits(c, p, input_ids, bf16);
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

}  // namespace megatrain::testing
