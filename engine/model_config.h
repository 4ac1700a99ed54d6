// Model architecture description for the Llama family of decoders, named with
// Hugging Face `config.json` fields, plus the built-in presets.
//
// Supported `model_type`s and what each selects (HF transformers files
// `models/{llama,mistral,qwen2,qwen3}/modeling_*.py`):
//   llama    RMSNorm, RoPE (optionally `rope_scaling` type "llama3" or
//            "linear"), grouped-query attention, SwiGLU MLP.
//   mistral  llama + `sliding_window` (causal attention limited to the last
//            `sliding_window` positions).
//   qwen2    llama + bias on q/k/v projections (HF hard-codes it);
//            `use_sliding_window` is honoured.
//   qwen3    llama + per-head RMSNorm on q and k (`q_norm`, `k_norm`) before
//            RoPE, `attention_bias` from the config, explicit `head_dim`.
// Anything else is refused with UNIMPLEMENTED naming the field.
//
// Thread-safety: plain value types; const methods are safe to call
// concurrently.
#ifndef MEGATRAIN_ENGINE_MODEL_CONFIG_H_
#define MEGATRAIN_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

// RoPE frequency scaling (`rope_scaling` in config.json).
enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                          // linear and llama3
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// Architecture hyper-parameters, with HF config.json names.
struct ModelConfig {
  std::string model_type = "llama";  // llama | mistral | qwen2 | qwen3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // C
  int64_t intermediate_size = 0;      // F
  int64_t num_hidden_layers = 0;      // L
  int64_t num_attention_heads = 0;    // H
  int64_t num_key_value_heads = 0;    // KV; divides H
  int64_t head_dim = 0;               // Dh; defaults to C / H
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;        // q/k/v (and o for llama) projection bias
  bool qk_norm = false;               // qwen3 q_norm / k_norm
  int64_t sliding_window = 0;         // 0 = full causal attention
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  std::string torch_dtype = "float32";  // recorded in exported config.json

  // Checks every field (positive sizes, divisibility of heads, known
  // activation). Returns INVALID_ARGUMENT naming the field and value.
  absl::Status Validate() const;

  // True when q/k/v projections have a bias (qwen2 always; others when
  // `attention_bias`), and when o_proj has one (llama with `attention_bias`).
  bool HasQkvBias() const;
  bool HasOutputBias() const;

  // Number of parameters of one decoder layer (elements).
  int64_t LayerParamCount() const;
  // Number of parameters of the whole model (elements), lm_head counted once
  // when tied.
  int64_t ParamCount() const;
  // Model FLOPs per trained token for `seq_len`: 6 * (N - V*C) + 12*L*C*T
  // (forward + backward, PaLM appendix B; the input embedding is a lookup, no
  // causal discount), matching ../shared/bench/torch_baselines.py.
  double TrainFlopsPerToken(int64_t seq_len) const;

  // The config as HF `config.json` text (architectures, model_type and the
  // fields above), loadable by transformers' AutoConfig.
  std::string ToHfConfigJson() const;
};

// Parses HF `config.json` text. `source` names the file in error messages.
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
// 500000, rms_norm_eps 1e-6). INVALID_ARGUMENT for an unknown name, listing
// the known ones.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// Names accepted by PresetConfig.
std::vector<std::string> PresetNames();

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_CONFIG_H_
