// HF config.json parsing and validation for the MoE families (see
// moe_config.h for the families and sources).
#include "engine/model/moe_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/json_field_reader.h"
#include "engine/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using nlohmann::json;

// Upper bounds on caller-controlled sizes (the largest released models have
// 256 experts and 8 per token; the bounds only stop absurd allocations).
constexpr int64_t kMaxExperts = kMaxMoeExperts;  // model_config.h
constexpr int64_t kMaxLayers = 100000;

absl::StatusOr<MoeFamily> FamilyOf(absl::string_view model_type, absl::string_view source) {
  if (model_type == "mixtral") return MoeFamily::kMixtral;
  if (model_type == "qwen2_moe") return MoeFamily::kQwen2Moe;
  if (model_type == "qwen3_moe") return MoeFamily::kQwen3Moe;
  if (model_type == "gpt_oss") return MoeFamily::kGptOss;
  return absl::UnimplementedError(
      absl::StrCat(source, ": model_type: '", model_type,
                   "' is not a supported mixture-of-experts family (supported: mixtral, qwen2_moe, "
                   "qwen3_moe, gpt_oss)"));
}

// The dense family whose parser reads the attention fields.
const char* DenseBase(MoeFamily family) {
  switch (family) {
    case MoeFamily::kMixtral:
      return "mistral";
    case MoeFamily::kQwen2Moe:
      return "qwen2";
    case MoeFamily::kQwen3Moe:
      return "qwen3";
    case MoeFamily::kGptOss:
      return "llama";
  }
  return "llama";
}

// YaRN from `rope_parameters` (transformers 5) or `rope_scaling` (4.x).
// Sets `yarn` and removes the object from `j` so that the dense parser,
// which does not know YaRN, reads only rope_theta.
absl::Status TakeYarn(json* j, absl::string_view source, YarnRope* yarn) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j->find(key);
    if (it == j->end() || !it->is_object()) continue;
    std::string type;
    JsonFieldReader rp(*it, source, absl::StrCat(key, "."));
    MEGATRAIN_RETURN_IF_ERROR(rp.String("type", &type));
    MEGATRAIN_RETURN_IF_ERROR(rp.String("rope_type", &type));
    if (type != "yarn") continue;
    yarn->enabled = true;
    double factor = 0.0;
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("factor", &factor));
    yarn->factor = factor;  // 0: max_position_embeddings / original (below)
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("beta_fast", &yarn->beta_fast));
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("beta_slow", &yarn->beta_slow));
    MEGATRAIN_RETURN_IF_ERROR(
        rp.Int("original_max_position_embeddings", &yarn->original_max_position_embeddings));
    MEGATRAIN_RETURN_IF_ERROR(rp.Bool("truncate", &yarn->truncate));
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("attention_factor", &yarn->attention_factor));
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("mscale", &yarn->mscale));
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("mscale_all_dim", &yarn->mscale_all_dim));
    double theta = 0.0;
    MEGATRAIN_RETURN_IF_ERROR(rp.Double("rope_theta", &theta));
    if (theta > 0) (*j)["rope_theta"] = theta;
    j->erase("rope_parameters");
    j->erase("rope_scaling");
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Per-layer sliding windows from `layer_types` (or uniform `dense_window`).
absl::Status ParseLayerTypes(const json& j, absl::string_view source, int64_t num_layers,
                             int64_t dense_window, MoeConfig* moe) {
  moe->layer_sliding_window.assign(static_cast<size_t>(std::max<int64_t>(num_layers, 0)),
                                   dense_window);
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  JsonFieldReader r(j, source);
  if (!it->is_array() || static_cast<int64_t>(it->size()) != num_layers) {
    return r.Error("layer_types", absl::StrCat("expected a list of num_hidden_layers (", num_layers,
                                               ") strings, got ", it->dump()));
  }
  int64_t window = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("sliding_window", &window));
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    if (type == "full_attention") {
      moe->layer_sliding_window[i] = 0;
    } else if (type == "sliding_attention") {
      if (window <= 0) {
        return r.Error("sliding_window", absl::StrCat("must be > 0 when layer_types[", i,
                                                      "] is 'sliding_attention', got ", window));
      }
      moe->layer_sliding_window[i] = window;
    } else {
      return absl::UnimplementedError(
          absl::StrCat(source, ": layer_types[", i, "]: '", type,
                       "' is not supported (supported: full_attention, sliding_attention)"));
    }
  }
  return absl::OkStatus();
}

