// MoE layer math (see moe_layers.h for sources, precision and the notes).
#include "engine/model/moe_layers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

// RoPE is ApplyRotaryEmbedding (layers.h), computed in fp32 and rounded to
// x's dtype once as the dense layers do (Note [RoPE precision] in
// layers.cc: HF's cos and sin are fp32 under autocast with fp32 weights,
// so q * cos promotes to fp32). Rounding cos, sin and each product to bf16
// instead added three roundings per element: gpt_oss's bf16 gradients were
// 0.13-0.15 (norm-relative) from the bf16 reference's on the parity
// weights at init range 0.2, 0.01 with this (Note [MoE bf16 parity] in
// tests/engine/step/moe_executor_test.cc).

// HF repeat_kv: [B, KV, T, Dh] -> [B, KV*n_rep, T, Dh].
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

// GPT-OSS eager_attention_forward: softmax over [scores, sink_h] per row,
// the sink's column dropped before PV. q, k, v [B, H, T, Dh]; sinks [H];
// mask boolean [T, T] or undefined (causal). Scores and softmax in fp32.
at::Tensor AttentionWithSinks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& sinks, const at::Tensor& mask, double scale) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), s = k.size(2);
  at::Tensor scores =
      at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * scale;  // [B, H, T, S]
  at::Tensor allowed =
      mask.defined() ? mask : at::ones({t, s}, q.options().dtype(at::kBool)).tril();
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor sink = sinks.to(at::kFloat).view({1, h, 1, 1}).expand({b, h, t, 1});
  at::Tensor combined = at::cat({scores, sink}, -1);  // [B, H, T, S+1]
  // HF subtracts the row max (softmax is shift-invariant; it only avoids
  // overflow); the max carries no gradient through the softmax.
  combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true)).detach();
  at::Tensor probs = at::softmax(combined, -1).narrow(-1, 0, s).to(q.scalar_type());
  return at::matmul(probs, v);
}

// The attention half of a decoder layer: x + o_proj(attn(...)). x [B, T, C]
// fp32 -> [B, T, C] fp32.
at::Tensor AttentionBlock(const MoeModelConfig& config, int64_t layer_idx,
                          const MoeDecoderLayerWeights& w, const at::Tensor& x,
                          const RopeCache& rope, const at::Tensor& mask, at::ScalarType cd,
                          const PackedDocuments* docs) {
  const ModelConfig& c = config.base;
  const DecoderLayerWeights& d = w.dense;
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;
  at::Tensor n1 = RmsNorm(x, d.input_layernorm.to(at::kFloat), c.rms_norm_eps).to(cd);
  // mixtral and qwen2/3_moe attend as their dense families do (one
  // implementation, layers.cc); config.base.layer_types marks the sliding
  // layers (ParseMoeHfConfig). Only gpt_oss's sinks need the softmax below.
  if (!w.sinks.defined()) {
    return x + DecoderAttention(c, d, n1, rope, mask, cd, docs).to(at::kFloat);
  }
  at::Tensor q = Linear(n1, d.q_proj, d.q_bias).view({b, t, h, dh});
  at::Tensor k = Linear(n1, d.k_proj, d.k_bias).view({b, t, kv, dh});
  at::Tensor v = Linear(n1, d.v_proj, d.v_bias).view({b, t, kv, dh});
  if (c.qk_norm) {  // Qwen3: per-head RMSNorm over Dh before RoPE
    q = RmsNorm(q, d.q_norm.to(at::kFloat), c.rms_norm_eps).to(cd);
    k = RmsNorm(k, d.k_norm.to(at::kFloat), c.rms_norm_eps).to(cd);
  }
  at::Tensor cos = rope.cos, sin = rope.sin;  // [T, Dh]
  at::Tensor allowed = mask;
  if (docs != nullptr) {  // Note [Document attention]: [B, T, Dh], [B, 1, T, T]
    cos = RopeAtPositions(cos, docs->position_ids);
    sin = RopeAtPositions(sin, docs->position_ids);
    allowed = DocumentAttentionMask(
        *docs, config.moe.layer_sliding_window[static_cast<size_t>(layer_idx)]);
  }
  q = ApplyRotaryEmbedding(q, cos, sin).transpose(1, 2);  // [B, H, T, Dh]
  k = RepeatKv(ApplyRotaryEmbedding(k, cos, sin).transpose(1, 2), h / kv);
  v = RepeatKv(v.transpose(1, 2), h / kv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  at::Tensor attn = AttentionWithSinks(q, k, v, w.sinks, allowed, scale);  // [B, H, T, Dh]
  attn = attn.transpose(1, 2).reshape({b, t, h * dh});
  return x + Linear(attn, d.o_proj, d.o_bias).to(at::kFloat);
}

}  // namespace

