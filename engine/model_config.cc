// HF config.json parsing, validation and presets for the Llama family.
#include "engine/model_config.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using nlohmann::json;

// Reads JSON fields of one object, naming them "<source>: <prefix><field>" in
// errors.
class FieldReader {
 public:
  FieldReader(const json& object, absl::string_view source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, field, ": ", what));
  }

  // Integer field if present. A float with an integral value is accepted
  // (some exporters write 4096.0).
  absl::Status Int(const char* field, int64_t* out) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return absl::OkStatus();
    if (it->is_number_integer()) {
      *out = it->get<int64_t>();
      return absl::OkStatus();
    }
    if (it->is_number_float()) {
      const double v = it->get<double>();
      if (v == static_cast<double>(static_cast<int64_t>(v))) {
        *out = static_cast<int64_t>(v);
        return absl::OkStatus();
      }
    }
    return Error(field, absl::StrCat("expected an integer, got ", it->dump()));
  }

  absl::Status Double(const char* field, double* out) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number()) return Error(field, absl::StrCat("expected a number, got ", it->dump()));
    *out = it->get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(const char* field, bool* out) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_boolean()) {
      return Error(field, absl::StrCat("expected true or false, got ", it->dump()));
    }
    *out = it->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* field, std::string* out) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) return Error(field, absl::StrCat("expected a string, got ", it->dump()));
    *out = it->get<std::string>();
    return absl::OkStatus();
  }

  // `eos_token_id` may be a list (Llama 3.1 instruct): the first one is used.
  absl::Status TokenId(const char* field, int64_t* out) const {
    auto it = object_.find(field);
    if (it != object_.end() && it->is_array()) {
      if (it->empty() || !(*it)[0].is_number_integer()) {
        return Error(field, "expected an integer or a non-empty list of integers");
      }
      *out = (*it)[0].get<int64_t>();
      return absl::OkStatus();
    }
    return Int(field, out);
  }

 private:
  const json& object_;
  absl::string_view source_;
  std::string prefix_;
};

// RoPE settings come either as transformers < 5 writes them (top-level
// `rope_theta` plus an optional `rope_scaling` object) or as transformers 5
// does (`rope_parameters`: {rope_type, rope_theta, factor, ...}). The latter
// wins when both are present.
absl::Status ParseRopeScaling(const json& j, absl::string_view source, RopeScaling* out,
                              double* rope_theta) {
  const char* key = "rope_scaling";
  auto it = j.find("rope_parameters");
  if (it != j.end() && !it->is_null()) {
    key = "rope_parameters";
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": rope_parameters: expected an object, got ", it->dump()));
    }
    FieldReader rp(*it, source, "rope_parameters.");
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("rope_theta", rope_theta));
  } else {
    it = j.find("rope_scaling");
  }
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": rope_scaling: expected an object, got ", it->dump()));
  }
  FieldReader rs(*it, source, absl::StrCat(key, "."));
  std::string type;
  MEGATRAIN_RETURN_IF_ERROR(rs.String("type", &type));       // older name
  MEGATRAIN_RETURN_IF_ERROR(rs.String("rope_type", &type));  // current name
  if (type.empty() || type == "default") {
    out->type = RopeScalingType::kNone;
    return absl::OkStatus();
  }
  if (type == "linear") {
    out->type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScalingType::kLlama3;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        source, ": ", key, ".rope_type: '", type,
        "' is not supported (supported: default, linear, llama3)"));
  }
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("factor", &out->factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("low_freq_factor", &out->low_freq_factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("high_freq_factor", &out->high_freq_factor));
  MEGATRAIN_RETURN_IF_ERROR(
      rs.Int("original_max_position_embeddings", &out->original_max_position_embeddings));
  return absl::OkStatus();
}

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be > 0, got ", value));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2" &&
      model_type != "qwen3") {
    return absl::UnimplementedError(absl::StrCat(
        "model_type: '", model_type, "' is not supported (supported: llama, mistral, qwen2, qwen3)"));
  }
  MEGATRAIN_RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_hidden_layers", num_hidden_layers));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_attention_heads", num_attention_heads));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_key_value_heads", num_key_value_heads));
  MEGATRAIN_RETURN_IF_ERROR(Positive("head_dim", head_dim));
  MEGATRAIN_RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_key_value_heads: must divide num_attention_heads (", num_attention_heads, "), got ",
        num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be even for RoPE, got ", head_dim));
  }
  if (!(rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm_eps: must be > 0, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta: must be > 0, got ", rope_theta));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window: must be >= 0, got ", sliding_window));
  }
  if (rope_scaling.type != RopeScalingType::kNone && !(rope_scaling.factor >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling.factor: must be >= 1, got ", rope_scaling.factor));
  }
  if (rope_scaling.type == RopeScalingType::kLlama3 &&
      !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.original_max_position_embeddings > 0)) {
    return absl::InvalidArgumentError(
        "rope_scaling: llama3 needs high_freq_factor > low_freq_factor and "
        "original_max_position_embeddings > 0");
  }
  return absl::OkStatus();
}