// The dense attention (layers.cc DecoderAttention) reads a layer's window
// from base.layer_types and base.sliding_window: set them from the
// per-layer windows. Every family has one window for all its sliding
// layers; UNIMPLEMENTED naming `layer_types` otherwise.
absl::Status MarkSlidingLayers(const MoeConfig& m, absl::string_view source, ModelConfig* base) {
  int64_t window = 0;
  for (const int64_t w : m.layer_sliding_window) {
    if (w > 0 && window > 0 && w != window) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": layer_types: sliding layers with different windows are not supported"));
    }
    if (w > 0) window = w;
  }
  if (window == 0) return absl::OkStatus();
  base->sliding_window = window;
  base->layer_types.clear();
  for (const int64_t w : m.layer_sliding_window) {
    base->layer_types.push_back(w > 0 ? LayerType::kSlidingAttention : LayerType::kFullAttention);
  }
  return absl::OkStatus();
}

// The MoE fields of each family, with HF's defaults (configuration_*.py).
absl::Status ParseMoeFields(const json& j, absl::string_view source, const ModelConfig& base,
                            MoeConfig* m) {
  JsonFieldReader r(j, source);
  // E: `num_local_experts` (mixtral, gpt_oss; qwen3_moe as transformers 5
  // writes it) or `num_experts` (qwen2_moe; qwen3_moe before 5).
  m->num_experts = 0;
  int64_t local = 0, experts = 0;
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_local_experts", &local));
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_experts", &experts));
  if (local != 0 && experts != 0 && local != experts) {
    return r.Error("num_experts",
                   absl::StrCat("disagrees with num_local_experts (", local, "), got ", experts));
  }
  m->num_experts = local != 0 ? local : experts;
  if (m->num_experts == 0) return r.Error("num_local_experts", "missing (nor num_experts)");
  if (!r.Has("num_experts_per_tok")) return r.Error("num_experts_per_tok", "missing");
  MEGATRAIN_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &m->num_experts_per_tok));
  MEGATRAIN_RETURN_IF_ERROR(r.Bool("output_router_logits", &m->output_router_logits));
  MEGATRAIN_RETURN_IF_ERROR(r.Double("router_aux_loss_coef", &m->router_aux_loss_coef));
  // No family here has a router other than softmax scoring; configs of
  // other routers (DeepSeek's `scoring_func` "sigmoid", `topk_method`
  // "group_limited_greedy") are refused rather than misread.
  std::string scoring = "softmax";
  MEGATRAIN_RETURN_IF_ERROR(r.String("scoring_func", &scoring));
  if (scoring != "softmax") {
    return absl::UnimplementedError(absl::StrCat(source, ": scoring_func: router '", scoring,
                                                 "' is not supported (supported: softmax)"));
  }
  std::string topk_method = "greedy";
  MEGATRAIN_RETURN_IF_ERROR(r.String("topk_method", &topk_method));
  if (topk_method != "greedy") {
    return absl::UnimplementedError(absl::StrCat(source, ": topk_method: router '", topk_method,
                                                 "' is not supported (supported: greedy)"));
  }
  switch (m->family) {
    case MoeFamily::kMixtral:
      m->moe_intermediate_size = base.intermediate_size;
      m->norm_topk_prob = true;
      MEGATRAIN_RETURN_IF_ERROR(r.Double("router_jitter_noise", &m->router_jitter_noise));
      break;
    case MoeFamily::kQwen2Moe:
    case MoeFamily::kQwen3Moe: {
      if (!r.Has("moe_intermediate_size")) return r.Error("moe_intermediate_size", "missing");
      MEGATRAIN_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &m->moe_intermediate_size));
      m->norm_topk_prob = false;
      MEGATRAIN_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &m->norm_topk_prob));
      MEGATRAIN_RETURN_IF_ERROR(r.Int("decoder_sparse_step", &m->decoder_sparse_step));
      MEGATRAIN_RETURN_IF_ERROR(r.IntList("mlp_only_layers", &m->mlp_only_layers));
      if (m->family == MoeFamily::kQwen2Moe) {
        if (!r.Has("shared_expert_intermediate_size")) {
          return r.Error("shared_expert_intermediate_size", "missing");
        }
        MEGATRAIN_RETURN_IF_ERROR(
            r.Int("shared_expert_intermediate_size", &m->shared_expert_intermediate_size));
        bool qkv_bias = true;
        MEGATRAIN_RETURN_IF_ERROR(r.Bool("qkv_bias", &qkv_bias));
        if (!qkv_bias) {
          return absl::UnimplementedError(
              absl::StrCat(source, ": qkv_bias: false is not supported for qwen2_moe"));
        }
      }
      break;
    }
    case MoeFamily::kGptOss:
      m->moe_intermediate_size = base.intermediate_size;
      m->router_type = RouterType::kTopKSoftmax;
      m->activation = ExpertActivation::kClampedSwiGlu;
      m->expert_layout = ExpertLayout::kInterleavedColumns;
      m->router_bias = true;
      m->attention_sinks = true;
      MEGATRAIN_RETURN_IF_ERROR(r.Double("swiglu_limit", &m->swiglu_limit));
      break;
  }
  return absl::OkStatus();
}

