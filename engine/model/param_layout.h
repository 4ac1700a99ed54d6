// Where every parameter lives in the host store's flat buffers.
//
// The model is cut into blocks, the unit of streaming: block 0 is the token
// embedding, blocks 1..L the decoder layers (layer_idx 0..L-1), block L+1 the
// head (final RMSNorm and, when untied, lm_head). Each block's parameters lie
// back to back in one flat buffer per kind (master, grad, moments, streaming
// copy), each starting at a multiple of kParamAlignElements so that every
// parameter view is 256-byte aligned in fp32.
//
// Names are Hugging Face's (`model.layers.3.self_attn.q_proj.weight`), so
// safetensors import/export is a name lookup. Families whose checkpoints
// fuse projections (Phi-3 `qkv_proj`, `gate_up_proj`) keep the fused tensor
// as one parameter; layers.cc views it as the separate projections, so the
// split on load and the fusion on export are exact by construction. Shapes are PyTorch's
// (nn.Linear weight is [out_features, in_features]), row-major.
#ifndef MEGATRAIN_ENGINE_PARAM_LAYOUT_H_
#define MEGATRAIN_ENGINE_PARAM_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_config.h"

namespace megatrain::engine {

// Alignment of every parameter inside its block, in elements (64 x fp32 =
// 256 bytes: a full cache line multiple, and enough for AVX-512 and for the
// device kernels' vector loads).
inline constexpr int64_t kParamAlignElements = 64;

enum class BlockKind { kEmbedding, kDecoderLayer, kHead };

// One parameter tensor inside a block.
struct ParamSpec {
  std::string local_name;      // "self_attn.q_proj.weight"
  std::string hf_name;         // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // PyTorch shape
  int64_t offset = 0;          // elements from the block start
  int64_t numel = 0;           // product of shape
  bool is_norm = false;        // RMSNorm weight (initialised to ones)
  bool is_bias = false;        // initialised to zeros: a bias, or a zero-
                               // centred (1 + w) RMSNorm weight (Gemma)
};

// The parameters of one block.
struct BlockLayout {
  BlockKind kind = BlockKind::kEmbedding;
  int64_t layer_idx = -1;  // decoder layer index, -1 for other blocks
  std::vector<ParamSpec> params;
  int64_t numel = 0;  // elements including alignment padding

  // The parameter with this local name, or nullptr.
  const ParamSpec* Find(absl::string_view local_name) const;
};

// The blocks of a whole model, in streaming order.
struct ModelLayout {
  std::vector<BlockLayout> blocks;  // [embedding, layer 0..L-1, head]

  static ModelLayout Create(const ModelConfig& config);

  int64_t num_layers() const { return static_cast<int64_t>(blocks.size()) - 2; }
  int64_t embedding_block() const { return 0; }
  int64_t layer_block(int64_t layer_idx) const { return 1 + layer_idx; }
  int64_t head_block() const { return static_cast<int64_t>(blocks.size()) - 1; }

  // The blocks that stream and take a dense gradient when decoder layers
  // 0..resident_layers-1 stay on the device: layers resident_layers..L-1
  // and the head (Note [Device gradient accumulation] in executor.h sums
  // exactly these on the device).
  std::vector<int64_t> StreamedDenseBlocks(int64_t resident_layers) const;
  // Sum of block numel (with padding), in elements.
  int64_t TotalNumel() const;
  // Sum of parameter numel (no padding), in elements.
  int64_t ParamCount() const;
  // Block index and parameter of an HF tensor name; false if unknown.
  bool FindHfName(absl::string_view hf_name, int64_t* block_idx, const ParamSpec** param) const;
};

// The block of decoder layer `layer_idx` (0 <= layer_idx <
// config.num_hidden_layers) of any family (kind kDecoderLayer): norms and
// attention, then the MLP: the gated dense MLP, or, on a MoE layer of a
// config with `moe` set, the router and fused experts (moe_layout.h lists
// them). ModelLayout::Create's decoder layers are these. Thread-safe.
BlockLayout DecoderLayerBlock(const ModelConfig& config, int64_t layer_idx);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_PARAM_LAYOUT_H_