RopeCache BuildMoeRopeCache(const MoeModelConfig& config, int64_t seq_len,
                            const at::Device& device) {
  const YarnRope& y = config.moe.yarn;
  if (!y.enabled) return BuildRopeCache(config.base, seq_len, device);
  const ModelConfig& c = config.base;
  const int64_t dim = c.head_dim;
  const double base = c.rope_theta;
  // HF _compute_yarn_parameters, with the same fp32 tensor arithmetic.
  auto mscale_of = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  double attention_factor = y.attention_factor;
  if (attention_factor == 0.0) {
    attention_factor = (y.mscale != 0 && y.mscale_all_dim != 0)
                           ? mscale_of(y.factor, y.mscale) / mscale_of(y.factor, y.mscale_all_dim)
                           : mscale_of(y.factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(y.original_max_position_embeddings / (rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a singular ramp
  at::Tensor pos_freqs =
      at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  at::Tensor extrapolation = 1.0 / pos_freqs;
  at::Tensor interpolation = 1.0 / (y.factor * pos_freqs);
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  at::Tensor inv_freq =
      interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat);
  at::Tensor freqs = at::outer(positions, inv_freq);  // [T, Dh/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);       // [T, Dh]
  return RopeCache{(emb.cos() * attention_factor).to(device),
                   (emb.sin() * attention_factor).to(device)};
}

at::Tensor BuildMoeLayerAttentionMask(const MoeModelConfig& config, int64_t layer_idx,
                                      int64_t seq_len, const at::Device& device) {
  ModelConfig c = config.base;
  c.sliding_window = config.moe.layer_sliding_window[static_cast<size_t>(layer_idx)];
  return BuildAttentionMask(c, seq_len, device);
}

MoeDecoderLayerWeights MoeDecoderLayerWeightsFromParams(const BlockLayout& block,
                                                        const std::vector<at::Tensor>& params) {
  MoeDecoderLayerWeights w;
  w.dense = DecoderLayerWeightsFromParams(block, params);
  MoeMlpWeights& m = w.moe;
  const std::pair<const char*, at::Tensor*> slots[] = {
      {"self_attn.sinks", &w.sinks},
      {"mlp.gate.weight", &m.router},
      {"mlp.router.weight", &m.router},
      {"mlp.router.bias", &m.router_bias},
      {"mlp.experts.gate_up_proj", &m.gate_up_proj},
      {"mlp.experts.gate_up_proj_bias", &m.gate_up_proj_bias},
      {"mlp.experts.down_proj", &m.down_proj},
      {"mlp.experts.down_proj_bias", &m.down_proj_bias},
      {"mlp.shared_expert.gate_proj.weight", &m.shared_gate_proj},
      {"mlp.shared_expert.up_proj.weight", &m.shared_up_proj},
      {"mlp.shared_expert.down_proj.weight", &m.shared_down_proj},
      {"mlp.shared_expert_gate.weight", &m.shared_expert_gate},
  };
  for (size_t i = 0; i < block.params.size(); ++i) {
    for (const auto& [name, slot] : slots) {
      if (block.params[i].local_name == name) *slot = params[i];
    }
  }
  w.is_moe = m.router.defined();
  return w;
}

MoeDecoderLayerWeights BindMoeDecoderLayerWeights(const BlockLayout& block,
                                                  const at::Tensor& flat) {
  return MoeDecoderLayerWeightsFromParams(block, BindBlockParams(block, flat));
}

RouterOutput Route(const MoeConfig& config, const MoeMlpWeights& w, const at::Tensor& x) {
  const int64_t k = config.num_experts_per_tok;
  RouterOutput out;
  out.logits = Linear(x.to(at::kFloat), w.router.to(at::kFloat),
                      w.router_bias.defined() ? w.router_bias.to(at::kFloat) : at::Tensor());
  if (config.router_type == RouterType::kTopKSoftmax) {
    auto [top_logits, index] = at::topk(out.logits, k, -1);  // [N, k]
    out.topk_weight = at::softmax(top_logits, -1);
    out.topk_index = index;
    return out;
  }
  at::Tensor probs = at::softmax(out.logits, -1);  // [N, E] fp32
  auto [top_probs, index] = at::topk(probs, k, -1);
  out.topk_weight =
      config.norm_topk_prob ? top_probs / top_probs.sum(-1, /*keepdim=*/true) : top_probs;
  out.topk_index = index;
  return out;
}

ExpertDispatch SortByExpert(const at::Tensor& topk_index, int64_t num_experts) {
  const int64_t k = topk_index.size(1);
  at::Tensor flat = topk_index.reshape({-1});  // [M]
  ExpertDispatch d;
  d.sorted_slot = std::get<1>(at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  d.sorted_token = at::floor_divide(d.sorted_slot, k);
  d.inverse = at::empty_like(d.sorted_slot);
  d.inverse.index_put_({d.sorted_slot}, at::arange(flat.size(0), flat.options()));
  at::Tensor counts = at::bincount(flat, /*weights=*/{}, /*minlength=*/num_experts);  // [E]
  d.offsets = counts.cumsum(0).to(at::kInt);
  at::Tensor host = counts.to(at::kCPU, at::kLong).contiguous();
  d.tokens_per_expert.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + num_experts);
  return d;
}

at::Tensor ExpertsForward(const MoeConfig& config, const MoeMlpWeights& w,
                          const at::Tensor& x_sorted, const ExpertDispatch& dispatch) {
  const int64_t fe = config.moe_intermediate_size;
  const auto& rows = dispatch.tokens_per_expert;
  if (config.expert_layout == ExpertLayout::kGateUpRows) {
    // gate_up_proj [E, 2Fe, C] is nn.Linear per expert: x @ W^T.
    at::Tensor h = compat::GroupedMm(x_sorted, w.gate_up_proj.transpose(1, 2), dispatch.offsets,
                                     rows);                               // [M, 2Fe]
    at::Tensor act = at::silu(h.narrow(1, 0, fe)) * h.narrow(1, fe, fe);  // [M, Fe]
    return compat::GroupedMm(act, w.down_proj.transpose(1, 2), dispatch.offsets, rows);
  }
  // gpt_oss: gate_up_proj [E, C, 2Fe] in x @ W form, gate/up interleaved.
  at::Tensor expert_of_row =
      at::repeat_interleave(at::arange(config.num_experts, x_sorted.options().dtype(at::kLong)),
                            at::tensor(rows, at::kLong).to(x_sorted.device()));  // [M]
  at::Tensor h = compat::GroupedMm(x_sorted, w.gate_up_proj, dispatch.offsets, rows) +
                 w.gate_up_proj_bias.index_select(0, expert_of_row);  // [M, 2Fe]
  const double limit = config.swiglu_limit;
  at::Tensor gate = h.slice(1, 0, 2 * fe, 2).clamp_max(limit);
  at::Tensor up = h.slice(1, 1, 2 * fe, 2).clamp(-limit, limit);
  at::Tensor glu = gate * at::sigmoid(gate * config.swiglu_alpha);
  at::Tensor act = (up + 1) * glu;  // [M, Fe]
  return compat::GroupedMm(act, w.down_proj, dispatch.offsets, rows) +
         w.down_proj_bias.index_select(0, expert_of_row);
}

namespace {

// SplitMix64's finaliser (Steele, Lea, Flood, OOPSLA 2014).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr int64_t kMask32 = 0xffffffffLL;

// x * c mod 2^32 for x in [0, 2^32) int64 and c in [0, 2^32): the low and
// high 16 bits of x separately, so no product reaches 2^63.
at::Tensor MulMod32(const at::Tensor& x, int64_t c) {
  at::Tensor lo = x.bitwise_and(0xffff).mul_(c);  // < 2^48
  at::Tensor hi = at::bitwise_right_shift(x, 16).mul_(c & 0xffff).bitwise_and_(0xffff);
  return lo.add_(hi.mul_(0x10000)).bitwise_and_(kMask32);
}

// lowbias32 (Note [Router jitter]) on int64 values in [0, 2^32).
at::Tensor LowBias32(at::Tensor x) {
  x = x.bitwise_xor(at::bitwise_right_shift(x, 16));
  x = MulMod32(x, 0x7feb352d);
  x = x.bitwise_xor(at::bitwise_right_shift(x, 15));
  x = MulMod32(x, 0x846ca68bLL);
  return x.bitwise_xor(at::bitwise_right_shift(x, 16));
}

constexpr int64_t kJitterChunkElements = int64_t{1} << 22;

}  // namespace

uint64_t RouterJitterKey(uint64_t seed, int64_t step, int64_t micro_batch, int64_t layer_idx) {
  uint64_t key = SplitMix64(seed);
  key = SplitMix64(key ^ static_cast<uint64_t>(step));
  key = SplitMix64(key ^ static_cast<uint64_t>(micro_batch));
  return SplitMix64(key ^ static_cast<uint64_t>(layer_idx));
}

at::Tensor MakeRouterJitter(const MoeConfig& config, int64_t num_tokens, int64_t hidden,
                            uint64_t key, const at::Device& device) {
  const double eps = config.router_jitter_noise;
  if (!(eps > 0)) return at::Tensor();
  const int64_t key_lo = static_cast<int64_t>(key & 0xffffffffULL);
  const int64_t key_hi = static_cast<int64_t>(key >> 32);
  const float low = static_cast<float>(1.0 - eps);
  const float scale = static_cast<float>(2.0 * eps) * (1.0f / 16777216.0f);  // exact: / 2^24
  at::Tensor out =
      at::empty({num_tokens, hidden}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor flat = out.view({-1});
  const at::TensorOptions i64 = at::TensorOptions().dtype(at::kLong).device(device);
  for (int64_t start = 0; start < flat.numel(); start += kJitterChunkElements) {
    const int64_t len = std::min(kJitterChunkElements, flat.numel() - start);
    at::Tensor i = at::arange(start, start + len, i64);  // element index n*C + c
    at::Tensor x = LowBias32(i.bitwise_and(kMask32).bitwise_xor_(key_lo));
    x = x.bitwise_xor_(at::bitwise_right_shift(i, 32).add_(key_hi).bitwise_and_(kMask32));
    x = LowBias32(x);
    // u * 2 eps as one fp32 product (scale is 2 eps rounded, times 2^-24),
    // then + (1 - eps): two separate kernels, no fused multiply-add.
    flat.narrow(0, start, len)
        .copy_(at::bitwise_right_shift(x, 8).to(at::kFloat).mul_(scale).add_(low));
  }
  return out;
}

at::Tensor MoeMlpForward(const MoeConfig& config, const MoeMlpWeights& w, const at::Tensor& x,
                         const at::Tensor& jitter, at::ScalarType cd, RouterOutput* router) {
  const int64_t n = x.size(0), k = config.num_experts_per_tok;
  at::Tensor input = jitter.defined() ? x.to(at::kFloat) * jitter : x;  // [N, C]
  RouterOutput r = Route(config, w, input);
  ExpertDispatch d = SortByExpert(r.topk_index, config.num_experts);
  at::Tensor x_sorted = input.to(cd).index_select(0, d.sorted_token);  // [M, C]
  at::Tensor y_sorted = ExpertsForward(config, w, x_sorted, d).to(at::kFloat);
  at::Tensor weight_sorted = r.topk_weight.reshape({-1}).index_select(0, d.sorted_slot);
  at::Tensor y = (y_sorted * weight_sorted.unsqueeze(1))
                     .index_select(0, d.inverse)
                     .view({n, k, -1});  // [N, k, C] slot order
  at::Tensor out = y.select(1, 0);
  for (int64_t j = 1; j < k; ++j) out = out + y.select(1, j);  // fixed order
  if (w.shared_gate_proj.defined()) {
    at::Tensor shared = GatedMlp(input.to(cd), w.shared_gate_proj, w.shared_up_proj,
                                 w.shared_down_proj, MlpActivation::kSilu)
                            .to(at::kFloat);  // [N, C]; Note [Chunked MLP]
    at::Tensor gate = at::sigmoid(
        at::linear(input.to(at::kFloat), w.shared_expert_gate.to(at::kFloat)));  // [N, 1]
    out = out + gate * shared;
  }
  if (router != nullptr) *router = std::move(r);
  return out;
}

MoeLayerOutput MoeDecoderLayerForward(const MoeModelConfig& config, int64_t layer_idx,
                                      const MoeDecoderLayerWeights& w, const at::Tensor& x,
                                      const RopeCache& rope, const at::Tensor& mask,
                                      const at::Tensor& jitter, at::ScalarType cd,
                                      const PackedDocuments* documents) {
  const ModelConfig& c = config.base;
  const int64_t b = x.size(0), t = x.size(1), hidden = x.size(2);
  at::Tensor h =
      AttentionBlock(config, layer_idx, w, x, rope, mask, cd, documents);  // [B, T, C] fp32
  at::Tensor n2 = RmsNorm(h, w.dense.post_attention_layernorm.to(at::kFloat), c.rms_norm_eps)
                      .view({b * t, hidden});  // [N, C] fp32
  MoeLayerOutput out;
  if (!w.is_moe) {
    at::Tensor mlp = GatedMlp(n2.to(cd), w.dense.gate_proj, w.dense.up_proj, w.dense.down_proj,
                              MlpActivation::kSilu);  // Note [Chunked MLP]
    out.hidden = h + mlp.to(at::kFloat).view({b, t, hidden});
    return out;
  }
  RouterOutput r;
  at::Tensor mlp = MoeMlpForward(config.moe, w.moe, n2, jitter, cd, &r);  // [N, C] fp32
  out.hidden = h + mlp.view({b, t, hidden});
  out.router_logits = r.logits;
  return out;
}

void AccumulateLoadBalancing(const MoeConfig& config, const at::Tensor& router_logits,
                             LoadBalancingStats* stats) {
  at::Tensor logits = router_logits.detach().to(at::kFloat);  // [N, E]
  at::Tensor probs = at::softmax(logits, -1);
  at::Tensor index = std::get<1>(at::topk(probs, config.num_experts_per_tok, -1));
  at::Tensor counts =
      at::bincount(index.reshape({-1}), {}, config.num_experts).to(at::kFloat);  // [E]
  at::Tensor sums = probs.sum(0);                                                // [E]
  if (!stats->expert_counts.defined()) {
    stats->expert_counts = counts;
    stats->prob_sums = sums;
  } else {
    stats->expert_counts = stats->expert_counts + counts;
    stats->prob_sums = stats->prob_sums + sums;
  }
  stats->num_rows += logits.size(0);
}

at::Tensor LoadBalancingLoss(const MoeConfig& config, const LoadBalancingStats& stats) {
  if (stats.num_rows == 0) return at::zeros({}, at::kFloat);
  const double rows = static_cast<double>(stats.num_rows);
  return (stats.expert_counts / rows * (stats.prob_sums / rows)).sum() *
         static_cast<double>(config.num_experts);
}

at::Tensor LoadBalancingLayerTerm(const MoeConfig& config, const at::Tensor& router_logits,
                                  const LoadBalancingStats& stats) {
  const double rows = static_cast<double>(stats.num_rows);
  at::Tensor probs = at::softmax(router_logits.to(at::kFloat), -1);  // [N, E]
  return (stats.expert_counts / rows * (probs.sum(0) / rows)).sum() *
         static_cast<double>(config.num_experts);
}

}  // namespace megatrain::engine
