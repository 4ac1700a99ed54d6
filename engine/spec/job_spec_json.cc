// See job_spec_json.h.
#include "engine/spec/job_spec_json.h"

#include "absl/strings/str_cat.h"
#include "engine/spec/keyword.h"
#include "engine/spec/spec_fields.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using nlohmann::json;

// Reads j[key] into *out when present and not null; throws json::exception
// for a value of the wrong type.
template <typename T>
void Get(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) *out = it->get<T>();
}

// j[key] when it is an object, else an empty object (a missing section
// keeps its defaults).
const json& Section(const json& j, const char* key) {
  static const json* empty = new json(json::object());
  auto it = j.find(key);
  return (it != j.end() && it->is_object()) ? *it : *empty;
}

// Fields added after the format was pinned (job_spec_test's former-writer
// bytes) are written only when they differ from their default, so that a
// default spec keeps its bytes and older readers see what they know.
// Note [Spec field table]: a row's value into `j` (kPinned always,
// kIfSet when it differs from the section's default).
constexpr bool kPinned = true;
constexpr bool kIfSet = false;
template <typename T>
void PutField(json& j, const char* key, const T& value, const T& default_value, bool pinned) {
  if (pinned || value != default_value) j[key] = value;
}

// A keyword row's word into `j`, as PutField.
template <typename T, size_t N>
void PutKeyword(json& j, const char* key, const T& value, const T& default_value, bool pinned,
                const Keyword<T> (&keywords)[N]) {
  if (!pinned && value == default_value) return;
  const char* word = KeywordName(keywords, value);
  j[key] = word != nullptr ? word : "?";  // "?": an enum cast from a bad integer
}

// A keyword row from `section` into `*out`: absent, null or empty keeps
// `*out`; DATA_LOSS "job spec JSON: <field>: must be ..." for an unknown word
// (the text was written by us).
template <typename T, size_t N>
absl::Status GetKeyword(const json& section, const char* key, absl::string_view field,
                        const Keyword<T> (&keywords)[N], T* out) {
  std::string word;
  Get(section, key, &word);
  if (word.empty()) return absl::OkStatus();
  absl::StatusOr<T> value = ParseKeyword(keywords, word, field);
  if (!value.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", value.status().message()));
  }
  *out = *value;
  return absl::OkStatus();
}

// The rows of one section (Note [Spec field table]), written with
// `defaults` as the section's default and read back; `prefix` is the
// section's field path ("train.").
#define MEGATRAIN_JSON_PUT_NUMBER(name, kind, range, pinned, proto) \
  PutField(j, #name, section.name, defaults.name, pinned);
#define MEGATRAIN_JSON_PUT_KEYWORD(name, keywords, pinned) \
  PutKeyword(j, #name, section.name, defaults.name, pinned, keywords);
#define MEGATRAIN_JSON_GET_NUMBER(name, kind, range, pinned, proto) Get(j, #name, &section->name);
#define MEGATRAIN_JSON_GET_KEYWORD(name, keywords, pinned)                             \
  if (absl::Status status =                                                            \
          GetKeyword(j, #name, absl::StrCat(prefix, #name), keywords, &section->name); \
      !status.ok()) {                                                                  \
    return status;                                                                     \
  }

json TrainToJson(const TrainSpec& t) {
  json j = {{"compute_dtype", ComputeDtypeName(t.compute_dtype)},
            {"seed", t.seed},
            {"nan_policy", NanPolicyName(t.nan_policy)},
            {"offload_activations", t.offload_activations}};
  if (t.allow_seq_len_above_max_position_embeddings) {
    j["allow_seq_len_above_max_position_embeddings"] = true;
  }
  if (t.devices != 1) j["devices"] = t.devices;
  if (t.resident_layers != kAutoResidentLayers) j["resident_layers"] = t.resident_layers;
  const TrainSpec& section = t;
  const TrainSpec defaults;
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_JSON_PUT_NUMBER)
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_JSON_PUT_KEYWORD)
  return j;
}

json OptimizerToJson(const OptimizerSpec& section) {
  json j = {{"warmup_steps", section.warmup_steps}};
  const OptimizerSpec defaults;
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_JSON_PUT_NUMBER)
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_JSON_PUT_KEYWORD)
  return j;
}

