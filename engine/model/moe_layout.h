// The parameter layout of the mixture-of-experts families: which tensors
// one decoder layer of a MoE model holds, by HF (transformers 5 in-memory)
// name, and how many parameters a token activates.
//
// A MoE decoder layer is one block of the host store and of the executor,
// like a dense layer (param_layout.h: aligned offsets, HF names, PyTorch
// shapes); its experts are two fused 3-D tensors (ExpertLayout in
// moe_config.h). param_layout.cc builds every block, dense and MoE
// (DecoderLayerBlock, ModelLayout::Create for a config with `moe` set), so
// the store, checkpoints, admission and the executor see one layout; the
// functions here are views of it for a MoeModelConfig. This file depends on
// param_layout, never the reverse.
//
// Thread-safety: stateless functions; safe to call concurrently.
#ifndef MEGATRAIN_ENGINE_MODEL_MOE_LAYOUT_H_
#define MEGATRAIN_ENGINE_MODEL_MOE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/moe_config.h"
#include "engine/model/param_layout.h"

namespace megatrain::engine {

// The block of decoder layer `layer_idx` (kind kDecoderLayer): attention
// and norms as ModelLayout's dense layers, then `self_attn.sinks` [H]
// (gpt_oss), then the MLP: a dense SwiGLU (`mlp.gate_proj.weight` ...) for
// qwen2/3_moe's dense layers, else the router (`mlp.gate.weight` [E, C], or
// gpt_oss `mlp.router.weight` [E, C] + `mlp.router.bias` [E]), the fused
// experts (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`, gpt_oss
// biases `..._bias`), and qwen2_moe's shared expert
// (`mlp.shared_expert.{gate,up,down}_proj.weight`,
// `mlp.shared_expert_gate.weight` [1, C]). Offsets are aligned as
// ModelLayout's (kParamAlignElements). DecoderLayerBlock of
// ModelConfigOf(config).
BlockLayout MoeDecoderLayerBlock(const MoeModelConfig& config, int64_t layer_idx);

// The model's streaming blocks for the host store and the executor:
// embedding and head blocks as ModelLayout::Create(config.base) makes them,
// decoder layers as MoeDecoderLayerBlock (mixed shapes for qwen2/3_moe):
// ModelLayout::Create(ModelConfigOf(config)).
ModelLayout MoeModelLayout(const MoeModelConfig& config);

// Every parameter of the model in HF order (embedding, layers, final norm,
// lm_head unless tied), with hf_name and shape set.
std::vector<ParamSpec> MoeModelParams(const MoeModelConfig& config);

// Parameters one token activates: everything but the experts, plus
// num_experts_per_tok experts' weights (and biases) per MoE layer. The
// embedding and lm_head are counted as in ModelConfig::ParamCount.
int64_t MoeActiveParamCount(const MoeModelConfig& config);

// The MoE view of a ModelConfig with `moe` set (precondition): base is a
// copy without `moe`.
MoeModelConfig MoeModelConfigOf(const ModelConfig& config);

// The ModelConfig of a MoE model: config.base with `moe` pointing to a copy
// of config.moe.
ModelConfig ModelConfigOf(const MoeModelConfig& config);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_MOE_LAYOUT_H_
