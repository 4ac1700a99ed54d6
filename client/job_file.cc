// See job_file.h.
#include "client/job_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/spec/job_spec.h"  // the rows' members, ranges and keyword tables
#include "engine/spec/keyword.h"
#include "engine/spec/spec_fields.h"

namespace megatrain::client {
namespace {

namespace fs = std::filesystem;

// Offset of the first byte of `text` that is not well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or npos. The
// strings of a JobSpec must be UTF-8 (proto3): yaml-cpp passes other bytes
// through, and the daemon would refuse the whole request as unparsable.
size_t FirstNonUtf8Byte(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char lead = byte(i);
    size_t length = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) lo = 0xA0;  // overlong
      if (lead == 0xED) hi = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) lo = 0x90;  // overlong
      if (lead == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char c = byte(i + k);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += length;
  }
  return absl::string_view::npos;
}

// Reads one scalar of a job file; errors name the key path.
class Reader {
 public:
  Reader(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  absl::Status Error(absl::string_view path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", what));
  }

  absl::Status Scalar(const YAML::Node& node, absl::string_view path) const {
    if (!node.IsScalar()) {
      return Error(path, node.IsNull() ? "missing value" : "expected a single value");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Int(const YAML::Node& node, absl::string_view path) const {
    absl::Status status = Scalar(node, path);
    if (!status.ok()) return status;
    try {
      return node.as<int64_t>();
    } catch (const YAML::Exception&) {
      return Error(path, absl::StrCat("expected an integer, got '", node.Scalar(), "'"));
    }
  }

  absl::StatusOr<double> Double(const YAML::Node& node, absl::string_view path) const {
    absl::Status status = Scalar(node, path);
    if (!status.ok()) return status;
    try {
      return node.as<double>();
    } catch (const YAML::Exception&) {
      return Error(path, absl::StrCat("expected a number, got '", node.Scalar(), "'"));
    }
  }

  absl::StatusOr<bool> Bool(const YAML::Node& node, absl::string_view path) const {
    absl::Status status = Scalar(node, path);
    if (!status.ok()) return status;
    try {
      return node.as<bool>();
    } catch (const YAML::Exception&) {
      return Error(path, absl::StrCat("expected true or false, got '", node.Scalar(), "'"));
    }
  }

  absl::StatusOr<std::string> String(const YAML::Node& node, absl::string_view path) const {
    absl::Status status = Scalar(node, path);
    if (!status.ok()) return status;
    status = Utf8(node.Scalar(), path);
    if (!status.ok()) return status;
    return node.Scalar();
  }

  // INVALID_ARGUMENT naming `path` unless `text` is UTF-8.
  absl::Status Utf8(absl::string_view text, absl::string_view path) const {
    const size_t offset = FirstNonUtf8Byte(text);
    if (offset == absl::string_view::npos) return absl::OkStatus();
    return Error(path, absl::StrCat("not UTF-8 text (byte ", offset, " of the value)"));
  }

  // A path, made absolute against the job file's directory.
  absl::StatusOr<std::string> Path(const YAML::Node& node, absl::string_view path) const {
    absl::StatusOr<std::string> text = String(node, path);
    if (!text.ok() || text->empty()) return text;
    fs::path value(*text);
    if (value.is_relative()) value = fs::path(base_dir_) / value;
    return value.lexically_normal().string();
  }

 private:
  const std::string source_;
  const std::string base_dir_;
};

// Setter of one key: reads `node` (whose key path is `path`) into the spec.
using Field = std::function<absl::Status(const YAML::Node& node, const std::string& path)>;
using Fields = std::vector<std::pair<std::string, Field>>;

// Refuses a key that `seen` (the keys read so far from one mapping)
// already holds. yaml-cpp keeps every entry of a mapping, duplicates too
// (YAML 1.2 says keys are unique), and reading them in turn would let the
// later one replace the earlier without a word.
absl::Status CheckKeyOnce(const Reader& reader, const YAML::Node& key_node, const std::string& key,
                          const std::string& path, absl::flat_hash_set<std::string>& seen) {
  if (seen.insert(key).second) return absl::OkStatus();
  return reader.Error(path, absl::StrCat("given twice in one mapping (again on line ",
                                         key_node.Mark().line + 1, ")"));
}

// Walks a mapping: every key must be one of `fields`, and appear once.
absl::Status ReadMapping(const Reader& reader, const YAML::Node& node, const std::string& prefix,
                         const Fields& fields) {
  const std::string where = prefix.empty() ? "job file" : prefix;
  if (!node.IsMap()) {
    return reader.Error(where, node.IsNull() ? "missing value" : "expected a mapping of keys");
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const std::string path = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    absl::Status once = CheckKeyOnce(reader, entry.first, key, path, seen);
    if (!once.ok()) return once;
    const Field* setter = nullptr;
    for (const auto& [name, field] : fields) {
      if (name == key) setter = &field;
    }
    if (setter == nullptr) {
      std::vector<std::string> known;
      for (const auto& [name, field] : fields) known.push_back(name);
      return reader.Error(path,
                          absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
    }
    absl::Status status = (*setter)(entry.second, path);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Field helpers: bind a Reader method to a proto setter. The lambda copies
// the target message's pointer and refers to the reader: both outlive the
// parse (ParseJobYaml owns them).
#define MEGATRAIN_JOB_FIELD(name, kind, setter)                           \
  {                                                                       \
    name, [=, &reader](const YAML::Node& node, const std::string& path) { \
      auto value = reader.kind(node, path);                               \
      if (!value.ok()) return value.status();                             \
      setter(*value);                                                     \
      return absl::OkStatus();                                            \
    }                                                                     \
  }

// Note [Spec field table] (engine/spec/spec_fields.h): a number row is
// a key read as its kind (the daemon checks the range), a keyword row a
// key whose word must be one of its table's.
#define MEGATRAIN_YAML_Int Int
#define MEGATRAIN_YAML_Real Double
#define MEGATRAIN_YAML_NUMBER(name, kind, range, json, proto) \
  fields.push_back(MEGATRAIN_JOB_FIELD(#name, MEGATRAIN_YAML_##kind, section->set_##name));
#define MEGATRAIN_YAML_KEYWORD(name, keywords, json) \
  fields.push_back(                                  \
      {#name, KeywordField(reader, engine::keywords, \
                           [section](const std::string& word) { section->set_##name(word); })});

// A keyword of `keywords`, handed to `set`; INVALID_ARGUMENT "<path>: must
// be a, b or c, got '<word>'" for another word.
template <typename T, size_t N>
Field KeywordField(const Reader& reader, const engine::Keyword<T> (&keywords)[N],
                   std::function<void(const std::string&)> set) {
  return [&reader, &keywords, set](const YAML::Node& node, const std::string& path) {
    auto value = reader.String(node, path);
    if (!value.ok()) return value.status();
    if (!engine::ParseKeyword(keywords, *value, path).ok()) {
      return reader.Error(path, engine::KeywordError(keywords, *value));
    }
    set(*value);
    return absl::OkStatus();
  };
}

// An integer >= 0 (a seed), handed to `set`.
Field NonNegativeField(const Reader& reader, std::function<void(uint64_t)> set) {
  return [&reader, set](const YAML::Node& node, const std::string& path) {
    auto value = reader.Int(node, path);
    if (!value.ok()) return value.status();
    if (*value < 0) return reader.Error(path, absl::StrCat("must be >= 0, got ", *value));
    set(static_cast<uint64_t>(*value));
    return absl::OkStatus();
  };
}

// model.init_from: "job-000012/step-400" (a fresh optimizer), or a mapping
// {checkpoint: job-000012/step-400, optimizer: fresh | restore}.
Field InitFromField(const Reader& reader, v1::InitFrom* init) {
  return [&reader, init](const YAML::Node& node, const std::string& path) {
    if (node.IsScalar()) {
      auto value = reader.String(node, path);
      if (!value.ok()) return value.status();
      init->set_checkpoint(*value);
      return absl::OkStatus();
    }
    const Fields fields = {
        MEGATRAIN_JOB_FIELD("checkpoint", String, init->set_checkpoint),
        {"optimizer", [&reader, init](const YAML::Node& node, const std::string& path) {
           auto value = reader.String(node, path);
           if (!value.ok()) return value.status();
           if (*value != "fresh" && *value != "restore") {
             return reader.Error(path,
                                 absl::StrCat("must be fresh or restore, got '", *value, "'"));
           }
           init->set_optimizer(*value);
           return absl::OkStatus();
         }}};
    absl::Status status = ReadMapping(reader, node, path, fields);
    if (status.ok() && init->checkpoint().empty()) {
      return reader.Error(absl::StrCat(path, ".checkpoint"), "required");
    }
    return status;
  };
}

Fields ModelFields(const Reader& reader, v1::ModelSource* model) {
  return {
      MEGATRAIN_JOB_FIELD("preset", String, model->set_preset),
      MEGATRAIN_JOB_FIELD("hf_dir", Path, model->set_hf_dir),
      MEGATRAIN_JOB_FIELD("output_router_logits", Bool, model->set_output_router_logits),
      {"init_from", InitFromField(reader, model->mutable_init_from())},
  };
}

Fields DataFields(const Reader& reader, v1::DataSpec* data) {
  return {
      MEGATRAIN_JOB_FIELD("tokens", Path, data->set_tokens),
      MEGATRAIN_JOB_FIELD("eval_tokens", Path, data->set_eval_tokens),
      MEGATRAIN_JOB_FIELD("text", Path, data->set_text),
      MEGATRAIN_JOB_FIELD("tokenizer", Path, data->set_tokenizer),
      MEGATRAIN_JOB_FIELD("eval_fraction", Double, data->set_eval_fraction),
      {"shuffle_seed",
       NonNegativeField(reader, [data](uint64_t seed) { data->set_shuffle_seed(seed); })},
      {"packing",
       [&reader, data](const YAML::Node& node, const std::string& path) {
         const Fields packing = {MEGATRAIN_JOB_FIELD(
             "document_attention", String, data->mutable_packing()->set_document_attention)};
         return ReadMapping(reader, node, path, packing);
       }},
  };
}

// train.compute_dtype: fp32, tf32 or bf16.
Field ComputeDtypeField(const Reader& reader, v1::TrainSpec* train) {
  return [&reader, train](const YAML::Node& node, const std::string& path) {
    auto value = reader.String(node, path);
    if (!value.ok()) return value.status();
    if (*value == "fp32") {
      train->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
    } else if (*value == "tf32") {
      train->set_compute_dtype(v1::COMPUTE_DTYPE_TF32);
    } else if (*value == "bf16") {
      train->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
    } else {
      return reader.Error(path, absl::StrCat("must be fp32, tf32 or bf16, got '", *value, "'"));
    }
    return absl::OkStatus();
  };
}

// train.nan_policy: skip or fail.
Field NanPolicyField(const Reader& reader, v1::TrainSpec* train) {
  return [&reader, train](const YAML::Node& node, const std::string& path) {
    auto value = reader.String(node, path);
    if (!value.ok()) return value.status();
    if (*value == "skip") {
      train->set_nan_policy(v1::NAN_POLICY_SKIP);
    } else if (*value == "fail") {
      train->set_nan_policy(v1::NAN_POLICY_FAIL);
    } else {
      return reader.Error(path, absl::StrCat("must be skip or fail, got '", *value, "'"));
    }
    return absl::OkStatus();
  };
}

// train.devices: an integer N >= 1, or "all" (proto 0; docs/distributed.md).
Field DevicesField(const Reader& reader, v1::TrainSpec* train) {
  return [&reader, train](const YAML::Node& node, const std::string& path) {
    if (node.IsScalar() && node.Scalar() == "all") {
      train->set_devices(0);
      return absl::OkStatus();
    }
    auto value = reader.Int(node, path);
    if (!value.ok()) return value.status();
    if (*value < 1 || *value > 64) {
      return reader.Error(path, absl::StrCat("must be in [1, 64] or all, got ", *value));
    }
    train->set_devices(static_cast<int32_t>(*value));
    return absl::OkStatus();
  };
}

// train.resident_layers: "auto" (proto unset) or a count N >= 0 (the model's
// num_hidden_layers bounds it at submission).
Field ResidentLayersField(const Reader& reader, v1::TrainSpec* train) {
  return [&reader, train](const YAML::Node& node, const std::string& path) {
    if (node.IsScalar() && node.Scalar() == "auto") {
      train->clear_resident_layers();
      return absl::OkStatus();
    }
    auto value = reader.Int(node, path);
    if (!value.ok()) return value.status();
    if (*value < 0 || *value > 4096) {
      return reader.Error(path, absl::StrCat("must be auto or in [0, 4096], got ", *value));
    }
    train->set_resident_layers(static_cast<int32_t>(*value));
    return absl::OkStatus();
  };
}

// The rows first: "unknown key (known: micro_batch, seq_len, ...)".
Fields TrainFields(const Reader& reader, v1::TrainSpec* section) {
  Fields fields;
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_YAML_NUMBER)
  v1::TrainSpec* train = section;
  fields.insert(
      fields.end(),
      {
          MEGATRAIN_JOB_FIELD("global_batch", Int, train->set_global_batch),
          {"compute_dtype", ComputeDtypeField(reader, train)},
          {"seed", NonNegativeField(reader, [train](uint64_t seed) { train->set_seed(seed); })},
          {"nan_policy", NanPolicyField(reader, train)},
          MEGATRAIN_JOB_FIELD("offload_activations", Bool, train->set_offload_activations),
          MEGATRAIN_JOB_FIELD("allow_seq_len_above_max_position_embeddings", Bool,
                              train->set_allow_seq_len_above_max_position_embeddings),
          {"devices", DevicesField(reader, train)},
          {"resident_layers", ResidentLayersField(reader, train)},
      });
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_YAML_KEYWORD)
  return fields;
}

Fields OptimizerFields(const Reader& reader, v1::OptimizerSpec* section) {
  Fields fields = {
      MEGATRAIN_JOB_FIELD("warmup_steps", Int, section->set_warmup_steps),
  };
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_YAML_NUMBER)
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_YAML_KEYWORD)
  return fields;
}

Fields EvalFields(const Reader& reader, v1::EvalSpec* section) {
  Fields fields;
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_YAML_NUMBER)
  return fields;
}

Fields CheckpointFields(const Reader& reader, v1::CheckpointSpec* section) {
  Fields fields;
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_YAML_NUMBER)
  return fields;
}

Fields MemoryFields(const Reader& reader, v1::MemorySpec* section) {
  Fields fields;
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_YAML_KEYWORD)
  return fields;
}

// labels: a mapping of UTF-8 label keys to string values.
Field LabelsField(const Reader& reader, v1::JobSpec* spec) {
  return [&reader, spec](const YAML::Node& node, const std::string& path) {
    if (!node.IsMap()) return reader.Error(path, "expected a mapping of label: value");
    absl::flat_hash_set<std::string> seen;
    for (const auto& entry : node) {
      const std::string key = entry.first.as<std::string>();
      absl::Status key_status = reader.Utf8(key, absl::StrCat(path, " key"));
      if (!key_status.ok()) return key_status;
      const std::string key_path = absl::StrCat(path, ".", key);
      key_status = CheckKeyOnce(reader, entry.first, key, key_path, seen);
      if (!key_status.ok()) return key_status;
      auto value = reader.String(entry.second, key_path);
      if (!value.ok()) return value.status();
      (*spec->mutable_labels())[key] = *value;
    }
    return absl::OkStatus();
  };
}

// The sections' keys, each read into its part of one JobSpec.
struct SectionFields {
  Fields model, data, train, optimizer, eval, checkpoint, memory;
};

// The job file's top-level keys; `sections` must outlive the returned fields.
Fields TopFields(const Reader& reader, v1::JobSpec* spec, const SectionFields& sections) {
  auto section = [&reader](const Fields& fields) {
    return [&reader, &fields](const YAML::Node& node, const std::string& path) {
      return ReadMapping(reader, node, path, fields);
    };
  };
  return {
      MEGATRAIN_JOB_FIELD("name", String, spec->set_name),
      {"model", section(sections.model)},
      {"data", section(sections.data)},
      {"train", section(sections.train)},
      {"optimizer", section(sections.optimizer)},
      {"eval", section(sections.eval)},
      {"checkpoint", section(sections.checkpoint)},
      {"memory", section(sections.memory)},
      MEGATRAIN_JOB_FIELD("output_dir", Path, spec->set_output_dir),
      {"priority",
       [&reader, spec](const YAML::Node& node, const std::string& path) {
         auto value = reader.Int(node, path);
         if (!value.ok()) return value.status();
         if (*value < INT32_MIN || *value > INT32_MAX) {
           return reader.Error(path, absl::StrCat("out of range, got ", *value));
         }
         spec->set_priority(static_cast<int32_t>(*value));
         return absl::OkStatus();
       }},
      {"labels", LabelsField(reader, spec)},
  };
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobYaml(absl::string_view yaml, const std::string& base_dir,
                                         absl::string_view source) {
  const Reader reader{std::string(source), base_dir};
  v1::JobSpec spec;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": bad YAML: ", e.what()));
  }
  const SectionFields sections{
      ModelFields(reader, spec.mutable_model()),
      DataFields(reader, spec.mutable_data()),
      TrainFields(reader, spec.mutable_train()),
      OptimizerFields(reader, spec.mutable_optimizer()),
      EvalFields(reader, spec.mutable_eval()),
      CheckpointFields(reader, spec.mutable_checkpoint()),
      MemoryFields(reader, spec.mutable_memory()),
  };
  const Fields top_fields = TopFields(reader, &spec, sections);
  try {
    absl::Status status = ReadMapping(reader, root, "", top_fields);
    if (!status.ok()) return status;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  if (!spec.model().preset().empty() && !spec.model().hf_dir().empty()) {
    return reader.Error("model", "give one of preset and hf_dir, not both");
  }
  return spec;
}

#undef MEGATRAIN_JOB_FIELD

absl::StatusOr<v1::JobSpec> LoadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  const fs::path base_dir = fs::absolute(fs::path(path)).parent_path();
  return ParseJobYaml(text.str(), base_dir.string(), path);
}

}  // namespace megatrain::client
