// HF config.json parsing, validation and presets of the dense families.
#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/model/json_field_reader.h"
#include "engine/model/moe_config.h"
#include "engine/model/moe_layout.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using nlohmann::json;

// One RoPE settings object: `rope_scaling` (transformers < 5, beside a
// top-level rope_theta) or `rope_parameters` (transformers 5, with
// rope_theta inside). `key` names it in errors.
absl::Status ParseRopeObject(const json& obj, absl::string_view source, const std::string& key,
                             RopeScaling* out, double* rope_theta) {
  if (!obj.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", key, ": expected an object, got ", obj.dump()));
  }
  JsonFieldReader rs(obj, source, absl::StrCat(key, "."));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("rope_theta", rope_theta));
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
  } else if (type == "longrope") {
    out->type = RopeScalingType::kLongRope;
  } else {
    return absl::UnimplementedError(
        absl::StrCat(source, ": ", key, ".rope_type: '", type,
                     "' is not supported (supported: default, linear, llama3, longrope)"));
  }
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("factor", &out->factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("low_freq_factor", &out->low_freq_factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("high_freq_factor", &out->high_freq_factor));
  MEGATRAIN_RETURN_IF_ERROR(
      rs.Int("original_max_position_embeddings", &out->original_max_position_embeddings));
  MEGATRAIN_RETURN_IF_ERROR(rs.DoubleList("short_factor", &out->short_factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.DoubleList("long_factor", &out->long_factor));
  MEGATRAIN_RETURN_IF_ERROR(rs.Double("attention_factor", &out->attention_factor));
  return absl::OkStatus();
}

// RoPE settings come either as transformers < 5 writes them (top-level
// `rope_theta` plus an optional `rope_scaling` object) or as transformers 5
// does (`rope_parameters`: {rope_type, rope_theta, factor, ...}). The latter
// wins when both are present. Gemma 3's transformers-5 form is keyed by
// layer type ({"full_attention": {...}, "sliding_attention": {...}}); the
// sliding one sets rope_local_base_freq and must be unscaled.
absl::Status ParseRopeScaling(const json& j, absl::string_view source, ModelConfig* c) {
  auto it = j.find("rope_parameters");
  if (it != j.end() && !it->is_null()) {
    if (it->is_object() && it->contains("full_attention")) {
      MEGATRAIN_RETURN_IF_ERROR(ParseRopeObject((*it)["full_attention"], source,
                                                "rope_parameters.full_attention", &c->rope_scaling,
                                                &c->rope_theta));
      if (it->contains("sliding_attention")) {
        RopeScaling local;
        MEGATRAIN_RETURN_IF_ERROR(ParseRopeObject((*it)["sliding_attention"], source,
                                                  "rope_parameters.sliding_attention", &local,
                                                  &c->rope_local_base_freq));
        if (local.type != RopeScalingType::kNone) {
          return absl::UnimplementedError(absl::StrCat(
              source,
              ": rope_parameters.sliding_attention.rope_type: only 'default' is supported"));
        }
      }
      return absl::OkStatus();
    }
    MEGATRAIN_RETURN_IF_ERROR(
        ParseRopeObject(*it, source, "rope_parameters", &c->rope_scaling, &c->rope_theta));
    if (it->is_object()) {
      JsonFieldReader rp(*it, source, "rope_parameters.");
      MEGATRAIN_RETURN_IF_ERROR(rp.Double("partial_rotary_factor", &c->partial_rotary_factor));
    }
    return absl::OkStatus();
  }
  it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  double unused_theta = c->rope_theta;
  return ParseRopeObject(*it, source, "rope_scaling", &c->rope_scaling, &unused_theta);
}

// What differs between families before the config's own fields are read.
struct FamilyTraits {
  const char* model_type;
  const char* architecture;   // HF class written to `architectures`
  bool qkv_bias_always;       // Qwen2 hard-codes bias on q/k/v
  bool o_bias_with_qkv_bias;  // o_proj has a bias when attention_bias is set
  bool gemma_style;           // Gemma 2/3 norms, embedding scale, GeGLU
  bool fused_projections;     // Phi-3 qkv_proj / gate_up_proj
};

constexpr FamilyTraits kFamilies[] = {
    {"llama", "LlamaForCausalLM", false, true, false, false},
    {"mistral", "MistralForCausalLM", false, false, false, false},
    {"qwen2", "Qwen2ForCausalLM", true, false, false, false},
    {"qwen3", "Qwen3ForCausalLM", false, false, false, false},
    {"gemma2", "Gemma2ForCausalLM", false, true, true, false},
    {"gemma3_text", "Gemma3ForCausalLM", false, true, true, false},
    {"phi3", "Phi3ForCausalLM", false, false, false, true},
};

const FamilyTraits* FindFamily(absl::string_view model_type) {
  for (const FamilyTraits& f : kFamilies) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

std::string SupportedFamilies() {
  std::vector<std::string> names;
  for (const FamilyTraits& f : kFamilies) names.push_back(f.model_type);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<MlpActivation> ParseActivation(absl::string_view source, absl::string_view field,
                                              const std::string& name) {
  if (name == "silu" || name == "swish") return MlpActivation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_tanh") {
    return MlpActivation::kGeluTanh;
  }
  if (name == "gelu") return MlpActivation::kGelu;
  return absl::UnimplementedError(
      absl::StrCat(source, ": ", field, ": '", name,
                   "' is not supported (supported: silu, gelu_pytorch_tanh, gelu_new, gelu)"));
}

const char* ActivationName(MlpActivation a) {
  switch (a) {
    case MlpActivation::kSilu:
      return "silu";
    case MlpActivation::kGeluTanh:
      return "gelu_pytorch_tanh";
    case MlpActivation::kGelu:
      return "gelu";
  }
  return "silu";
}

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be > 0, got ", value));
}

}  // namespace

