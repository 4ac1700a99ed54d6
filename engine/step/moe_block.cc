// The executor's MoE decoder layers (see moe_block.h).
#include "engine/step/moe_block.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <utility>

#include "engine/model/moe_layout.h"

namespace megatrain::engine {

MoeLayerRunner::MoeLayerRunner(const ModelConfig& config, int64_t seq_len, const at::Device& device,
                               uint64_t noise_seed)
    : config_(MoeModelConfigOf(config)),
      aux_loss_(config.moe->output_router_logits),
      device_(device),
      noise_seed_(noise_seed),
      rope_(BuildMoeRopeCache(config_, seq_len, device)) {
  for (int64_t layer_idx = 0; layer_idx < config_.base.num_hidden_layers; ++layer_idx) {
    masks_.push_back(BuildMoeLayerAttentionMask(config_, layer_idx, seq_len, device));
  }
}

void MoeLayerRunner::BeginPass(int micro_batches, bool train, int64_t step,
                               int64_t first_micro_batch) {
  router_stats_.assign(static_cast<size_t>(micro_batches), LoadBalancingStats());
  train_ = train;
  step_ = step;
  first_micro_batch_ = first_micro_batch;
}

at::Tensor MoeLayerRunner::Jitter(int micro_batch, int64_t layer_idx, const at::Tensor& x) const {
  if (!train_ || !(config_.moe.router_jitter_noise > 0)) return at::Tensor();
  // Note [Router jitter]: a function of the key alone, so the recompute
  // draws the forward's values whatever ran in between.
  return MakeRouterJitter(
      config_.moe, x.size(0) * x.size(1), x.size(2),
      RouterJitterKey(noise_seed_, step_, first_micro_batch_ + micro_batch, layer_idx), device_);
}

at::Tensor MoeLayerRunner::Forward(int micro_batch, const BlockLayout& block,
                                   const at::Tensor& flat, const at::Tensor& x, at::ScalarType cd,
                                   const PackedDocuments* docs) {
  at::NoGradGuard no_grad;
  const int64_t layer_idx = block.layer_idx;
  MoeLayerOutput out = MoeDecoderLayerForward(
      config_, layer_idx, BindMoeDecoderLayerWeights(block, flat), x, rope_,
      masks_[static_cast<size_t>(layer_idx)], Jitter(micro_batch, layer_idx, x), cd, docs);
  if (aux_loss_ && out.router_logits.defined()) {
    AccumulateLoadBalancing(config_.moe, out.router_logits,
                            &router_stats_[static_cast<size_t>(micro_batch)]);
  }
  return out.hidden;
}

std::vector<at::Tensor> MoeLayerRunner::RecomputeAndBackward(
    int micro_batch, const BlockLayout& block, const at::Tensor& flat, const at::Tensor& input,
    const at::Tensor& grad_y, at::ScalarType cd, const PackedDocuments* docs) {
  std::vector<at::Tensor> inputs;  // the parameters' leaves, then the input's
  for (const at::Tensor& p : BindBlockParams(block, flat)) {
    inputs.push_back(p.detach().requires_grad_(true));
  }
  const std::vector<at::Tensor> leaves = inputs;
  at::Tensor x_leaf = input.detach().requires_grad_(true);
  inputs.push_back(x_leaf);
  const int64_t layer_idx = block.layer_idx;
  MoeLayerOutput out = MoeDecoderLayerForward(
      config_, layer_idx, MoeDecoderLayerWeightsFromParams(block, leaves), x_leaf, rope_,
      masks_[static_cast<size_t>(layer_idx)], Jitter(micro_batch, layer_idx, input), cd, docs);
  std::vector<at::Tensor> outputs = {out.hidden};
  std::vector<at::Tensor> grad_outputs = {grad_y};
  const LoadBalancingStats& stats = router_stats_[static_cast<size_t>(micro_batch)];
  if (aux_loss_ && out.router_logits.defined() && stats.num_rows > 0) {
    // Note [Load-balancing loss across micro-batches]: d(coef * aux_m).
    at::Tensor term = LoadBalancingLayerTerm(config_.moe, out.router_logits, stats);  // [] fp32
    outputs.push_back(term);
    grad_outputs.push_back(at::full({}, config_.moe.router_aux_loss_coef, term.options()));
  }
  std::vector<at::Tensor> grads = torch::autograd::grad(outputs, inputs, grad_outputs,
                                                        /*retain_graph=*/false,
                                                        /*create_graph=*/false,
                                                        /*allow_unused=*/true);
  // A parameter no path reached (e.g. an expert's bias when no token chose
  // the expert, under the per-expert loop) has a zero gradient.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(inputs[i]);
  }
  return grads;
}

at::Tensor MoeLayerRunner::AuxLossSum() const {
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  if (!aux_loss_) return sum;
  for (const LoadBalancingStats& stats : router_stats_) {
    if (stats.num_rows == 0) continue;
    sum.add_(LoadBalancingLoss(config_.moe, stats).to(at::kDouble));
  }
  return sum;
}

}  // namespace megatrain::engine
