// Reference MoE models (see reference_moe.h).
#include "tests/testing/reference_moe.h"

#include <cmath>
#include <limits>

namespace megatrain::testing {
namespace {

using engine::MoeConfig;
using engine::MoeModelConfig;
using engine::MoeTensorMap;

// The two dtypes of a precision (Note [MoE reference precision]): `mm` for
// matmul operands and results, `fl` for everything else.
struct Dtypes {
  at::ScalarType mm;
  at::ScalarType fl;
};

Dtypes DtypesOf(ReferencePrecision precision) {
  switch (precision) {
    case ReferencePrecision::kFp64:
      return {at::kDouble, at::kDouble};
    case ReferencePrecision::kBf16:
      return {at::kBFloat16, at::kFloat};
    case ReferencePrecision::kFp32:
      break;
  }
  return {at::kFloat, at::kFloat};
}

at::Tensor P(const MoeTensorMap& p, const std::string& name) {
  auto it = p.find(name);
  return it == p.end() ? at::Tensor() : it->second;
}

// RMSNorm in `fl` (fp32 or fp64) whatever x's dtype.
at::Tensor Norm(const at::Tensor& x, const at::Tensor& w, double eps, at::ScalarType fl) {
  at::Tensor xf = x.to(fl);
  return w.to(fl) * (xf / at::sqrt(xf.square().mean(-1, true) + eps));
}

// Inverse frequencies [Dh/2] and the cos/sin factor, in double, then fp32 (kept
// in double for kFp64):
// plain rope_theta^(-2i/Dh), or YaRN (arXiv:2309.00071 section 3.2 as in
// transformers' _compute_yarn_parameters).
std::pair<at::Tensor, double> Frequencies(const MoeModelConfig& c, at::ScalarType fl) {
  const int64_t dim = c.base.head_dim;
  const double base = c.base.rope_theta;
  const engine::YarnRope& y = c.moe.yarn;
  double low = 0, high = 1, scale = 1.0;
  if (y.enabled) {
    auto corr = [&](double rot) {
      return dim * std::log(y.original_max_position_embeddings / (rot * 2 * M_PI)) /
             (2 * std::log(base));
    };
    low = corr(y.beta_fast);
    high = corr(y.beta_slow);
    if (y.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;
    scale = y.attention_factor != 0 ? y.attention_factor
                                    : (y.factor <= 1 ? 1.0 : 0.1 * std::log(y.factor) + 1.0);
  }
  std::vector<double> out;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double extrapolated = std::pow(base, -2.0 * i / dim);
    double f = extrapolated;
    if (y.enabled) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      // ramp 0: extrapolate (high frequencies), 1: interpolate by `factor`.
      f = extrapolated / y.factor * ramp + extrapolated * (1 - ramp);
    }
    out.push_back(f);
  }
  return {at::tensor(out, at::kDouble).to(at::kFloat).to(fl), scale};
}

at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

// x W^T (+ b) with operands and result in `dtype`.
at::Tensor Proj(const MoeTensorMap& p, const std::string& name, const at::Tensor& x,
                at::ScalarType dtype) {
  at::Tensor y = at::matmul(x.to(dtype), P(p, name + ".weight").to(dtype).t());
  at::Tensor b = P(p, name + ".bias");
  return b.defined() ? y + b.to(dtype) : y;
}

// Dense SwiGLU in `mm`: [N, C] -> [N, C] `mm`.
at::Tensor SwiGlu(const MoeTensorMap& p, const std::string& pre, const at::Tensor& x,
                  at::ScalarType mm) {
  at::Tensor g = Proj(p, pre + "gate_proj", x, mm);
  return Proj(p, pre + "down_proj", g * at::sigmoid(g) * Proj(p, pre + "up_proj", x, mm), mm);
}

// Attention of layer `l`: x [B, T, C] -> o_proj output [B, T, C] in `dt.mm`.
// Projections in mm; q/k norms, RoPE, scores and softmax in fl; P rounded
// to mm for PV (transformers' eager attention after its fp32 softmax).
at::Tensor Attention(const MoeModelConfig& mc, const MoeTensorMap& p, int64_t l,
                     const at::Tensor& x, Dtypes dt) {
  const engine::ModelConfig& c = mc.base;
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;
  const std::string pre = "model.layers." + std::to_string(l) + ".self_attn.";
  at::Tensor q = Proj(p, pre + "q_proj", x, dt.mm).view({b, t, h, dh});
  at::Tensor k = Proj(p, pre + "k_proj", x, dt.mm).view({b, t, kv, dh});
  at::Tensor v = Proj(p, pre + "v_proj", x, dt.mm).view({b, t, kv, dh});
  if (c.qk_norm) {  // rounded to mm as the projection outputs they replace
    q = Norm(q, P(p, pre + "q_norm.weight"), c.rms_norm_eps, dt.fl).to(dt.mm);
    k = Norm(k, P(p, pre + "k_norm.weight"), c.rms_norm_eps, dt.fl).to(dt.mm);
  }
  auto [inv_freq, scale] = Frequencies(mc, dt.fl);
  at::Tensor angles = at::arange(t, dt.fl).unsqueeze(1) * inv_freq.unsqueeze(0);
  at::Tensor cos = angles.cos() * scale, sin = angles.sin() * scale;
  std::vector<int64_t> kv_of_head;
  for (int64_t j = 0; j < h; ++j) kv_of_head.push_back(j / (h / kv));
  at::Tensor kv_index = at::tensor(kv_of_head);
  // RoPE in fl, rounded once to mm (the attention's operands).
  q = Rope(q.permute({0, 2, 1, 3}).to(dt.fl), cos, sin).to(dt.mm);
  k = Rope(k.permute({0, 2, 1, 3}).to(dt.fl), cos, sin).to(dt.mm).index_select(1, kv_index);
  v = v.permute({0, 2, 1, 3}).index_select(1, kv_index);
  at::Tensor scores = at::matmul(q.to(dt.fl), k.to(dt.fl).transpose(2, 3)) /
                      std::sqrt(double(dh));  // [B, H, T, T] fl
  at::Tensor qi = at::arange(t).unsqueeze(1), ki = at::arange(t).unsqueeze(0);
  at::Tensor allowed = ki <= qi;
  const int64_t window = mc.moe.layer_sliding_window[l];
  if (window > 0) allowed = allowed.logical_and(qi - ki < window);
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor probs;
  at::Tensor sinks = P(p, pre + "sinks");
  if (sinks.defined()) {
    at::Tensor col = sinks.to(dt.fl).view({1, h, 1, 1}).expand({b, h, t, 1});
    probs = at::softmax(at::cat({scores, col}, -1), -1).narrow(-1, 0, t);
  } else {
    probs = at::softmax(scores, -1);
  }
  at::Tensor attn = at::matmul(probs.to(dt.mm), v).permute({0, 2, 1, 3}).reshape({b, t, h * dh});
  return Proj(p, pre + "o_proj", attn, dt.mm);
}

}  // namespace

