// MoE parameter layout (see moe_layout.h).
#include "engine/model/moe_layout.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

int64_t AlignUp(int64_t n, int64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Appends parameters with aligned offsets (as param_layout.cc does).
class MoeBlockBuilder {
 public:
  explicit MoeBlockBuilder(int64_t layer_idx)
      : prefix_(absl::StrCat("model.layers.", layer_idx, ".")) {
    block_.kind = BlockKind::kDecoderLayer;
    block_.layer_idx = layer_idx;
  }
  void Add(std::string local_name, std::vector<int64_t> shape, bool is_norm = false,
           bool is_bias = false) {
    ParamSpec p;
    p.hf_name = absl::StrCat(prefix_, local_name);
    p.local_name = std::move(local_name);
    p.numel = Numel(shape);
    p.shape = std::move(shape);
    p.offset = block_.numel;
    p.is_norm = is_norm;
    p.is_bias = is_bias;
    block_.numel = AlignUp(block_.numel + p.numel, kParamAlignElements);
    block_.params.push_back(std::move(p));
  }
  BlockLayout Build() { return std::move(block_); }

 private:
  std::string prefix_;
  BlockLayout block_;
};

void AddAttention(const ModelConfig& c, const MoeConfig& m, MoeBlockBuilder* b) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  b->Add("input_layernorm.weight", {c.hidden_size}, /*is_norm=*/true);
  b->Add("self_attn.q_proj.weight", {q_dim, c.hidden_size});
  if (c.HasQkvBias()) b->Add("self_attn.q_proj.bias", {q_dim}, false, /*is_bias=*/true);
  b->Add("self_attn.k_proj.weight", {kv_dim, c.hidden_size});
  if (c.HasQkvBias()) b->Add("self_attn.k_proj.bias", {kv_dim}, false, true);
  b->Add("self_attn.v_proj.weight", {kv_dim, c.hidden_size});
  if (c.HasQkvBias()) b->Add("self_attn.v_proj.bias", {kv_dim}, false, true);
  b->Add("self_attn.o_proj.weight", {c.hidden_size, q_dim});
  if (c.HasOutputBias()) b->Add("self_attn.o_proj.bias", {c.hidden_size}, false, true);
  if (c.qk_norm) {
    b->Add("self_attn.q_norm.weight", {c.head_dim}, true);
    b->Add("self_attn.k_norm.weight", {c.head_dim}, true);
  }
  // Sinks are logits (HF initialises them with normal_), neither norm nor bias.
  if (m.attention_sinks) b->Add("self_attn.sinks", {c.num_attention_heads});
  b->Add("post_attention_layernorm.weight", {c.hidden_size}, true);
}

}  // namespace

BlockLayout MoeDecoderLayerBlock(const MoeModelConfig& config, int64_t layer_idx) {
  const ModelConfig& c = config.base;
  const MoeConfig& m = config.moe;
  const int64_t hidden = c.hidden_size, e = m.num_experts, fe = m.moe_intermediate_size;
  MoeBlockBuilder b(layer_idx);
  AddAttention(c, m, &b);
  if (!m.IsMoeLayer(layer_idx)) {
    b.Add("mlp.gate_proj.weight", {c.intermediate_size, hidden});
    b.Add("mlp.up_proj.weight", {c.intermediate_size, hidden});
    b.Add("mlp.down_proj.weight", {hidden, c.intermediate_size});
    return b.Build();
  }
  if (m.expert_layout == ExpertLayout::kInterleavedColumns) {
    b.Add("mlp.router.weight", {e, hidden});
    b.Add("mlp.router.bias", {e}, false, true);
    b.Add("mlp.experts.gate_up_proj", {e, hidden, 2 * fe});
    b.Add("mlp.experts.gate_up_proj_bias", {e, 2 * fe}, false, true);
    b.Add("mlp.experts.down_proj", {e, fe, hidden});
    b.Add("mlp.experts.down_proj_bias", {e, hidden}, false, true);
    return b.Build();
  }
  b.Add("mlp.gate.weight", {e, hidden});
  b.Add("mlp.experts.gate_up_proj", {e, 2 * fe, hidden});
  b.Add("mlp.experts.down_proj", {e, hidden, fe});
  if (m.shared_expert_intermediate_size > 0) {
    const int64_t fs = m.shared_expert_intermediate_size;
    b.Add("mlp.shared_expert.gate_proj.weight", {fs, hidden});
    b.Add("mlp.shared_expert.up_proj.weight", {fs, hidden});
    b.Add("mlp.shared_expert.down_proj.weight", {hidden, fs});
    b.Add("mlp.shared_expert_gate.weight", {1, hidden});
  }
  return b.Build();
}

ModelLayout MoeModelLayout(const MoeModelConfig& config) {
  ModelConfig dense_config = config.base;
  dense_config.moe.reset();  // the dense layout of the embedding and head
  ModelLayout dense = ModelLayout::Create(dense_config);
  ModelLayout out;
  out.blocks.push_back(std::move(dense.blocks[dense.embedding_block()]));
  for (int64_t layer_idx = 0; layer_idx < config.base.num_hidden_layers; ++layer_idx) {
    out.blocks.push_back(MoeDecoderLayerBlock(config, layer_idx));
  }
  out.blocks.push_back(std::move(dense.blocks[dense.head_block()]));
  return out;
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
  for (int64_t layer_idx = 0; layer_idx < c.num_hidden_layers; ++layer_idx) {
    for (ParamSpec& p : MoeDecoderLayerBlock(config, layer_idx).params) out.push_back(std::move(p));
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
