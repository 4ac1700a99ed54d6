// Model architecture description for dense decoder families, named with
// Hugging Face `config.json` fields, plus the built-in presets.
//
// Per-family differences are data in ModelConfig (norm kind, activation,
// attention options per layer, fused tensors), filled in by ParseHfConfig
// from a family table; layers.cc reads the data, never the model_type.
//
// Supported `model_type`s and what each selects (HF transformers files
// `models/<family>/modular_*.py` / `modeling_*.py`):
//   llama    RMSNorm, RoPE (optionally `rope_scaling` type "llama3" or
//            "linear"), grouped-query attention, SwiGLU MLP.
//   mistral  llama + `sliding_window` (causal attention limited to the last
//            `sliding_window` positions).
//   qwen2    llama + bias on q/k/v projections (HF hard-codes it);
//            `use_sliding_window` is honoured.
//   qwen3    llama + per-head RMSNorm on q and k (`q_norm`, `k_norm`) before
//            RoPE, `attention_bias` from the config, explicit `head_dim`.
//   gemma2   zero-centred RMSNorm x_hat * (1 + w) in fp32, four norms per
//            layer (input, post-attention, pre- and post-feedforward),
//            embedding times sqrt(hidden_size), attention scale
//            query_pre_attn_scalar^-0.5, tanh soft-capping of attention
//            and final logits, sliding window on the layers `layer_types`
//            names (default: even layers), GELU-tanh gated MLP.
//   gemma3_text  gemma2's norms and embedding scale + per-head (1 + w)
//            q/k norms, RoPE base `rope_local_base_freq` on sliding layers
//            and `rope_theta` (+ `rope_scaling`) on full ones, 5 local : 1
//            global (`layer_types` / `sliding_window_pattern`), no
//            soft-capping unless configured. `gemma3` (multimodal) configs
//            are read through their `text_config`.
//   phi3     fused `qkv_proj` and `gate_up_proj` tensors, `partial_rotary_
//            factor`, LongRoPE (`rope_scaling` type "longrope"),
//            `sliding_window` (Phi-3, Phi-3.5, Phi-4).
// Anything else is refused with UNIMPLEMENTED naming the field.
//
// Thread-safety: plain value types; const methods are safe to call
// concurrently.
#ifndef MEGATRAIN_ENGINE_MODEL_CONFIG_H_
#define MEGATRAIN_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

struct MoeConfig;  // engine/model/moe_config.h

// RoPE frequency scaling (`rope_scaling` in config.json).
enum class RopeScalingType { kNone, kLinear, kLlama3, kLongRope };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3 and longrope
  // LongRoPE (HF modeling_rope_utils.py _compute_longrope_parameters): the
  // inverse frequencies are divided by `short_factor` when the sequence fits
  // in original_max_position_embeddings and by `long_factor` beyond it; each
  // has RotaryDim() / 2 entries. cos and sin are multiplied by
  // `attention_factor` (0 = derived: sqrt(1 + ln(s) / ln(original)) with
  // s = max_position_embeddings / original_max_position_embeddings, 1 when
  // s <= 1).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 0.0;
};

// Normalisation of the RMSNorm weights (HF LlamaRMSNorm vs Gemma2RMSNorm).
enum class NormKind {
  kRms,              // weight * x_hat.to(dtype), weights stored around 1
  kRmsOnePlusWeight  // (x_hat * (1 + weight)).to(dtype) in fp32, stored around 0
};

// The gate activation of the gated MLP down(act(gate(x)) * up(x)).
enum class MlpActivation {
  kSilu,      // hidden_act "silu" (SwiGLU)
  kGeluTanh,  // "gelu_pytorch_tanh" / "gelu_new": tanh approximation (GeGLU)
  kGelu,      // "gelu": erf form
};

// Attention of one decoder layer (HF `layer_types`).
enum class LayerType { kFullAttention, kSlidingAttention };