json EvalToJson(const EvalSpec& section) {
  json j = json::object();
  const EvalSpec defaults;
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_JSON_PUT_NUMBER)
  return j;
}

json CheckpointToJson(const CheckpointSpec& section) {
  json j = json::object();
  const CheckpointSpec defaults;
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_JSON_PUT_NUMBER)
  return j;
}

// Empty for a default memory section (then the spec has no "memory" key).
json MemoryToJson(const MemorySpec& section) {
  json j = json::object();
  const MemorySpec defaults;
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_JSON_PUT_KEYWORD)
  return j;
}

absl::Status ModelAndDataFromJson(const json& j, JobSpec* spec) {
  const json& model = Section(j, "model");
  Get(model, "preset", &spec->model.preset);
  Get(model, "hf_dir", &spec->model.hf_dir);
  if (auto it = model.find("output_router_logits"); it != model.end() && !it->is_null()) {
    spec->model.output_router_logits = it->get<bool>();
  }
  // Absent (no init_from, or a spec written before the field): none.
  if (auto it = model.find("init_from"); it != model.end() && it->is_object()) {
    Get(*it, "checkpoint", &spec->model.init_from.checkpoint);
    Get(*it, "checkpoint_dir", &spec->model.init_from.checkpoint_dir);
    if (auto h = it->find("manifest_xxh64"); h != it->end() && h->is_number_unsigned()) {
      spec->model.init_from.manifest_xxh64 = h->get<uint64_t>();
    }
    std::string optimizer(InitOptimizerName(spec->model.init_from.optimizer));
    Get(*it, "optimizer", &optimizer);
    absl::StatusOr<InitOptimizer> parsed = ParseInitOptimizer(optimizer);
    if (!parsed.ok()) {
      return absl::DataLossError(absl::StrCat("job spec JSON: ", parsed.status().message()));
    }
    spec->model.init_from.optimizer = *parsed;
  }
  const json& data = Section(j, "data");
  Get(data, "tokens", &spec->data.tokens);
  Get(data, "eval_tokens", &spec->data.eval_tokens);
  Get(data, "text", &spec->data.text);
  Get(data, "tokenizer", &spec->data.tokenizer);
  Get(data, "eval_fraction", &spec->data.eval_fraction);
  Get(data, "shuffle_seed", &spec->data.shuffle_seed);
  // Absent (the default, or a spec written before the field): auto.
  std::string attention(DocumentAttentionName(spec->data.packing.document_attention));
  Get(Section(data, "packing"), "document_attention", &attention);
  absl::StatusOr<DocumentAttention> mode = ParseDocumentAttention(attention);
  if (!mode.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", mode.status().message()));
  }
  spec->data.packing.document_attention = *mode;
  return absl::OkStatus();
}

// The rows of the sections (Note [Spec field table]); absent keys keep
// their values, keywords absent before their field existed are the default.
absl::Status TrainRowsFromJson(const json& j, TrainSpec* section) {
  constexpr absl::string_view prefix = "train.";
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_JSON_GET_NUMBER)
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_JSON_GET_KEYWORD)
  return absl::OkStatus();
}

absl::Status OptimizerFromJson(const json& j, OptimizerSpec* section) {
  constexpr absl::string_view prefix = "optimizer.";
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_JSON_GET_NUMBER)
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_JSON_GET_KEYWORD)
  Get(j, "warmup_steps", &section->warmup_steps);
  return absl::OkStatus();
}

absl::Status EvalFromJson(const json& j, EvalSpec* section) {
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_JSON_GET_NUMBER)
  return absl::OkStatus();
}

absl::Status CheckpointFromJson(const json& j, CheckpointSpec* section) {
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_JSON_GET_NUMBER)
  return absl::OkStatus();
}

absl::Status MemoryFromJson(const json& j, MemorySpec* section) {
  constexpr absl::string_view prefix = "memory.";
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_JSON_GET_KEYWORD)
  return absl::OkStatus();
}