namespace {

// Sizes: positive, heads grouped evenly, an even rotary part of head_dim.
absl::Status CheckDimensions(const ModelConfig& c) {
  MEGATRAIN_RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("hidden_size", c.hidden_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("intermediate_size", c.intermediate_size));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_hidden_layers", c.num_hidden_layers));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_attention_heads", c.num_attention_heads));
  MEGATRAIN_RETURN_IF_ERROR(Positive("num_key_value_heads", c.num_key_value_heads));
  MEGATRAIN_RETURN_IF_ERROR(Positive("head_dim", c.head_dim));
  MEGATRAIN_RETURN_IF_ERROR(Positive("max_position_embeddings", c.max_position_embeddings));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_key_value_heads: must divide num_attention_heads (",
                     c.num_attention_heads, "), got ", c.num_key_value_heads));
  }
  if (c.head_dim % 2 != 0) {
    // HF's default head_dim is hidden_size // num_attention_heads: say so
    // when that is where an odd one came from.
    const std::string derived =
        c.head_dim == c.hidden_size / c.num_attention_heads
            ? absl::StrCat(" (hidden_size ", c.hidden_size, " / num_attention_heads ",
                           c.num_attention_heads, " when config.json gives no head_dim)")
            : "";
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be even for RoPE, got ", c.head_dim, derived));
  }
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial_rotary_factor: must be in (0, 1], got ", c.partial_rotary_factor));
  }
  if (c.RotaryDim() < 2 || c.RotaryDim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partial_rotary_factor: head_dim (", c.head_dim, ") * ", c.partial_rotary_factor, " = ",
        c.RotaryDim(), " rotary dimensions; must be even and >= 2"));
  }
  return absl::OkStatus();
}

// Norm epsilon, RoPE bases, sliding windows, soft-capping, the padding id
// and the projections' biases.
absl::Status CheckAttention(const ModelConfig& c) {
  if (!(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rms_norm_eps: must be > 0, got ", c.rms_norm_eps));
  }
  if (!(c.rope_theta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta: must be > 0, got ", c.rope_theta));
  }
  if (c.rope_local_base_freq < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_local_base_freq: must be > 0, got ", c.rope_local_base_freq));
  }
  if (c.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window: must be >= 0, got ", c.sliding_window));
  }
  if (!c.layer_types.empty() && static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_types: ", c.layer_types.size(),
                                                   " entries for num_hidden_layers ",
                                                   c.num_hidden_layers));
  }
  if (c.AnySlidingLayer() && c.sliding_window <= 0) {
    return absl::InvalidArgumentError(
        "sliding_window: layer_types has sliding_attention layers but sliding_window is not set");
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"query_pre_attn_scalar", c.query_pre_attn_scalar},
        {"attn_logit_softcapping", c.attn_logit_softcapping},
        {"final_logit_softcapping", c.final_logit_softcapping}}) {
    if (!(value >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": must be > 0 or unset, got ", value));
    }
  }
  if (c.has_pad_token_id && (c.pad_token_id >= c.vocab_size || c.pad_token_id < -c.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("pad_token_id: must be in [-vocab_size, ",
                                                   c.vocab_size, "), got ", c.pad_token_id));
  }
  if (c.fused_qkv && c.HasQkvBias()) {
    return absl::UnimplementedError("attention_bias: fused qkv_proj with a bias is not supported");
  }
  return absl::OkStatus();
}