absl::Status InRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be in [", lo, ", ", hi, "], got ", value));
}

}  // namespace

bool MoeConfig::IsMoeLayer(int64_t layer_idx) const {
  if (family != MoeFamily::kQwen2Moe && family != MoeFamily::kQwen3Moe) return true;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer_idx) !=
      mlp_only_layers.end()) {
    return false;
  }
  return num_experts > 0 && (layer_idx + 1) % decoder_sparse_step == 0;
}

absl::Status MoeConfig::Validate(int64_t num_hidden_layers) const {
  MEGATRAIN_RETURN_IF_ERROR(InRange("num_experts", num_experts, 1, kMaxExperts));
  MEGATRAIN_RETURN_IF_ERROR(InRange("num_experts_per_tok", num_experts_per_tok, 1, num_experts));
  MEGATRAIN_RETURN_IF_ERROR(
      InRange("moe_intermediate_size", moe_intermediate_size, 1, kMaxMoeIntermediateSize));
  MEGATRAIN_RETURN_IF_ERROR(InRange("shared_expert_intermediate_size",
                                    shared_expert_intermediate_size, 0, kMaxMoeIntermediateSize));
  MEGATRAIN_RETURN_IF_ERROR(InRange("decoder_sparse_step", decoder_sparse_step, 1, kMaxLayers));
  for (int64_t layer_idx : mlp_only_layers) {
    MEGATRAIN_RETURN_IF_ERROR(InRange("mlp_only_layers", layer_idx, 0, num_hidden_layers - 1));
  }
  if (!(router_aux_loss_coef >= 0 && std::isfinite(router_aux_loss_coef))) {
    return absl::InvalidArgumentError(
        absl::StrCat("router_aux_loss_coef: must be finite and >= 0, got ", router_aux_loss_coef));
  }
  if (!(router_jitter_noise >= 0 && router_jitter_noise < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("router_jitter_noise: must be in [0, 1), got ", router_jitter_noise));
  }
  if (activation == ExpertActivation::kClampedSwiGlu &&
      !(swiglu_limit > 0 && std::isfinite(swiglu_limit))) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu_limit: must be finite and > 0, got ", swiglu_limit));
  }
  if (static_cast<int64_t>(layer_sliding_window.size()) != num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_types: ", layer_sliding_window.size(),
                                                   " entries for ", num_hidden_layers, " layers"));
  }
  if (yarn.enabled) {
    if (!(yarn.factor > 0) || !(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) ||
        yarn.original_max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rope_parameters: yarn needs factor, beta_fast, beta_slow and "
          "original_max_position_embeddings > 0, got factor ",
          yarn.factor, ", beta_fast ", yarn.beta_fast, ", beta_slow ", yarn.beta_slow,
          ", original_max_position_embeddings ", yarn.original_max_position_embeddings));
    }
  }
  return absl::OkStatus();
}

bool IsMoeModelType(absl::string_view model_type) { return FamilyOf(model_type, "").ok(); }

