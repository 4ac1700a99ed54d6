// MoE views of the parameter layout (see moe_layout.h); the blocks
// themselves are built by param_layout.cc.
#include "engine/model/moe_layout.h"

#include <memory>
#include <string>
#include <utility>

namespace megatrain::engine {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

BlockLayout MoeDecoderLayerBlock(const MoeModelConfig& config, int64_t layer_idx) {
  return DecoderLayerBlock(ModelConfigOf(config), layer_idx);
}

ModelLayout MoeModelLayout(const MoeModelConfig& config) {
  return ModelLayout::Create(ModelConfigOf(config));
}

std::vector<ParamSpec> MoeModelParams(const MoeModelConfig& config) {
  const ModelConfig& c = config.base;
  std::vector<ParamSpec> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParamSpec p;
    p.hf_name = name;
    p.local_name = std::move(name);
    p.numel = Numel(shape);
    p.shape = std::move(shape);
    out.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  const ModelConfig with_moe = ModelConfigOf(config);
  for (int64_t layer_idx = 0; layer_idx < c.num_hidden_layers; ++layer_idx) {
    for (ParamSpec& p : DecoderLayerBlock(with_moe, layer_idx).params) out.push_back(std::move(p));
  }
  add("model.norm.weight", {c.hidden_size});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, c.hidden_size});
  return out;
}

int64_t MoeActiveParamCount(const MoeModelConfig& config) {
  const MoeConfig& m = config.moe;
  int64_t n = 0;
  for (const ParamSpec& p : MoeModelParams(config)) {
    const bool expert = p.local_name.find("mlp.experts.") != std::string::npos;
    // An expert tensor is [E, ...]: a token uses k of its E slices.
    n += expert ? p.numel / m.num_experts * m.num_experts_per_tok : p.numel;
  }
  return n;
}

MoeModelConfig MoeModelConfigOf(const ModelConfig& config) {
  MoeModelConfig out;
  out.base = config;
  out.base.moe.reset();
  out.moe = *config.moe;
  return out;
}

ModelConfig ModelConfigOf(const MoeModelConfig& config) {
  ModelConfig out = config.base;
  out.moe = std::make_shared<const MoeConfig>(config.moe);
  return out;
}

}  // namespace megatrain::engine
