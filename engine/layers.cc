// Llama-family layer math (see layers.h for sources and precision rules).
#include "engine/layers.h"

#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "engine/torch_compat.h"

namespace megatrain::engine {
namespace {

// Inverse RoPE frequencies [Dh/2] fp32, with rope_scaling applied
// (HF modeling_rope_utils.py: _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters).
at::Tensor InverseFrequencies(const ModelConfig& c) {
  const int64_t dim = c.head_dim;
  at::Tensor inv_freq =
      1.0 / at::pow(c.rope_theta, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim);
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kLinear) return inv_freq / rs.factor;
  if (rs.type == RopeScalingType::kLlama3) {
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / rs.low_freq_factor;
    const double high_freq_wavelen = old_len / rs.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq);
    at::Tensor smooth = (old_len / wavelen - rs.low_freq_factor) /
                        (rs.high_freq_factor - rs.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    at::Tensor is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    return at::where(is_medium, smoothed, scaled);
  }
  return inv_freq;
}

// HF rotate_half: cat(-x2, x1) over the last dimension.
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B, heads, T, Dh]; cos, sin [T, Dh] fp32, cast to x's dtype as in HF.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor c = cos.to(x.scalar_type()).unsqueeze(0).unsqueeze(0);
  at::Tensor s = sin.to(x.scalar_type()).unsqueeze(0).unsqueeze(0);
  return x * c + RotateHalf(x) * s;
}

// HF repeat_kv: [B, KV, T, Dh] -> [B, KV*n_rep, T, Dh].
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

}  // namespace

RopeCache BuildRopeCache(const ModelConfig& config, int64_t seq_len, const at::Device& device) {
  at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat);  // [T]
  at::Tensor freqs = at::outer(positions, InverseFrequencies(config));   // [T, Dh/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                           // [T, Dh]
  return RopeCache{emb.cos().to(device), emb.sin().to(device)};
}

at::Tensor BuildAttentionMask(const ModelConfig& config, int64_t seq_len, const at::Device& device) {
  if (config.sliding_window <= 0 || config.sliding_window >= seq_len) return at::Tensor();
  // Query q attends to key k iff 0 <= q - k < sliding_window (HF
  // masking_utils sliding_window_overlay combined with causal).
  at::Tensor q = at::arange(seq_len, at::kLong).unsqueeze(1);
  at::Tensor k = at::arange(seq_len, at::kLong).unsqueeze(0);
  at::Tensor distance = q - k;
  return (distance >= 0).logical_and(distance < config.sliding_window).to(device);
}

