// A monolithic LibTorch autograd implementation of the MoE families
// (mixtral, qwen2_moe, qwen3_moe, gpt_oss), written independently of
// engine/model/moe_layers.cc the way transformers computes them: routing weights
// and experts by a loop over experts with index_add_ (no sorting), explicit
// attention matrices with the sink column appended, RoPE (YaRN included) in
// double precision, GQA by head index. The numerical reference for the MoE
// engine paths; checked itself against transformers' golden files.
#ifndef MEGATRAIN_TESTS_TESTING_REFERENCE_MOE_H_
#define MEGATRAIN_TESTS_TESTING_REFERENCE_MOE_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "engine/formats/hf_moe_names.h"
#include "engine/model/moe_config.h"

namespace megatrain::testing {

// Arithmetic of the reference. Note [MoE reference precision]: kFp32 is
// explicit fp32 math throughout (the parity reference); kFp64 the same
// math in double on the same (fp32 or bf16-rounded) weights, the "exact"
// model against which both bf16 implementations are measured; kBf16 what
// torch.autocast(bfloat16) does with fp32 weights: every matmul (attention
// projections, scores' PV, experts, shared expert, LM head) on bf16
// operands with a bf16 result, while the residual stream, RMSNorm, RoPE,
// softmax statistics, routers (and the shared-expert gate), the routing
// weights, the combine and the losses stay fp32 (issue 17: routers and
// norms are fp32 in every compute dtype).
enum class ReferencePrecision { kFp32, kFp64, kBf16 };

// Result of one forward pass, differentiable w.r.t. the parameters.
struct ReferenceMoeResult {
  at::Tensor logits;                      // [B, T, V] fp32
  at::Tensor ce_loss;                     // [] mean token cross-entropy (labels != -100)
  at::Tensor aux_loss;                    // [] HF load_balancing_loss_func
  at::Tensor loss;                        // [] ce_loss + router_aux_loss_coef * aux_loss
  std::vector<at::Tensor> router_logits;  // per MoE layer, [B*T, E] fp32
};

// fp32 forward of the model on input_ids [B, T] int64 with labels [B, T]
// int64 (already shifted, -100 ignored). `params` by HF in-memory name
// (engine::MoeModelParams), fp32 leaves. With kFp64 the result tensors are
// fp64 (the leaves' gradients stay fp32). `jitter` (empty, or one entry
// per decoder layer, undefined for none): mixtral's train-time
// router_jitter_noise multiplier of that layer, [B*T, C] fp32, by which the
// MoE block's input is multiplied before router and experts (HF
// MixtralSparseMoeBlock.forward's `hidden_states *= ...uniform_(...)`).
ReferenceMoeResult ReferenceMoeForward(const engine::MoeModelConfig& config,
                                       const engine::MoeTensorMap& params,
                                       const at::Tensor& input_ids, const at::Tensor& labels,
                                       ReferencePrecision precision = ReferencePrecision::kFp32,
                                       const std::vector<at::Tensor>& jitter = {});

// One MoE MLP as transformers computes it (router, then a loop over experts
// with index_add_), on x [N, C] fp32; `prefix` is "model.layers.<i>.".
// Stores the router logits [N, E] in *router_logits.
at::Tensor ReferenceMoeMlp(const engine::MoeConfig& config, const engine::MoeTensorMap& params,
                           const std::string& prefix, const at::Tensor& x,
                           at::Tensor* router_logits,
                           ReferencePrecision precision = ReferencePrecision::kFp32);

// transformers' load_balancing_loss_func without attention mask: the
// logits of every layer concatenated, softmax, top-k one-hot, E * sum over
// (k, E) of mean(one_hot) * mean(probs).
at::Tensor ReferenceLoadBalancingLoss(const std::vector<at::Tensor>& router_logits,
                                      int64_t num_experts, int64_t top_k);

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_REFERENCE_MOE_H_