// The fields each RoPE scaling type needs (HF modeling_rope_utils.py).
absl::Status CheckRopeScaling(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::kNone && rs.type != RopeScalingType::kLongRope &&
      !(rs.factor >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling.factor: must be >= 1, got ", rs.factor));
  }
  if (rs.type == RopeScalingType::kLlama3 &&
      !(rs.high_freq_factor > rs.low_freq_factor && rs.original_max_position_embeddings > 0)) {
    return absl::InvalidArgumentError(
        "rope_scaling: llama3 needs high_freq_factor > low_freq_factor and "
        "original_max_position_embeddings > 0");
  }
  if (rs.type != RopeScalingType::kLongRope) return absl::OkStatus();
  if (rs.original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError("original_max_position_embeddings: longrope needs it > 0");
  }
  for (const auto& [field, factors] :
       {std::pair<const char*, const std::vector<double>*>{"short_factor", &rs.short_factor},
        {"long_factor", &rs.long_factor}}) {
    if (static_cast<int64_t>(factors->size()) != c.RotaryDim() / 2) {
      return absl::InvalidArgumentError(absl::StrCat("rope_scaling.", field, ": ", factors->size(),
                                                     " entries, longrope needs ", c.RotaryDim() / 2,
                                                     " (head_dim * partial_rotary_factor / 2)"));
    }
    for (double f : *factors) {
      if (!(f > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rope_scaling.", field, ": entries must be > 0, got ", f));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

using WideCount = __int128;  // Note [Model bounds]: no product of bounded sizes overflows it

// ParamCount() in 128-bit arithmetic for a dense model (LayerParamCount's
// terms), an upper bound for a MoE one (a MoE layer counted as its experts
// plus router, shared expert, biases and sinks), for sizes already within
// their bounds.
WideCount ParamCountUpperBound(const ModelConfig& c) {
  const WideCount h = c.hidden_size;
  const WideCount q = WideCount{c.num_attention_heads} * c.head_dim;
  const WideCount kv = WideCount{c.num_key_value_heads} * c.head_dim;
  WideCount attention = (c.sandwich_norms ? 4 : 2) * h + h * (q + 2 * kv) + q * h;
  if (c.HasQkvBias()) attention += q + 2 * kv;
  if (c.HasOutputBias()) attention += h;
  if (c.qk_norm) attention += 2 * WideCount{c.head_dim};
  WideCount mlp = 3 * h * c.intermediate_size;
  if (c.moe != nullptr) {
    attention += c.num_attention_heads;  // gpt_oss attention sinks
    const WideCount e = c.moe->num_experts, fe = c.moe->moe_intermediate_size;
    const WideCount fs = c.moe->shared_expert_intermediate_size;
    const WideCount experts = e * h + e + e * (3 * h * fe + 2 * fe + h) + 3 * fs * h + h;
    mlp = std::max(mlp, experts);
  }
  const WideCount embeddings = (c.tie_word_embeddings ? 1 : 2) * WideCount{c.vocab_size} * h;
  return WideCount{c.num_hidden_layers} * (attention + mlp) + embeddings + h;
}

// "1.23e+15" for a count too wide for int64.
std::string WideText(WideCount n) { return absl::StrFormat("%.3g", static_cast<double>(n)); }

}  // namespace

absl::Status CheckModelBounds(const ModelConfig& c) {
  struct Bound {
    const char* field;
    int64_t value;
    int64_t limit;
  };
  std::vector<Bound> bounds = {
      {"num_hidden_layers", c.num_hidden_layers, kMaxHiddenLayers},
      {"hidden_size", c.hidden_size, kMaxHiddenSize},
      {"intermediate_size", c.intermediate_size, kMaxIntermediateSize},
      {"num_attention_heads", c.num_attention_heads, kMaxAttentionHeads},
      {"num_key_value_heads", c.num_key_value_heads, kMaxAttentionHeads},
      {"head_dim", c.head_dim, kMaxHeadDim},
      {"vocab_size", c.vocab_size, kMaxVocabSize},
      {"max_position_embeddings", c.max_position_embeddings, kMaxPositionEmbeddings},
      {"layer_types", static_cast<int64_t>(c.layer_types.size()),
       std::min(kMaxHiddenLayers, std::max<int64_t>(c.num_hidden_layers, 0))}};
  if (c.moe != nullptr) {
    bounds.push_back({"num_experts", c.moe->num_experts, kMaxMoeExperts});
    bounds.push_back(
        {"moe_intermediate_size", c.moe->moe_intermediate_size, kMaxMoeIntermediateSize});
    bounds.push_back({"shared_expert_intermediate_size", c.moe->shared_expert_intermediate_size,
                      kMaxMoeIntermediateSize});
  }
  std::vector<std::string> over;
  bool any_negative = false;
  for (const Bound& b : bounds) {
    any_negative = any_negative || b.value < 0;
    if (b.value > b.limit) {
      over.push_back(absl::StrCat(b.field, ": must be <= ", b.limit, ", got ", b.value));
    }
  }
  // The total only for sizes that are in bounds (so it cannot overflow)
  // and not negative (Validate names those).
  if (over.empty() && !any_negative) {
    const WideCount params = ParamCountUpperBound(c);
    if (params > kMaxModelParams) {
      over.push_back(absl::StrCat("parameters: the model has about ", WideText(params),
                                  " parameters; must be <= ", WideText(kMaxModelParams)));
    }
  }
  if (over.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(absl::StrJoin(over, "; "), " (bounds of Note [Model bounds], model_config.h)"));
}

absl::Status ModelConfig::Validate() const {
  MEGATRAIN_RETURN_IF_ERROR(CheckModelBounds(*this));
  if (FindFamily(model_type) == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "model_type: '", model_type, "' is not supported (supported: ", SupportedFamilies(), ")"));
  }
  if (moe != nullptr) MEGATRAIN_RETURN_IF_ERROR(moe->Validate(num_hidden_layers));
  MEGATRAIN_RETURN_IF_ERROR(CheckDimensions(*this));
  MEGATRAIN_RETURN_IF_ERROR(CheckAttention(*this));
  return CheckRopeScaling(*this);
}

bool ModelConfig::HasQkvBias() const {
  const FamilyTraits* f = FindFamily(model_type);
  return (f != nullptr && f->qkv_bias_always) || attention_bias;
}

bool ModelConfig::HasOutputBias() const {
  // HF LlamaAttention and Gemma2/3Attention: o_proj bias = attention_bias;
  // Mistral, Qwen2, Qwen3 and Phi-3 never have an o_proj bias.
  const FamilyTraits* f = FindFamily(model_type);
  return f != nullptr && f->o_bias_with_qkv_bias && attention_bias;
}

int64_t ModelConfig::EmbeddingPaddingIdx() const {
  if (!has_pad_token_id) return -1;
  return pad_token_id < 0 ? vocab_size + pad_token_id : pad_token_id;
}

LayerType ModelConfig::AttentionType(int64_t layer_idx) const {
  if (!layer_types.empty()) return layer_types[static_cast<size_t>(layer_idx)];
  return sliding_window > 0 ? LayerType::kSlidingAttention : LayerType::kFullAttention;
}

bool ModelConfig::AnySlidingLayer() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (AttentionType(l) == LayerType::kSlidingAttention) return true;
  }
  return false;
}

