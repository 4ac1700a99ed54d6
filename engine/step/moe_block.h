// The executor's mixture-of-experts decoder layers (issue 17): a MoE layer
// is one block of the store and of the step plan like a dense layer
// (engine/model/moe_layout.h), streamed through the same weight slots, with
// the same gradient landing; only its math differs, and that lives here:
// forward without autograd, recomputation with autograd for the backward
// (activation checkpointing, as for dense layers), and the router's
// load-balancing loss.
//
// Note [Load-balancing loss across micro-batches]
// transformers adds router_aux_loss_coef * aux_m to the loss of every
// forward m (MixtralForCausalLM & co. when output_router_logits), where
// aux_m is load_balancing_loss_func over the router logits of every MoE
// layer of that micro-batch alone; its Trainer, with a model that takes
// num_items_in_batch (these do), does not divide a micro-batch's loss by
// the number of accumulation steps. The gradient of one optimizer step is
// therefore that of
//   objective = CE_sum / counted_tokens + router_aux_loss_coef * sum_m aux_m,
// and that is what the executor computes: micro-batch m's router
// statistics (LoadBalancingStats, moe_layers.h) are summed during its
// forward, and in its backward each MoE layer adds coef times its layer
// term (Note [Load-balancing loss in a streamed backward] in moe_layers.h),
// whose gradient is the exact gradient of coef * aux_m w.r.t. that layer's
// router logits. The statistics are per micro-batch, so any order of
// forwards and backwards that finishes micro-batch m's forward before its
// backward (the default schedule and the layer-major one) gives the same
// result. The reported aux loss is the mean of aux_m over the micro-batches
// (what transformers' `aux_loss` output is for one forward).
//
// Dimension legend: engine/model/layers.h and moe_layers.h.
// Thread-safety: used by the executor's enqueuing thread only. Streams:
// runs on the current (compute) stream.
#ifndef MEGATRAIN_ENGINE_STEP_MOE_BLOCK_H_
#define MEGATRAIN_ENGINE_STEP_MOE_BLOCK_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/model/layers.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_config.h"
#include "engine/model/moe_layers.h"
#include "engine/model/param_layout.h"

namespace megatrain::engine {

class MoeLayerRunner {
 public:
  // `config.moe` must be set. Builds the RoPE tables (YaRN included) and
  // each layer's attention mask for `seq_len` on `device`. The aux loss is
  // on when config.moe->output_router_logits (HF's switch). `noise_seed`
  // seeds mixtral's train-time router jitter (Note [Router jitter] in
  // moe_layers.h).
  MoeLayerRunner(const ModelConfig& config, int64_t seq_len, const at::Device& device,
                 uint64_t noise_seed);

  // Starts a pass over `micro_batches` micro-batches: forgets the router
  // statistics of the last one. `train`: a training pass (HF's
  // `self.training`), whose MoE layers draw router jitter keyed by
  // (noise_seed, step, first_micro_batch + micro-batch, layer) when
  // router_jitter_noise > 0 (`first_micro_batch`: the pass's place in a
  // data-parallel step's global batch, BatchShare in executor.h); evaluation
  // and logits passes (train false) never jitter.
  void BeginPass(int micro_batches, bool train, int64_t step, int64_t first_micro_batch = 0);

  // Forward of the decoder layer of `block` for micro-batch `micro_batch`
  // (its index in the pass: the jitter's key), no autograd: x [B, T, C]
  // fp32 -> [B, T, C] fp32. `flat` holds the
  // block in the compute dtype `cd`. Adds the layer's router statistics to
  // the micro-batch's when the aux loss is on. `docs`: the micro-batch's
  // documents, or null (Note [Document attention] in model/layers.h).
  at::Tensor Forward(int micro_batch, const BlockLayout& block, const at::Tensor& flat,
                     const at::Tensor& x, at::ScalarType cd, const PackedDocuments* docs = nullptr);

  // Activation checkpointing: recomputes the layer's forward from `input`
  // with autograd local to the layer and takes the gradient of
  // <y, grad_y> + router_aux_loss_coef * (the layer's aux term of
  // micro-batch `micro_batch`). Returns the gradients of the block's
  // parameters (BindBlockParams order; zeros for parameters the pass did
  // not reach) and, last, of `input`. Needs micro-batch `micro_batch`'s
  // whole forward first. The recomputation draws the forward's jitter again
  // (the same key: bit-identical).
  std::vector<at::Tensor> RecomputeAndBackward(int micro_batch, const BlockLayout& block,
                                               const at::Tensor& flat, const at::Tensor& input,
                                               const at::Tensor& grad_y, at::ScalarType cd,
                                               const PackedDocuments* docs = nullptr);

  // sum_m aux_m over the pass's micro-batches (Note [Load-balancing loss
  // across micro-batches]): [] fp64 on the device, 0 when the aux loss is
  // off. Read it once the pass's forwards are done.
  at::Tensor AuxLossSum() const;

  bool aux_loss_enabled() const { return aux_loss_; }
  double router_aux_loss_coef() const { return config_.moe.router_aux_loss_coef; }

 private:
  MoeModelConfig config_;
  bool aux_loss_ = false;
  at::Device device_;
  uint64_t noise_seed_ = 0;
  int64_t first_micro_batch_ = 0;  // of the current pass (BeginPass)
  bool train_ = false;             // of the current pass
  int64_t step_ = 0;               // of the current pass
  RopeCache rope_;
  std::vector<at::Tensor> masks_;                 // [L]: undefined or [T, T] bool
  std::vector<LoadBalancingStats> router_stats_;  // [micro-batches] of the pass

  // [B*T, C] fp32 jitter of `layer_idx` in `micro_batch` of this pass, or
  // undefined (not training, or router_jitter_noise 0).
  at::Tensor Jitter(int micro_batch, int64_t layer_idx, const at::Tensor& x) const;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_MOE_BLOCK_H_