absl::Status TrainFromJson(const json& j, TrainSpec* t) {
  const json& train = Section(j, "train");
  std::string dtype = ComputeDtypeName(t->compute_dtype);
  Get(train, "compute_dtype", &dtype);
  absl::StatusOr<ComputeDtype> compute_dtype = ParseComputeDtype(dtype);
  if (!compute_dtype.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", compute_dtype.status().message()));
  }
  t->compute_dtype = *compute_dtype;
  Get(train, "seed", &t->seed);
  // Specs written before nan_policy replaced the bool skip_nonfinite_steps.
  bool skip_nonfinite_steps = t->nan_policy == NanPolicy::kSkip;
  Get(train, "skip_nonfinite_steps", &skip_nonfinite_steps);
  std::string nan_policy = skip_nonfinite_steps ? "skip" : "fail";
  Get(train, "nan_policy", &nan_policy);
  absl::StatusOr<NanPolicy> policy = ParseNanPolicy(nan_policy);
  if (!policy.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", policy.status().message()));
  }
  t->nan_policy = *policy;
  // Absent in specs written before the field existed: off, as they ran.
  Get(train, "offload_activations", &t->offload_activations);
  Get(train, "allow_seq_len_above_max_position_embeddings",
      &t->allow_seq_len_above_max_position_embeddings);
  Get(train, "devices", &t->devices);                  // absent before data parallelism: 1
  Get(train, "resident_layers", &t->resident_layers);  // absent: auto
  return TrainRowsFromJson(train, t);
}

}  // namespace

json JobSpecToJsonObject(const JobSpec& s) {
  json j;
  j["name"] = s.name;
  j["model"] = {{"preset", s.model.preset}, {"hf_dir", s.model.hf_dir}};
  if (s.model.output_router_logits.has_value()) {
    j["model"]["output_router_logits"] = *s.model.output_router_logits;
  }
  if (!s.model.init_from.checkpoint.empty()) {
    j["model"]["init_from"] = {{"checkpoint", s.model.init_from.checkpoint},
                               {"optimizer", InitOptimizerName(s.model.init_from.optimizer)},
                               {"checkpoint_dir", s.model.init_from.checkpoint_dir},
                               {"manifest_xxh64", s.model.init_from.manifest_xxh64}};
  }
  j["data"] = {{"tokens", s.data.tokens},
               {"eval_tokens", s.data.eval_tokens},
               {"text", s.data.text},
               {"tokenizer", s.data.tokenizer},
               {"eval_fraction", s.data.eval_fraction},
               {"shuffle_seed", s.data.shuffle_seed}};
  if (s.data.packing.document_attention != DocumentAttention::kAuto) {
    j["data"]["packing"] = {{"document_attention", std::string(DocumentAttentionName(
                                                       s.data.packing.document_attention))}};
  }
  j["train"] = TrainToJson(s.train);
  j["optimizer"] = OptimizerToJson(s.optimizer);
  j["eval"] = EvalToJson(s.eval);
  j["checkpoint"] = CheckpointToJson(s.checkpoint);
  if (json memory = MemoryToJson(s.memory); !memory.empty()) j["memory"] = std::move(memory);
  j["output_dir"] = s.output_dir;
  return j;
}

std::string JobSpecToJson(const JobSpec& spec) { return JobSpecToJsonObject(spec).dump(); }

absl::Status JobSpecFromJsonObject(const json& j, JobSpec* spec) {
  if (!j.is_object()) return absl::DataLossError("job spec JSON: not an object");
  try {
    Get(j, "name", &spec->name);
    if (absl::Status status = ModelAndDataFromJson(j, spec); !status.ok()) return status;
    if (absl::Status status = TrainFromJson(j, &spec->train); !status.ok()) return status;
    if (absl::Status status = OptimizerFromJson(Section(j, "optimizer"), &spec->optimizer);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = EvalFromJson(Section(j, "eval"), &spec->eval); !status.ok()) {
      return status;
    }
    if (absl::Status status = CheckpointFromJson(Section(j, "checkpoint"), &spec->checkpoint);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = MemoryFromJson(Section(j, "memory"), &spec->memory); !status.ok()) {
      return status;
    }
    Get(j, "output_dir", &spec->output_dir);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> JobSpecFromJson(absl::string_view text) {
  const json j = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError("job spec JSON: does not parse");
  JobSpec spec;
  if (absl::Status status = JobSpecFromJsonObject(j, &spec); !status.ok()) return status;
  return spec;
}

}  // namespace megatrain::engine