int64_t ModelConfig::RotaryDim() const {
  // HF: int(head_dim * partial_rotary_factor) (modeling_rope_utils.py).
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

double ModelConfig::AttentionScale() const {
  const double d =
      query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  return 1.0 / std::sqrt(d);
}

int64_t ModelConfig::LayerParamCount() const {
  const int64_t q = num_attention_heads * head_dim;
  const int64_t kv = num_key_value_heads * head_dim;
  int64_t n = (sandwich_norms ? 4 : 2) * hidden_size;  // RMSNorm weights
  n += hidden_size * (q + 2 * kv) + q * hidden_size;   // q, k, v, o
  if (HasQkvBias()) n += q + 2 * kv;
  if (HasOutputBias()) n += hidden_size;
  if (qk_norm) n += 2 * head_dim;
  n += 3 * hidden_size * intermediate_size;  // gate, up, down
  return n;
}

int64_t ModelConfig::ParamCount() const {
  if (moe != nullptr) return ModelLayout::Create(*this).ParamCount();  // every expert
  int64_t n = vocab_size * hidden_size + hidden_size;                  // embedding + final norm
  if (!tie_word_embeddings) n += vocab_size * hidden_size;             // lm_head
  return n + num_hidden_layers * LayerParamCount();
}

double ModelConfig::TrainFlopsPerToken(int64_t seq_len) const {
  const int64_t params =
      moe != nullptr ? MoeActiveParamCount(MoeModelConfigOf(*this)) : ParamCount();
  const double n_non_embedding =
      static_cast<double>(params) - static_cast<double>(vocab_size * hidden_size);
  return 6.0 * n_non_embedding +
         12.0 * static_cast<double>(num_hidden_layers * hidden_size * seq_len);
}

namespace {

json RopeScalingJson(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  switch (rs.type) {
    case RopeScalingType::kNone:
      return nullptr;
    case RopeScalingType::kLinear:
      return {{"rope_type", "linear"}, {"factor", rs.factor}};
    case RopeScalingType::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", rs.factor},
              {"low_freq_factor", rs.low_freq_factor},
              {"high_freq_factor", rs.high_freq_factor},
              {"original_max_position_embeddings", rs.original_max_position_embeddings}};
    case RopeScalingType::kLongRope: {
      // "type" too: transformers 4's Phi-3 validation reads that name.
      json j = {{"rope_type", "longrope"},
                {"type", "longrope"},
                {"short_factor", rs.short_factor},
                {"long_factor", rs.long_factor}};
      if (rs.attention_factor > 0) j["attention_factor"] = rs.attention_factor;
      return j;
    }
  }
  return nullptr;
}

// Gemma 2/3 fields of config.json.
void AddGemmaFields(const ModelConfig& c, json* j) {
  (*j)["hidden_activation"] = ActivationName(c.hidden_activation);
  // transformers 5's Gemma configs type the field as int and refuse 256.0:
  // an integral value is written as an integer.
  const double scalar =
      c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
  if (scalar == std::floor(scalar) && std::fabs(scalar) < 9.0e15) {
    (*j)["query_pre_attn_scalar"] = static_cast<int64_t>(scalar);
  } else {
    (*j)["query_pre_attn_scalar"] = scalar;
  }
  auto cap = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  (*j)["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
  (*j)["final_logit_softcapping"] = cap(c.final_logit_softcapping);
  json types = json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    types.push_back(c.AttentionType(l) == LayerType::kSlidingAttention ? "sliding_attention"
                                                                       : "full_attention");
  }
  (*j)["layer_types"] = types;
  (*j)["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
}

}  // namespace

std::string ModelConfig::ToHfConfigJson() const {
  if (moe != nullptr) return MoeHfConfigJson(MoeModelConfigOf(*this));
  json j;
  const FamilyTraits* family = FindFamily(model_type);
  j["architectures"] = {family == nullptr ? "LlamaForCausalLM" : family->architecture};
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
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = has_pad_token_id ? json(pad_token_id) : json(nullptr);
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["initializer_range"] = 0.02;
  if (family != nullptr && family->gemma_style) {
    AddGemmaFields(*this, &j);
  } else {
    j["hidden_act"] = ActivationName(hidden_activation);
  }
  if (model_type == "llama") j["mlp_bias"] = false;
  if (model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3" ||
      model_type == "phi3") {
    if (sliding_window > 0) {
      j["sliding_window"] = sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
    if (model_type == "qwen2" || model_type == "qwen3")
      j["use_sliding_window"] = sliding_window > 0;
  }
  if (model_type == "phi3") {
    j["partial_rotary_factor"] = partial_rotary_factor;
    j["original_max_position_embeddings"] = rope_scaling.type == RopeScalingType::kLongRope
                                                ? rope_scaling.original_max_position_embeddings
                                                : max_position_embeddings;
  }
  // Both spellings (see ParseRopeScaling), agreeing, so that transformers 4
  // and 5 read the same RoPE.
  json rope_parameters = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["rope_scaling"] = RopeScalingJson(*this);
  if (!j["rope_scaling"].is_null()) rope_parameters.update(j["rope_scaling"]);
  if (rope_scaling.type == RopeScalingType::kLongRope) {
    rope_parameters["original_max_position_embeddings"] =
        rope_scaling.original_max_position_embeddings;
  }
  if (partial_rotary_factor != 1.0)
    rope_parameters["partial_rotary_factor"] = partial_rotary_factor;
  if (rope_local_base_freq > 0) {
    j["rope_local_base_freq"] = rope_local_base_freq;
    j["rope_parameters"] = {
        {"full_attention", rope_parameters},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", rope_local_base_freq}}}};
  } else {
    j["rope_parameters"] = rope_parameters;
  }
  return j.dump(2);
}

namespace {

// Gemma 2 / Gemma 3 fields (HF configuration_gemma2.py, configuration_gemma3.py).
absl::Status ParseGemmaFields(const json& j, const JsonFieldReader& r, ModelConfig* c) {
  const bool gemma3 = c->model_type == "gemma3_text";
  c->norm_kind = NormKind::kRmsOnePlusWeight;
  c->sandwich_norms = true;
  c->scale_embeddings = true;
  c->qk_norm = gemma3;
  c->tie_word_embeddings = true;  // HF default for both
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  std::string activation = "gelu_pytorch_tanh";
  MEGATRAIN_RETURN_IF_ERROR(r.String("hidden_activation", &activation));
  MEGATRAIN_ASSIGN_OR_RETURN(c->hidden_activation,
                             ParseActivation(r.source(), "hidden_activation", activation));
  c->query_pre_attn_scalar = 256;  // HF default
  MEGATRAIN_RETURN_IF_ERROR(r.Double("query_pre_attn_scalar", &c->query_pre_attn_scalar));
  if (!gemma3) {  // Gemma 2 defaults; Gemma 3 defaults to none
    c->attn_logit_softcapping = 50.0;
    c->final_logit_softcapping = 30.0;
  }
  for (const auto& [field, out] :
       {std::pair<const char*, double*>{"attn_logit_softcapping", &c->attn_logit_softcapping},
        {"final_logit_softcapping", &c->final_logit_softcapping}}) {
    auto it = j.find(field);
    if (it != j.end() && it->is_null()) *out = 0.0;  // null = off
    MEGATRAIN_RETURN_IF_ERROR(r.Double(field, out));
  }
  c->sliding_window = 4096;
  if (j.contains("sliding_window") && j["sliding_window"].is_null()) c->sliding_window = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window));
  if (gemma3) {
    c->rope_local_base_freq = 10000.0;
    MEGATRAIN_RETURN_IF_ERROR(r.Double("rope_local_base_freq", &c->rope_local_base_freq));
  }
  // layer_types, else the pattern: Gemma 2 slides on even layers
  // (is_sliding = not layer_idx % 2); Gemma 3 on all but every
  // sliding_window_pattern-th ((layer_idx + 1) % pattern != 0).
  auto it = j.find("layer_types");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) return r.Error("layer_types", "expected a list of strings");
    for (size_t l = 0; l < it->size(); ++l) {
      const json& t = (*it)[l];
      if (t == "sliding_attention") {
        c->layer_types.push_back(LayerType::kSlidingAttention);
      } else if (t == "full_attention") {
        c->layer_types.push_back(LayerType::kFullAttention);
      } else {
        return absl::UnimplementedError(
            absl::StrCat(r.source(), ": layer_types[", l, "]: ", t.dump(),
                         " is not supported (supported: sliding_attention, full_attention)"));
      }
    }
  } else {
    int64_t pattern = gemma3 ? 6 : 2;
    MEGATRAIN_RETURN_IF_ERROR(r.Int("_sliding_window_pattern", &pattern));
    MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window_pattern", &pattern));
    if (pattern < 1) return r.Error("sliding_window_pattern", "must be >= 1");
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
      c->layer_types.push_back((l + 1) % pattern != 0 ? LayerType::kSlidingAttention
                                                      : LayerType::kFullAttention);
    }
  }
  if (c->sliding_window == 0) {
    for (LayerType& t : c->layer_types) t = LayerType::kFullAttention;
  }
  return absl::OkStatus();
}

