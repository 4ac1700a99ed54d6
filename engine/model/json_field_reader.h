// JsonFieldReader: reads optional fields of one JSON object (an HF
// config.json or an object inside it) into typed outputs, with errors that
// name the file and the field. Shared by the dense parser (model_config.cc)
// and the mixture-of-experts parser (moe_config.cc); header-only, torch-free.
//
// Every reader leaves its output untouched when the field is missing or
// null, so callers set the HF default first and then read. Errors are
// INVALID_ARGUMENT "<source>: <prefix><field>: expected ..., got <json>".
//
// Thread-safety: a reader is used by one thread; it refers to the object
// and the source text, which must outlive it.
#ifndef MEGATRAIN_ENGINE_MODEL_JSON_FIELD_READER_H_
#define MEGATRAIN_ENGINE_MODEL_JSON_FIELD_READER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {

class JsonFieldReader {
 public:
  // `prefix` is written before field names in errors ("rope_scaling.").
  JsonFieldReader(const nlohmann::json& object, absl::string_view source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  absl::string_view source() const { return source_; }

  // INVALID_ARGUMENT "<source>: <prefix><field>: <what>".
  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, field, ": ", what));
  }

  // True when `field` is present and not null.
  bool Has(const char* field) const { return Find(field) != nullptr; }

  // An integer. A float with an integral value is accepted (some exporters
  // write 4096.0); one beyond 9e15, where doubles stop being exact
  // integers, is not.
  absl::Status Int(const char* field, int64_t* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
      return absl::OkStatus();
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::abs(d) < 9e15 && d == std::floor(d)) {
        *out = static_cast<int64_t>(d);
        return absl::OkStatus();
      }
    }
    return Error(field, absl::StrCat("expected an integer, got ", v->dump()));
  }

  absl::Status Double(const char* field, double* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Error(field, absl::StrCat("expected a number, got ", v->dump()));
    *out = v->get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(const char* field, bool* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) {
      return Error(field, absl::StrCat("expected true or false, got ", v->dump()));
    }
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* field, std::string* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Error(field, absl::StrCat("expected a string, got ", v->dump()));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  // A list of numbers (replaces `out`).
  absl::Status DoubleList(const char* field, std::vector<double>* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_array()) {
      return Error(field, absl::StrCat("expected a list of numbers, got ", v->dump()));
    }
    out->clear();
    for (const nlohmann::json& item : *v) {
      if (!item.is_number()) {
        return Error(field, absl::StrCat("expected numbers, got ", item.dump()));
      }
      out->push_back(item.get<double>());
    }
    return absl::OkStatus();
  }

  // A list of integers (replaces `out`).
  absl::Status IntList(const char* field, std::vector<int64_t>* out) const {
    const nlohmann::json* v = Find(field);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_array()) return Error(field, absl::StrCat("expected a list, got ", v->dump()));
    out->clear();
    for (const nlohmann::json& item : *v) {
      if (!item.is_number_integer()) {
        return Error(field, absl::StrCat("expected integers, got ", item.dump()));
      }
      out->push_back(item.get<int64_t>());
    }
    return absl::OkStatus();
  }

  // A token id: an integer, or a list of them whose first is used
  // (`eos_token_id` of Llama 3.1 instruct).
  absl::Status TokenId(const char* field, int64_t* out) const {
    const nlohmann::json* v = Find(field);
    if (v != nullptr && v->is_array()) {
      if (v->empty() || !(*v)[0].is_number_integer()) {
        return Error(field, "expected an integer or a non-empty list of integers");
      }
      *out = (*v)[0].get<int64_t>();
      return absl::OkStatus();
    }
    return Int(field, out);
  }

 private:
  // The field's value; null when missing or JSON null.
  const nlohmann::json* Find(const char* field) const {
    auto it = object_.find(field);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const nlohmann::json& object_;
  absl::string_view source_;
  std::string prefix_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MODEL_JSON_FIELD_READER_H_