absl::StatusOr<MoeModelConfig> ParseMoeHfConfig(absl::string_view json_text,
                                                absl::string_view source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  MoeModelConfig out;
  MoeConfig& m = out.moe;
  JsonFieldReader r(j, source);
  MEGATRAIN_RETURN_IF_ERROR(r.String("model_type", &m.model_type));
  if (m.model_type.empty()) return r.Error("model_type", "missing");
  MEGATRAIN_ASSIGN_OR_RETURN(m.family, FamilyOf(m.model_type, source));
  m.hf_config_json = j.dump();

  // Phase 1: the attention, norm and embedding fields through the dense
  // parser of the underlying family, on a copy without the MoE-only RoPE.
  json dense = j;
  dense["model_type"] = DenseBase(m.family);
  MEGATRAIN_RETURN_IF_ERROR(TakeYarn(&dense, source, &m.yarn));
  MEGATRAIN_ASSIGN_OR_RETURN(out.base, ParseHfConfig(dense.dump(), source));
  if (m.yarn.enabled) {
    if (m.yarn.original_max_position_embeddings == 0) {
      m.yarn.original_max_position_embeddings = out.base.max_position_embeddings;
    }
    // HF: a missing factor is max_position_embeddings / original.
    if (m.yarn.factor == 0.0) {
      m.yarn.factor = static_cast<double>(out.base.max_position_embeddings) /
                      static_cast<double>(m.yarn.original_max_position_embeddings);
    }
  }

  // Phase 2: the MoE fields, then everything checked together.
  MEGATRAIN_RETURN_IF_ERROR(ParseMoeFields(j, source, out.base, &m));
  const int64_t layers = out.base.num_hidden_layers;
  if (layers > kMaxLayers) {
    return r.Error("num_hidden_layers", absl::StrCat("must be <= ", kMaxLayers, ", got ", layers));
  }
  MEGATRAIN_RETURN_IF_ERROR(ParseLayerTypes(j, source, layers, out.base.sliding_window, &m));
  MEGATRAIN_RETURN_IF_ERROR(MarkSlidingLayers(m, source, &out.base));
  absl::Status valid = m.Validate(layers);
  if (!valid.ok()) return Annotate(valid, source);
  return out;
}

absl::StatusOr<MoeModelConfig> LoadMoeHfConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseMoeHfConfig(buffer.str(), path);
}

std::string MoeHfConfigJson(const MoeModelConfig& config) {
  const MoeConfig& m = config.moe;
  json j;
  if (!m.hf_config_json.empty()) {
    j = json::parse(m.hf_config_json, nullptr, /*allow_exceptions=*/false);
  }
  if (!j.is_object()) {  // built in code: the dense fields, then the MoE ones
    ModelConfig dense = config.base;
    dense.moe.reset();
    j = json::parse(dense.ToHfConfigJson());
    const char* architecture = "MixtralForCausalLM";
    switch (m.family) {
      case MoeFamily::kMixtral:
        j["num_local_experts"] = m.num_experts;
        j["router_jitter_noise"] = m.router_jitter_noise;
        break;
      case MoeFamily::kQwen2Moe:
      case MoeFamily::kQwen3Moe:
        architecture =
            m.family == MoeFamily::kQwen2Moe ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM";
        j["num_experts"] = m.num_experts;
        j["moe_intermediate_size"] = m.moe_intermediate_size;
        j["norm_topk_prob"] = m.norm_topk_prob;
        j["decoder_sparse_step"] = m.decoder_sparse_step;
        j["mlp_only_layers"] = m.mlp_only_layers;
        if (m.family == MoeFamily::kQwen2Moe) {
          j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
        }
        break;
      case MoeFamily::kGptOss:
        architecture = "GptOssForCausalLM";
        j["num_local_experts"] = m.num_experts;
        j["swiglu_limit"] = m.swiglu_limit;
        break;
    }
    j["architectures"] = {architecture};
    j["model_type"] = m.model_type;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
  }
  const char* dtype_key =
      j.contains("torch_dtype") && !j.contains("dtype") ? "torch_dtype" : "dtype";
  j[dtype_key] = config.base.torch_dtype;
  j["output_router_logits"] = m.output_router_logits;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  return j.dump(2);
}

}  // namespace megatrain::engine