// Architecture hyper-parameters, with HF config.json names.
struct ModelConfig {
  std::string model_type =
      "llama";  // llama | mistral | qwen2 | qwen3 | gemma2 | gemma3_text | phi3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // C
  int64_t intermediate_size = 0;    // F
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // KV; divides H
  int64_t head_dim = 0;             // Dh; defaults to C / H
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for llama) projection bias
  bool qk_norm = false;         // qwen3 q_norm / k_norm
  int64_t sliding_window = 0;   // 0 = full causal attention
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  // `pad_token_id` when config.json sets one: HF builds the embedding as
  // nn.Embedding(padding_idx=pad_token_id), so lookups of that token add
  // no gradient to its row (EmbeddingPaddingIdx).
  bool has_pad_token_id = false;
  int64_t pad_token_id = 0;
  std::string torch_dtype = "float32";  // recorded in exported config.json

  // Family options (defaults are Llama's). See the file comment for which
  // family sets which.
  NormKind norm_kind = NormKind::kRms;
  MlpActivation hidden_activation = MlpActivation::kSilu;
  // Gemma's four norms per layer: `post_attention_layernorm` normalises the
  // attention output before the residual add, `pre_feedforward_layernorm`
  // and `post_feedforward_layernorm` surround the MLP. Without it
  // `post_attention_layernorm` is Llama's pre-MLP norm.
  bool sandwich_norms = false;
  // Embedding output times sqrt(hidden_size) rounded to the compute dtype
  // (Gemma; Note [Embedding scale] in layers.h).
  bool scale_embeddings = false;
  // Attention scores are scaled by query_pre_attn_scalar^-0.5; 0 = head_dim.
  double query_pre_attn_scalar = 0.0;
  // cap * tanh(x / cap) on attention scores / final logits; 0 = none.
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // One entry per layer, or empty: every layer slides when sliding_window
  // > 0 (Mistral, Phi-3), else none does. A kSlidingAttention layer attends
  // to the last `sliding_window` positions.
  std::vector<LayerType> layer_types;
  // > 0: sliding layers use RoPE base rope_local_base_freq without
  // rope_scaling (Gemma 3); full layers use rope_theta and rope_scaling.
  double rope_local_base_freq = 0.0;
  // Fraction of head_dim that RoPE rotates (Phi-3); the rest passes.
  double partial_rotary_factor = 1.0;
  // Phi-3 checkpoints hold fused `self_attn.qkv_proj.weight` [(H+2KV)*Dh, C]
  // (q, k, v rows in that order) and `mlp.gate_up_proj.weight` [2F, C]
  // (gate rows first); layers.cc views them as the separate projections.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // Read from a multimodal `gemma3` config (its text_config): the
  // checkpoint's text tensors sit under a language_model prefix and the
  // vision tower's beside them (LoadHfWeights maps and skips them). Exports
  // are plain gemma3_text (Gemma3ForCausalLM).
  bool multimodal_checkpoint = false;
  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe, gpt_oss;
  // engine/model/moe_config.h), or null for a dense model. ParseHfConfig
  // sets it for those model_types; the fields above then describe the
  // dense family underneath (model_type mistral, qwen2, qwen3 or llama:
  // attention, norms, embedding) and moe->model_type the HF family.
  // ModelLayout, the store, the executor and HF import/export read it.
  std::shared_ptr<const MoeConfig> moe;

  // Checks every field (positive sizes, divisibility of heads, known
  // activation). Returns INVALID_ARGUMENT naming the field and value.
  absl::Status Validate() const;

  // True when q/k/v projections have a bias (qwen2 always; others when
  // `attention_bias`), and when o_proj has one (llama with `attention_bias`).
  bool HasQkvBias() const;
  bool HasOutputBias() const;

  // The embedding row whose lookups take no gradient (nn.Embedding
  // padding_idx, a negative pad_token_id counting from the end as PyTorch
  // does), or -1 when there is none.
  int64_t EmbeddingPaddingIdx() const;

  // The attention of decoder layer `layer_idx` (see layer_types).
  LayerType AttentionType(int64_t layer_idx) const;
  // True when some layer is kSlidingAttention.
  bool AnySlidingLayer() const;
  // Dimensions RoPE rotates: head_dim * partial_rotary_factor (even).
  int64_t RotaryDim() const;
  // The softmax scale of attention scores.
  double AttentionScale() const;

  // Number of parameters of one decoder layer (elements).
  int64_t LayerParamCount() const;
  // Number of parameters of the whole model (elements), lm_head counted once
  // when tied (every expert counted for a MoE model).
  int64_t ParamCount() const;
  // Model FLOPs per trained token for `seq_len`: 6 * (N - V*C) + 12*L*C*T
  // (forward + backward, PaLM appendix B; the input embedding is a lookup, no
  // causal discount), matching ../shared/bench/torch_baselines.py. For a MoE
  // model N counts the active parameters (the k routed experts a token
  // visits, MoeActiveParamCount in engine/model/moe_layout.h).
  double TrainFlopsPerToken(int64_t seq_len) const;

  // The config as HF `config.json` text (architectures, model_type and the
  // fields above), loadable by transformers' AutoConfig.
  std::string ToHfConfigJson() const;
};