// Phi-3 fields (HF configuration_phi3.py).
absl::Status ParsePhi3Fields(const json& j, const JsonFieldReader& r, ModelConfig* c) {
  c->fused_qkv = true;
  c->fused_gate_up = true;
  if (c->attention_bias) {
    return absl::UnimplementedError(
        absl::StrCat(r.source(), ": attention_bias: Phi-3 projections have no bias"));
  }
  MEGATRAIN_RETURN_IF_ERROR(r.Double("partial_rotary_factor", &c->partial_rotary_factor));
  if (c->rope_scaling.type == RopeScalingType::kLongRope) {
    // HF reads the top-level field (transformers 4) or the one inside
    // rope_parameters (5), else max_position_embeddings.
    int64_t original = 0;
    MEGATRAIN_RETURN_IF_ERROR(r.Int("original_max_position_embeddings", &original));
    bool in_rope_object = false;
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      auto it = j.find(key);
      in_rope_object |=
          it != j.end() && it->is_object() && it->contains("original_max_position_embeddings");
    }
    if (original > 0) {
      c->rope_scaling.original_max_position_embeddings = original;
    } else if (!in_rope_object) {
      c->rope_scaling.original_max_position_embeddings = c->max_position_embeddings;
    }
  } else if (c->rope_scaling.type != RopeScalingType::kNone) {
    return absl::UnimplementedError(absl::StrCat(
        r.source(), ": rope_scaling.rope_type: only default and longrope are supported for phi3"));
  }
  int64_t window = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window", &window));
  c->sliding_window = window;
  return absl::OkStatus();
}