at::Tensor ReferenceMoeMlp(const MoeConfig& m, const MoeTensorMap& p, const std::string& prefix,
                           const at::Tensor& x, at::Tensor* router_logits,
                           ReferencePrecision precision) {
  const Dtypes dt = DtypesOf(precision);
  const bool oss = m.family == engine::MoeFamily::kGptOss;
  const std::string mlp = prefix + "mlp.";
  // The router in fl: [N, E].
  at::Tensor logits = Proj(p, mlp + (oss ? "router" : "gate"), x, dt.fl);
  *router_logits = logits;
  at::Tensor weights, index;
  if (oss) {
    auto [top, idx] = at::topk(logits, m.num_experts_per_tok, -1);
    weights = at::softmax(top, -1);
    index = idx;
  } else {
    auto [top, idx] = at::topk(at::softmax(logits, -1), m.num_experts_per_tok, -1);
    weights = m.norm_topk_prob ? top / top.sum(-1, true) : top;
    index = idx;
  }
  // Experts in mm; each one's output times its routing weight (fl) is
  // added in fl.
  at::Tensor gate_up = P(p, mlp + "experts.gate_up_proj").to(dt.mm);
  at::Tensor down = P(p, mlp + "experts.down_proj").to(dt.mm);
  const int64_t fe = m.moe_intermediate_size;
  at::Tensor out = at::zeros_like(x, x.options().dtype(dt.fl));
  for (int64_t e = 0; e < m.num_experts; ++e) {
    at::Tensor hit = (index == e).nonzero();  // [hits, 2]: token, slot
    if (hit.size(0) == 0) continue;
    at::Tensor token = hit.select(1, 0), slot = hit.select(1, 1);
    at::Tensor xe = x.to(dt.mm).index_select(0, token);
    at::Tensor ye;
    if (oss) {
      at::Tensor hgu =
          at::matmul(xe, gate_up[e]) + P(p, mlp + "experts.gate_up_proj_bias")[e].to(dt.mm);
      at::Tensor g = hgu.slice(1, 0, 2 * fe, 2).clamp_max(m.swiglu_limit);
      at::Tensor u = hgu.slice(1, 1, 2 * fe, 2).clamp(-m.swiglu_limit, m.swiglu_limit);
      at::Tensor act = (u + 1) * (g * at::sigmoid(g * m.swiglu_alpha));
      ye = at::matmul(act, down[e]) + P(p, mlp + "experts.down_proj_bias")[e].to(dt.mm);
    } else {
      at::Tensor hgu = at::matmul(xe, gate_up[e].t());
      at::Tensor g = hgu.narrow(1, 0, fe);
      ye = at::matmul(g * at::sigmoid(g) * hgu.narrow(1, fe, fe), down[e].t());
    }
    at::Tensor w = weights.index({token, slot}).unsqueeze(1);
    out = out.index_add(0, token, ye.to(dt.fl) * w);
  }
  if (m.shared_expert_intermediate_size > 0) {  // the expert in mm, its gate in fl
    at::Tensor shared = SwiGlu(p, mlp + "shared_expert.", x, dt.mm).to(dt.fl);
    out = out + at::sigmoid(Proj(p, mlp + "shared_expert_gate", x, dt.fl)) * shared;
  }
  return out;
}