bool ModelConfig::HasQkvBias() const {
  return model_type == "qwen2" || attention_bias;
}

bool ModelConfig::HasOutputBias() const {
  // HF LlamaAttention: o_proj bias = attention_bias; Mistral, Qwen2 and
  // Qwen3 never have an o_proj bias.
  return model_type == "llama" && attention_bias;
}

int64_t ModelConfig::LayerParamCount() const {
  const int64_t q = num_attention_heads * head_dim;
  const int64_t kv = num_key_value_heads * head_dim;
  int64_t n = 2 * hidden_size;                             // two RMSNorm weights
  n += hidden_size * (q + 2 * kv) + q * hidden_size;       // q, k, v, o
  if (HasQkvBias()) n += q + 2 * kv;
  if (HasOutputBias()) n += hidden_size;
  if (qk_norm) n += 2 * head_dim;
  n += 3 * hidden_size * intermediate_size;                // gate, up, down
  return n;
}

int64_t ModelConfig::ParamCount() const {
  int64_t n = vocab_size * hidden_size + hidden_size;      // embedding + final norm
  if (!tie_word_embeddings) n += vocab_size * hidden_size; // lm_head
  return n + num_hidden_layers * LayerParamCount();
}

double ModelConfig::TrainFlopsPerToken(int64_t seq_len) const {
  const double n_non_embedding =
      static_cast<double>(ParamCount()) - static_cast<double>(vocab_size * hidden_size);
  return 6.0 * n_non_embedding +
         12.0 * static_cast<double>(num_hidden_layers * hidden_size * seq_len);
}