// A multimodal Gemma 3 config (model_type "gemma3"): the text tower's
// fields are under text_config (HF configuration_gemma3.py Gemma3Config),
// some inherited from the top level.
absl::StatusOr<ModelConfig> ParseGemma3TextConfig(const json& j, absl::string_view source) {
  json text = j["text_config"];
  text["model_type"] = "gemma3_text";
  for (const char* inherited :
       {"bos_token_id", "eos_token_id", "torch_dtype", "tie_word_embeddings"}) {
    if (!text.contains(inherited) && j.contains(inherited)) text[inherited] = j[inherited];
  }
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig c,
                             ParseHfConfig(text.dump(), absl::StrCat(source, ": text_config")));
  c.multimodal_checkpoint = true;
  return c;
}

// The fields every dense family has: sizes, norms, RoPE, embeddings and
// special tokens.
absl::Status ParseCommonFields(const json& j, const JsonFieldReader& r, ModelConfig* c) {
  for (const char* required : {"vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads"}) {
    if (!j.contains(required)) return r.Error(required, "missing");
  }
  MEGATRAIN_RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_key_value_heads));
  c->head_dim = c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings));
  MEGATRAIN_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
  MEGATRAIN_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta));
  MEGATRAIN_RETURN_IF_ERROR(ParseRopeScaling(j, r.source(), c));
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("attention_bias", &c->attention_bias));
  MEGATRAIN_RETURN_IF_ERROR(r.TokenId("bos_token_id", &c->bos_token_id));
  MEGATRAIN_RETURN_IF_ERROR(r.TokenId("eos_token_id", &c->eos_token_id));
  MEGATRAIN_RETURN_IF_ERROR(r.String("torch_dtype", &c->torch_dtype));
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
    c->has_pad_token_id = true;
    MEGATRAIN_RETURN_IF_ERROR(r.Int("pad_token_id", &c->pad_token_id));
  }
  return absl::OkStatus();
}