// Note [Model bounds]
// Every size a caller controls is bounded before anything is sized from it,
// so that a config.json or a PlanJob request cannot make the daemon spend
// unbounded memory or time (an admission estimate is O(layers) and builds
// one small record per layer). The bounds are far above any released model
// (largest today: 126 layers, hidden 25,600, vocabulary 262,144, 384
// experts, 2e12 parameters):
//   num_hidden_layers            <= kMaxHiddenLayers (4,096; PlanJob's
//                                   family/param_count reaches ~3,100 at 1e13)
//   hidden_size                  <= kMaxHiddenSize (262,144)
//   intermediate_size            <= kMaxIntermediateSize (4,194,304)
//   num_attention_heads, num_key_value_heads <= kMaxAttentionHeads (16,384)
//   head_dim                     <= kMaxHeadDim (16,384)
//   vocab_size                   <= kMaxVocabSize (16,777,216)
//   max_position_embeddings      <= kMaxPositionEmbeddings (1,073,741,824)
//   layer_types                  at most num_hidden_layers entries
//   parameters (every expert)    <= kMaxModelParams (1e13), summed in 128-bit
//                                   integers so that no product overflows
// MoE fields keep their own bounds (moe_config.h: <= 4,096 experts, expert
// widths <= 2^24), and count in the parameter total.
inline constexpr int64_t kMaxHiddenLayers = 4096;
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 18;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 22;
inline constexpr int64_t kMaxAttentionHeads = int64_t{1} << 14;
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 14;
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 30;
inline constexpr int64_t kMaxModelParams = 10'000'000'000'000;
// MoeConfig::Validate's bounds (moe_config.cc), here so that the total
// above is computed only from bounded sizes.
inline constexpr int64_t kMaxMoeExperts = 4096;
inline constexpr int64_t kMaxMoeIntermediateSize = int64_t{1} << 24;

// Checks the bounds of Note [Model bounds]: the first thing ParseHfConfig
// does after reading the sizes and the first thing ModelConfig::Validate
// does, so that PlanJob, SubmitJob's admission, the bench and `megatrain
// plan` all pass here before any layout or footprint is computed. O(1) time,
// no allocation beyond the error message. Returns INVALID_ARGUMENT naming
// every field over its bound with the value and the limit (all at once);
// sizes below 1 are left to Validate.
absl::Status CheckModelBounds(const ModelConfig& config);

// Parses HF `config.json` text. `source` names the file in error messages.
// A MoE model_type (mixtral, qwen2_moe, qwen3_moe, gpt_oss) is parsed by
// ParseMoeHfConfig and comes back with `moe` set.
// Errors: INVALID_ARGUMENT for malformed JSON or a bad value (message names
// the field); UNIMPLEMENTED for an unsupported `model_type`, `hidden_act` or
// `rope_scaling.rope_type`.
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text,
                                          absl::string_view source = "config.json");

// Reads and parses `path` (a config.json file). NOT_FOUND if it is missing.
absl::StatusOr<ModelConfig> LoadHfConfigFile(const std::string& path);

// Built-in shapes: "tiny" (a ~0.9M-parameter model for tests and the demo),
// "llama-1b", "llama-3b", "llama-8b" (Llama-3.2-1B / 3B and Llama-3.1-8B
// shapes, identical to ../shared/bench/torch_baselines.py: untied, rope_theta
// 500000, rms_norm_eps 1e-6), "gemma2-2b" (google/gemma-2-2b's config.json)
// and "phi3-mini" (microsoft/Phi-3-mini-4k-instruct's), and two mixture-of-
// experts shapes for the benchmark: "qwen3-moe-7b" (Qwen3-MoE-shaped, 7.4B
// total / 1.7B active) and "mixtral-7b" (Mixtral-shaped, 6.7B / 1.9B).
// INVALID_ARGUMENT for
// an unknown name, listing the known ones.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// Names accepted by PresetConfig.
std::vector<std::string> PresetNames();

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_CONFIG_H_