std::string ModelConfig::ToHfConfigJson() const {
  json j;
  static const std::map<std::string, std::string> kArchitecture = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}};
  auto arch = kArchitecture.find(model_type);
  j["architectures"] = {arch == kArchitecture.end() ? "LlamaForCausalLM" : arch->second};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["initializer_range"] = 0.02;
  if (model_type == "llama") j["mlp_bias"] = false;
  if (model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3") {
    if (sliding_window > 0) {
      j["sliding_window"] = sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
    if (model_type != "mistral") j["use_sliding_window"] = sliding_window > 0;
  }
  // Both spellings (see ParseRopeScaling), agreeing, so that transformers 4
  // and 5 read the same RoPE.
  json rope_parameters = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  switch (rope_scaling.type) {
    case RopeScalingType::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
      rope_parameters.update(j["rope_scaling"]);
      break;
    case RopeScalingType::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      rope_parameters.update(j["rope_scaling"]);
      break;
  }
  j["rope_parameters"] = rope_parameters;
  return j.dump(2);
}

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  FieldReader r(j, source);
  ModelConfig c;
  c.model_type.clear();
  MEGATRAIN_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  if (c.model_type.empty()) return r.Error("model_type", "missing");
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2" &&
      c.model_type != "qwen3") {
    return absl::UnimplementedError(absl::StrCat(source, ": model_type: '", c.model_type,
                                                 "' is not supported (supported: llama, "
                                                 "mistral, qwen2, qwen3)"));
  }
  for (const char* required : {"vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads"}) {
    if (!j.contains(required)) return r.Error(required, "missing");
  }
  MEGATRAIN_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_key_value_heads));
  c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position_embeddings));
  MEGATRAIN_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps));
  MEGATRAIN_RETURN_IF_ERROR(r.Double("rope_theta", &c.rope_theta));
  MEGATRAIN_RETURN_IF_ERROR(ParseRopeScaling(j, source, &c.rope_scaling, &c.rope_theta));
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("attention_bias", &c.attention_bias));
  MEGATRAIN_RETURN_IF_ERROR(r.TokenId("bos_token_id", &c.bos_token_id));
  MEGATRAIN_RETURN_IF_ERROR(r.TokenId("eos_token_id", &c.eos_token_id));
  MEGATRAIN_RETURN_IF_ERROR(r.String("torch_dtype", &c.torch_dtype));

  std::string hidden_act = "silu";
  MEGATRAIN_RETURN_IF_ERROR(r.String("hidden_act", &hidden_act));
  if (hidden_act != "silu") {
    return absl::UnimplementedError(absl::StrCat(
        source, ": hidden_act: '", hidden_act, "' is not supported (SwiGLU needs 'silu')"));
  }
  bool mlp_bias = false;
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) return absl::UnimplementedError(absl::StrCat(source, ": mlp_bias: true is not supported"));

  if (c.model_type == "qwen3") c.qk_norm = true;
  // Sliding window: Mistral applies `sliding_window` when set; Qwen2/Qwen3
  // only when `use_sliding_window` is true (HF configuration_qwen2.py).
  int64_t window = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window", &window));
  bool use_sliding_window = c.model_type == "mistral";
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("use_sliding_window", &use_sliding_window));
  if (c.model_type == "llama") use_sliding_window = false;
  c.sliding_window = use_sliding_window ? window : 0;
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    // max_window_layers: layers below it use full attention. Supporting a
    // mixed model is not done; refuse rather than train the wrong thing.
    int64_t max_window_layers = c.num_hidden_layers;
    MEGATRAIN_RETURN_IF_ERROR(r.Int("max_window_layers", &max_window_layers));
    if (use_sliding_window && max_window_layers > 0 && max_window_layers < c.num_hidden_layers) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": max_window_layers: sliding window on only some layers is not supported"));
    }
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return Annotate(valid, source);
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseHfConfig(buffer.str(), path);
}

namespace {

// Shapes shared by the Llama 3.x presets (torch_baselines.py: LlamaConfig
// defaults plus rope_theta 500000, untied embeddings).
ModelConfig Llama3Shape(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                        int64_t kv_heads) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = false;
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() { return {"tiny", "llama-1b", "llama-3b", "llama-8b"}; }

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  if (name == "tiny") {
    // Small enough for CI on 2 cores, with GQA (4 heads, 2 kv heads).
    ModelConfig c;
    c.model_type = "llama";
    c.vocab_size = 512;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = false;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    return c;
  }
  if (name == "llama-1b") return Llama3Shape(2048, 8192, 16, 32, 8);
  if (name == "llama-3b") return Llama3Shape(3072, 8192, 28, 24, 8);
  if (name == "llama-8b") return Llama3Shape(4096, 14336, 32, 32, 8);
  return absl::InvalidArgumentError(absl::StrCat("model.preset: unknown '", name,
                                                 "' (known: ", absl::StrJoin(PresetNames(), ", "),
                                                 ")"));
}

}  // namespace megatrain::engine