// The MLP's activation (Gemma's fields, or SwiGLU's `hidden_act`) and its
// biases (none supported).
absl::Status ParseMlpFields(const json& j, const JsonFieldReader& r, const FamilyTraits& family,
                            ModelConfig* c) {
  if (family.gemma_style) {
    MEGATRAIN_RETURN_IF_ERROR(ParseGemmaFields(j, r, c));
  } else {
    std::string hidden_act = "silu";
    MEGATRAIN_RETURN_IF_ERROR(r.String("hidden_act", &hidden_act));
    if (hidden_act != "silu") {
      return absl::UnimplementedError(absl::StrCat(r.source(), ": hidden_act: '", hidden_act,
                                                   "' is not supported (SwiGLU needs 'silu')"));
    }
  }
  bool mlp_bias = false;
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) {
    return absl::UnimplementedError(absl::StrCat(r.source(), ": mlp_bias: true is not supported"));
  }
  return absl::OkStatus();
}

// Sliding window of Llama, Mistral, Qwen2 and Qwen3: Mistral applies
// `sliding_window` when set; Qwen2/Qwen3 only when `use_sliding_window` is
// true (HF configuration_qwen2.py); Llama never.
absl::Status ParseSlidingWindow(const JsonFieldReader& r, ModelConfig* c) {
  int64_t window = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window", &window));
  bool use_sliding_window = c->model_type == "mistral";
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("use_sliding_window", &use_sliding_window));
  if (c->model_type == "llama") use_sliding_window = false;
  c->sliding_window = use_sliding_window ? window : 0;
  if (c->model_type == "qwen2" || c->model_type == "qwen3") {
    // max_window_layers: layers below it use full attention. Supporting a
    // mixed model is not done; refuse rather than train the wrong thing.
    int64_t max_window_layers = c->num_hidden_layers;
    MEGATRAIN_RETURN_IF_ERROR(r.Int("max_window_layers", &max_window_layers));
    if (use_sliding_window && max_window_layers > 0 && max_window_layers < c->num_hidden_layers) {
      return absl::UnimplementedError(absl::StrCat(
          r.source(), ": max_window_layers: sliding window on only some layers is not supported"));
    }
  }
  return absl::OkStatus();
}

// A dense family's config.json: its model_type, the common fields, then
// the family's own.
absl::StatusOr<ModelConfig> ParseDenseConfig(const json& j, absl::string_view source) {
  JsonFieldReader r(j, source);
  ModelConfig c;
  c.model_type.clear();
  MEGATRAIN_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  if (c.model_type.empty()) return r.Error("model_type", "missing");
  const FamilyTraits* family = FindFamily(c.model_type);
  if (family == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": model_type: '", c.model_type,
                     "' is not supported (supported: ", SupportedFamilies(), ")"));
  }
  MEGATRAIN_RETURN_IF_ERROR(ParseCommonFields(j, r, &c));
  // Before anything is sized by them (Gemma's layer pattern below).
  if (absl::Status bounded = CheckModelBounds(c); !bounded.ok()) return Annotate(bounded, source);
  MEGATRAIN_RETURN_IF_ERROR(ParseMlpFields(j, r, *family, &c));
  if (c.model_type == "qwen3") c.qk_norm = true;
  if (family->fused_projections) MEGATRAIN_RETURN_IF_ERROR(ParsePhi3Fields(j, r, &c));
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2" ||
      c.model_type == "qwen3") {
    MEGATRAIN_RETURN_IF_ERROR(ParseSlidingWindow(r, &c));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return Annotate(valid, source);
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json_text, absl::string_view source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  // The MoE families parse their own fields and this function's on the
  // dense family underneath (moe_config.h).
  if (auto type = j.find("model_type");
      type != j.end() && type->is_string() && IsMoeModelType(type->get<std::string>())) {
    MEGATRAIN_ASSIGN_OR_RETURN(MoeModelConfig m, ParseMoeHfConfig(json_text, source));
    ModelConfig config = ModelConfigOf(m);
    // The experts count in the total (Note [Model bounds]).
    if (absl::Status bounded = CheckModelBounds(config); !bounded.ok()) {
      return Annotate(bounded, source);
    }
    return config;
  }
  if (j.value("model_type", "") == "gemma3" && j.contains("text_config") &&
      j["text_config"].is_object()) {
    return ParseGemma3TextConfig(j, source);
  }
  return ParseDenseConfig(j, source);
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

// Published config.json fields of google/gemma-2-2b and
// microsoft/Phi-3-mini-4k-instruct, parsed like any HF directory.
constexpr char kGemma2_2bConfig[] = R"({"model_type": "gemma2", "vocab_size": 256000,
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "tie_word_embeddings": true, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})";
constexpr char kPhi3MiniConfig[] = R"({"model_type": "phi3", "vocab_size": 32064,
    "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": null, "sliding_window": 2047, "hidden_act": "silu",
    "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 32000,
    "pad_token_id": 32000})";

