// Parameter layout of every family, dense and MoE (HF modeling_*.py
// names): the one place that builds blocks. moe_layout.cc derives its
// views (MoeModelLayout, MoeModelParams) from here.
#include "engine/model/param_layout.h"

#include "absl/strings/str_cat.h"
#include "engine/model/moe_config.h"

namespace megatrain::engine {
namespace {

int64_t AlignUp(int64_t n, int64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

class BlockBuilder {
 public:
  BlockBuilder(BlockKind kind, int64_t layer_idx, std::string hf_prefix)
      : hf_prefix_(std::move(hf_prefix)) {
    block_.kind = kind;
    block_.layer_idx = layer_idx;
  }

  BlockBuilder& Add(std::string local_name, std::vector<int64_t> shape, bool is_norm = false,
                    bool is_bias = false) {
    ParamSpec p;
    p.hf_name = absl::StrCat(hf_prefix_, local_name);
    p.local_name = std::move(local_name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = block_.numel;
    p.is_norm = is_norm;
    p.is_bias = is_bias;
    block_.numel = AlignUp(block_.numel + p.numel, kParamAlignElements);
    block_.params.push_back(std::move(p));
    return *this;
  }

  BlockLayout Build() { return std::move(block_); }

 private:
  std::string hf_prefix_;
  BlockLayout block_;
};

// Gemma's (1 + w) norm weights are stored zero-centred: they start at 0
// (is_bias) where Llama's start at 1 (is_norm).
void AddNorm(const ModelConfig& c, const char* name, int64_t size, BlockBuilder* b) {
  const bool zero_centred = c.norm_kind == NormKind::kRmsOnePlusWeight;
  b->Add(name, {size}, /*is_norm=*/!zero_centred, /*is_bias=*/zero_centred);
}

// Norms and attention of a decoder layer, up to its MLP. `attention_sinks`
// (gpt_oss) adds `self_attn.sinks` [H]: logits (HF initialises them with
// normal_), neither norm nor bias.
void AddAttention(const ModelConfig& c, bool attention_sinks, BlockBuilder* b) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  AddNorm(c, "input_layernorm.weight", c.hidden_size, b);
  if (c.fused_qkv) {  // Phi-3: q, k, v rows of one tensor
    b->Add("self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, c.hidden_size});
  } else {
    b->Add("self_attn.q_proj.weight", {q_dim, c.hidden_size});
    if (c.HasQkvBias()) b->Add("self_attn.q_proj.bias", {q_dim}, false, /*is_bias=*/true);
    b->Add("self_attn.k_proj.weight", {kv_dim, c.hidden_size});
    if (c.HasQkvBias()) b->Add("self_attn.k_proj.bias", {kv_dim}, false, true);
    b->Add("self_attn.v_proj.weight", {kv_dim, c.hidden_size});
    if (c.HasQkvBias()) b->Add("self_attn.v_proj.bias", {kv_dim}, false, true);
  }
  b->Add("self_attn.o_proj.weight", {c.hidden_size, q_dim});
  if (c.HasOutputBias()) b->Add("self_attn.o_proj.bias", {c.hidden_size}, false, true);
  if (c.qk_norm) {
    AddNorm(c, "self_attn.q_norm.weight", c.head_dim, b);
    AddNorm(c, "self_attn.k_norm.weight", c.head_dim, b);
  }
  if (attention_sinks) b->Add("self_attn.sinks", {c.num_attention_heads});
  AddNorm(c, "post_attention_layernorm.weight", c.hidden_size, b);
  if (c.sandwich_norms) {  // Gemma 2/3
    AddNorm(c, "pre_feedforward_layernorm.weight", c.hidden_size, b);
    AddNorm(c, "post_feedforward_layernorm.weight", c.hidden_size, b);
  }
}

// The gated MLP of a dense layer.
void AddDenseMlp(const ModelConfig& c, BlockBuilder* b) {
  if (c.fused_gate_up) {  // Phi-3: gate rows, then up rows
    b->Add("mlp.gate_up_proj.weight", {2 * c.intermediate_size, c.hidden_size});
  } else {
    b->Add("mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size});
    b->Add("mlp.up_proj.weight", {c.intermediate_size, c.hidden_size});
  }
  b->Add("mlp.down_proj.weight", {c.hidden_size, c.intermediate_size});
}

// The router and experts of a MoE layer (moe_layout.h lists the tensors).
void AddMoeMlp(const ModelConfig& c, const MoeConfig& m, BlockBuilder* b) {
  const int64_t hidden = c.hidden_size, e = m.num_experts, fe = m.moe_intermediate_size;
  if (m.expert_layout == ExpertLayout::kInterleavedColumns) {  // gpt_oss
    b->Add("mlp.router.weight", {e, hidden});
    b->Add("mlp.router.bias", {e}, false, true);
    b->Add("mlp.experts.gate_up_proj", {e, hidden, 2 * fe});
    b->Add("mlp.experts.gate_up_proj_bias", {e, 2 * fe}, false, true);
    b->Add("mlp.experts.down_proj", {e, fe, hidden});
    b->Add("mlp.experts.down_proj_bias", {e, hidden}, false, true);
    return;
  }
  b->Add("mlp.gate.weight", {e, hidden});
  b->Add("mlp.experts.gate_up_proj", {e, 2 * fe, hidden});
  b->Add("mlp.experts.down_proj", {e, hidden, fe});
  if (m.shared_expert_intermediate_size > 0) {  // qwen2_moe
    const int64_t fs = m.shared_expert_intermediate_size;
    b->Add("mlp.shared_expert.gate_proj.weight", {fs, hidden});
    b->Add("mlp.shared_expert.up_proj.weight", {fs, hidden});
    b->Add("mlp.shared_expert.down_proj.weight", {hidden, fs});
    b->Add("mlp.shared_expert_gate.weight", {1, hidden});
  }
}

}  // namespace

const ParamSpec* BlockLayout::Find(absl::string_view local_name) const {
  for (const ParamSpec& p : params) {
    if (p.local_name == local_name) return &p;
  }
  return nullptr;
}

BlockLayout DecoderLayerBlock(const ModelConfig& c, int64_t layer_idx) {
  BlockBuilder b(BlockKind::kDecoderLayer, layer_idx,
                 absl::StrCat("model.layers.", layer_idx, "."));
  const MoeConfig* moe = c.moe.get();
  AddAttention(c, moe != nullptr && moe->attention_sinks, &b);
  if (moe != nullptr && moe->IsMoeLayer(layer_idx)) {
    AddMoeMlp(c, *moe, &b);
  } else {
    AddDenseMlp(c, &b);
  }
  return b.Build();
}

ModelLayout ModelLayout::Create(const ModelConfig& c) {
  ModelLayout layout;
  layout.blocks.push_back(BlockBuilder(BlockKind::kEmbedding, -1, "model.")
                              .Add("embed_tokens.weight", {c.vocab_size, c.hidden_size})
                              .Build());
  for (int64_t layer_idx = 0; layer_idx < c.num_hidden_layers; ++layer_idx) {
    layout.blocks.push_back(DecoderLayerBlock(c, layer_idx));
  }
  BlockBuilder head(BlockKind::kHead, -1, "");
  AddNorm(c, "model.norm.weight", c.hidden_size, &head);
  if (!c.tie_word_embeddings) head.Add("lm_head.weight", {c.vocab_size, c.hidden_size});
  layout.blocks.push_back(head.Build());
  return layout;
}

std::vector<int64_t> ModelLayout::StreamedDenseBlocks(int64_t resident_layers) const {
  std::vector<int64_t> out;
  for (int64_t l = resident_layers; l < num_layers(); ++l) out.push_back(layer_block(l));
  out.push_back(head_block());
  return out;
}

int64_t ModelLayout::TotalNumel() const {
  int64_t n = 0;
  for (const BlockLayout& b : blocks) n += b.numel;
  return n;
}

int64_t ModelLayout::ParamCount() const {
  int64_t n = 0;
  for (const BlockLayout& b : blocks) {
    for (const ParamSpec& p : b.params) n += p.numel;
  }
  return n;
}

bool ModelLayout::FindHfName(absl::string_view hf_name, int64_t* block_idx,
                             const ParamSpec** param) const {
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (const ParamSpec& p : blocks[i].params) {
      if (p.hf_name == hf_name) {
        *block_idx = static_cast<int64_t>(i);
        *param = &p;
        return true;
      }
    }
  }
  return false;
}

}  // namespace megatrain::engine