at::Tensor ReferenceLoadBalancingLoss(const std::vector<at::Tensor>& router_logits,
                                      int64_t num_experts, int64_t top_k) {
  at::Tensor all = at::cat(router_logits, 0);  // [L'N, E]
  at::Tensor probs = at::softmax(all, -1);
  at::Tensor selected = std::get<1>(at::topk(probs, top_k, -1));                    // [L'N, k]
  at::Tensor one_hot = at::one_hot(selected, num_experts).to(probs.scalar_type());  // [L'N, k, E]
  at::Tensor tokens_per_expert = one_hot.mean(0);                                   // [k, E]
  at::Tensor prob_per_expert = probs.mean(0);                                       // [E]
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() *
         static_cast<double>(num_experts);
}

ReferenceMoeResult ReferenceMoeForward(const MoeModelConfig& mc, const MoeTensorMap& p,
                                       const at::Tensor& input_ids, const at::Tensor& labels,
                                       ReferencePrecision precision,
                                       const std::vector<at::Tensor>& jitter) {
  const Dtypes dt = DtypesOf(precision);
  const engine::ModelConfig& c = mc.base;
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  at::Tensor x = P(p, "model.embed_tokens.weight")
                     .to(dt.fl)
                     .index_select(0, input_ids.reshape({-1}))
                     .view({b, t, c.hidden_size});
  ReferenceMoeResult r;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    x = x + Attention(mc, p, l,
                      Norm(x, P(p, pre + "input_layernorm.weight"), c.rms_norm_eps, dt.fl), dt)
                .to(dt.fl);
    at::Tensor n2 = Norm(x, P(p, pre + "post_attention_layernorm.weight"), c.rms_norm_eps, dt.fl)
                        .view({b * t, c.hidden_size});
    at::Tensor y;
    if (mc.moe.IsMoeLayer(l)) {
      const size_t layer = static_cast<size_t>(l);
      if (layer < jitter.size() && jitter[layer].defined()) n2 = n2 * jitter[layer].to(dt.fl);
      at::Tensor logits;
      y = ReferenceMoeMlp(mc.moe, p, pre, n2, &logits, precision);
      r.router_logits.push_back(logits);
    } else {
      y = SwiGlu(p, pre + "mlp.", n2, dt.mm).to(dt.fl);
    }
    x = x + y.view({b, t, c.hidden_size});
  }
  at::Tensor normed = Norm(x, P(p, "model.norm.weight"), c.rms_norm_eps, dt.fl);
  at::Tensor head =
      c.tie_word_embeddings ? P(p, "model.embed_tokens.weight") : P(p, "lm_head.weight");
  r.logits = at::matmul(normed.to(dt.mm), head.to(dt.mm).t()).to(dt.fl);
  at::Tensor flat = r.logits.view({b * t, -1});
  at::Tensor flat_labels = labels.reshape({-1});
  at::Tensor mask = (flat_labels != -100).to(dt.fl);
  at::Tensor picked =
      at::log_softmax(flat, -1).gather(1, flat_labels.clamp_min(0).unsqueeze(1)).squeeze(1);
  r.ce_loss = -(picked * mask).sum() / mask.sum();
  r.aux_loss =
      ReferenceLoadBalancingLoss(r.router_logits, mc.moe.num_experts, mc.moe.num_experts_per_tok);
  r.loss = r.ce_loss + mc.moe.router_aux_loss_coef * r.aux_loss;
  return r;
}

}  // namespace megatrain::testing