// Mixture-of-experts benchmark shapes (issue 17): Qwen3-MoE-shaped, 7.4B
// parameters of which 1.7B active (1.1B without the embedding and lm_head;
// 16 layers, hidden 2048, 64 experts of intermediate 1024, top-8), and
// Mixtral-shaped of similar total size (6.7B, 1.9B active; 16 layers,
// hidden 2048, 8 experts of intermediate 8192, top-2). The aux loss is on, as in training.
constexpr char kQwen3Moe7bConfig[] = R"({"model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
    "output_router_logits": true, "router_aux_loss_coef": 0.001,
    "bos_token_id": 151643, "eos_token_id": 151645})";
constexpr char kMixtral7bConfig[] = R"({"model_type": "mixtral", "vocab_size": 32000,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
    "output_router_logits": true, "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
    "bos_token_id": 1, "eos_token_id": 2})";

// Smaller MoE benchmark shapes that fit a 128 GiB host at ~18 bytes per
// parameter (fp32 master, gradient, two AdamW moments, bf16 streaming copy)
// with margin, for the GPU speed comparison against transformers resident
// (deploy/family_baseline.py has the same fields):
//   qwen3-moe-4b: 16 layers x (attention 18.9M + 32 experts x 3 x 2048 x
//     1024 = 201.3M + router 65.5K + norms) = 3.53B, + embedding and
//     lm_head 2 x 151936 x 2048 = 0.62B: 4.15B total (~75 GB at 18 B/param);
//     active (top-8 of 32): 1.73B.
//   mixtral-4b: 16 layers x (attention 10.5M + 8 experts x 3 x 2048 x 4608 =
//     226.5M + router 16.4K) = 3.79B, + 2 x 32000 x 2048 = 0.13B: 3.92B
//     total (~71 GB); active (top-2 of 8): 1.20B.
constexpr char kQwen3Moe4bConfig[] = R"({"model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 32, "num_experts_per_tok": 8, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
    "output_router_logits": true, "router_aux_loss_coef": 0.001,
    "bos_token_id": 151643, "eos_token_id": 151645})";
constexpr char kMixtral4bConfig[] = R"({"model_type": "mixtral", "vocab_size": 32000,
    "hidden_size": 2048, "intermediate_size": 4608, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
    "output_router_logits": true, "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
    "bos_token_id": 1, "eos_token_id": 2})";

std::vector<std::string> PresetNames() {
  return {"tiny",      "llama-1b",     "llama-3b",   "llama-8b",     "gemma2-2b",
          "phi3-mini", "qwen3-moe-7b", "mixtral-7b", "qwen3-moe-4b", "mixtral-4b"};
}

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
  if (name == "gemma2-2b") return ParseHfConfig(kGemma2_2bConfig, "preset gemma2-2b");
  if (name == "phi3-mini") return ParseHfConfig(kPhi3MiniConfig, "preset phi3-mini");
  if (name == "qwen3-moe-7b") return ParseHfConfig(kQwen3Moe7bConfig, "preset qwen3-moe-7b");
  if (name == "mixtral-7b") return ParseHfConfig(kMixtral7bConfig, "preset mixtral-7b");
  if (name == "qwen3-moe-4b") return ParseHfConfig(kQwen3Moe4bConfig, "preset qwen3-moe-4b");
  if (name == "mixtral-4b") return ParseHfConfig(kMixtral4bConfig, "preset mixtral-4b");
  // A path that names no directory reaches here from the tools that take
  // either (megatrain-bench --model, megatrain-logits --model).
  const std::string known =
      absl::StrCat("(known presets: ", absl::StrJoin(PresetNames(), ", "), ")");
  if (absl::StrContains(name, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.preset: '", name, "' is neither a model directory nor a preset ", known));
  }
  return absl::InvalidArgumentError(absl::StrCat("model.preset: unknown '", name, "' ", known));
}

}  // namespace megatrain::engine