std::vector<at::Tensor> DecoderLayerWeights::List() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor* t :
       {&input_layernorm, &q_proj, &q_bias, &k_proj, &k_bias, &v_proj, &v_bias, &o_proj, &o_bias,
        &q_norm, &k_norm, &post_attention_layernorm, &gate_proj, &up_proj, &down_proj}) {
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
  const std::pair<const char*, at::Tensor*> slots[] = {
      {"input_layernorm.weight", &w.input_layernorm},
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
  return w;
}

DecoderLayerWeights BindDecoderLayerWeights(const BlockLayout& block, const at::Tensor& flat) {
  return DecoderLayerWeightsFromParams(block, BindBlockParams(block, flat));
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
  return weight * normed;
}

at::Tensor DecoderLayerForward(const ModelConfig& c, const DecoderLayerWeights& w,
                               const at::Tensor& x, const RopeCache& rope,
                               const at::Tensor& attention_mask, at::ScalarType cd) {
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t h = c.num_attention_heads, kv = c.num_key_value_heads, dh = c.head_dim;

  // Attention block.
  at::Tensor n1 = RmsNorm(x, w.input_layernorm, c.rms_norm_eps).to(cd);        // [B, T, C]
  at::Tensor q = Linear(n1, w.q_proj, w.q_bias).view({b, t, h, dh});            // [B, T, H, Dh]
  at::Tensor k = Linear(n1, w.k_proj, w.k_bias).view({b, t, kv, dh});           // [B, T, KV, Dh]
  at::Tensor v = Linear(n1, w.v_proj, w.v_bias).view({b, t, kv, dh});
  if (c.qk_norm) {  // Qwen3: per-head RMSNorm over Dh before RoPE
    q = RmsNorm(q, w.q_norm, c.rms_norm_eps).to(cd);
    k = RmsNorm(k, w.k_norm, c.rms_norm_eps).to(cd);
  }
  q = ApplyRope(q.transpose(1, 2), rope.cos, rope.sin);                         // [B, H, T, Dh]
  k = ApplyRope(k.transpose(1, 2), rope.cos, rope.sin);                         // [B, KV, T, Dh]
  v = v.transpose(1, 2);
  k = RepeatKv(k, h / kv);                                                      // [B, H, T, Dh]
  v = RepeatKv(v, h / kv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  at::Tensor attn = compat::ScaledDotProductAttention(q, k, v, attention_mask,
                                                      /*is_causal=*/true, scale);  // [B, H, T, Dh]
  attn = attn.transpose(1, 2).reshape({b, t, h * dh});                           // [B, T, H*Dh]
  at::Tensor hidden = x + Linear(attn, w.o_proj, w.o_bias);                     // fp32 [B, T, C]

  // MLP block (SwiGLU).
  at::Tensor n2 = RmsNorm(hidden, w.post_attention_layernorm, c.rms_norm_eps).to(cd);
  at::Tensor gate = at::silu(at::linear(n2, w.gate_proj));                       // [B, T, F]
  at::Tensor mlp = at::linear(gate * at::linear(n2, w.up_proj), w.down_proj);    // [B, T, C]
  return hidden + mlp;
}

HeadResult HeadForwardBackward(const ModelConfig& c, const at::Tensor& hidden,
                               const at::Tensor& labels, const at::Tensor& norm_weight,
                               const at::Tensor& lm_head, double loss_scale, int64_t chunk_tokens,
                               at::ScalarType cd) {
  const int64_t rows = hidden.size(0) * hidden.size(1);
  const int64_t width = hidden.size(2);
  at::Tensor h_leaf = hidden.detach().requires_grad_(true);
  at::Tensor norm_leaf = norm_weight.detach().requires_grad_(true);
  at::Tensor normed = RmsNorm(h_leaf, norm_leaf, c.rms_norm_eps).to(cd).view({rows, width});
  at::Tensor normed_values = normed.detach();
  at::Tensor flat_labels = labels.reshape({rows});

  at::Tensor head_leaf = lm_head.detach().requires_grad_(true);
  at::Tensor grad_normed = at::empty_like(normed_values);                        // [B*T, C]
  // dW summed over chunks in fp32, rounded to the compute dtype once.
  at::Tensor grad_head = at::zeros(lm_head.sizes(), lm_head.options().dtype(at::kFloat));
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
  for (int64_t start = 0; start < rows; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, rows - start);
    at::Tensor x = normed_values.narrow(0, start, n).detach().requires_grad_(true);  // [N, C]
    at::Tensor logits = at::matmul(x, head_leaf.t()).to(at::kFloat);                // [N, V]
    at::Tensor loss = at::cross_entropy_loss(logits, flat_labels.narrow(0, start, n),
                                             /*weight=*/{}, at::Reduction::Sum,
                                             /*ignore_index=*/-100);
    auto grads = torch::autograd::grad({loss * loss_scale}, {x, head_leaf});
    grad_normed.narrow(0, start, n).copy_(grads[0]);
    grad_head.add_(grads[1]);
    loss_sum.add_(loss.detach());
  }
  auto grads = torch::autograd::grad({normed}, {h_leaf, norm_leaf}, {grad_normed});
  HeadResult out;
  out.loss_sum = loss_sum;
  out.grad_hidden = grads[0];
  out.grad_norm = grads[1];
  out.grad_lm_head = grad_head.to(cd);
  return out;
}

at::Tensor HeadLogits(const ModelConfig& c, const at::Tensor& hidden,
                      const at::Tensor& norm_weight, const at::Tensor& lm_head,
                      at::ScalarType cd) {
  at::Tensor normed = RmsNorm(hidden, norm_weight, c.rms_norm_eps).to(cd);  // [B, T, C]
  return at::matmul(normed, lm_head.t()).to(at::kFloat);                    // [B, T, V]
}

at::Tensor HeadLoss(const ModelConfig& c, const at::Tensor& hidden, const at::Tensor& labels,
                    const at::Tensor& norm_weight, const at::Tensor& lm_head,
                    int64_t chunk_tokens, at::ScalarType cd) {
  const int64_t rows = hidden.size(0) * hidden.size(1);
  at::Tensor normed = RmsNorm(hidden, norm_weight, c.rms_norm_eps).to(cd).view({rows, -1});
  at::Tensor flat_labels = labels.reshape({rows});
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
  for (int64_t start = 0; start < rows; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, rows - start);
    at::Tensor logits = at::matmul(normed.narrow(0, start, n), lm_head.t()).to(at::kFloat);
    loss_sum.add_(at::cross_entropy_loss(logits, flat_labels.narrow(0, start, n), {},
                                         at::Reduction::Sum, -100));
  }
  return loss_sum;
}

}  // namespace megatrain::engine
