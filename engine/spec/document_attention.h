// Whether the documents packed into one sequence see each other: the job
// field `data.packing.document_attention` (docs/job-spec.md, "Packing";
// Note [Document attention] in engine/model/layers.h). Shared by the job
// spec, which carries it, and the data loader (engine/data/data_loader.h),
// which applies it; torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_DOCUMENT_ATTENTION_H_
#define MEGATRAIN_ENGINE_SPEC_DOCUMENT_ATTENTION_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

enum class DocumentAttention {
  // kIsolated when the training shards carry loss masks (SFT and chat
  // data, docs/data-format.md), kShared otherwise (pretraining text). The
  // job spec's default; the data loader resolves it.
  kAuto,
  // Each packed document attends only to itself and its positions restart
  // at 0, as if the documents were run one by one; the label that would
  // predict the next document's first token is not trained.
  kIsolated,
  // Packed windows attend causally across document boundaries, positions
  // 0..seq_len-1 in every row (the packing rule as it was first built).
  kShared,
};

// "auto" | "isolated" | "shared": the spelling of job files, the proto,
// JSON and docs.
inline absl::string_view DocumentAttentionName(DocumentAttention mode) {
  switch (mode) {
    case DocumentAttention::kIsolated:
      return "isolated";
    case DocumentAttention::kShared:
      return "shared";
    case DocumentAttention::kAuto:
      break;
  }
  return "auto";
}

// The job field's path, for messages.
inline constexpr char kDocumentAttentionField[] = "data.packing.document_attention";

// Inverse of DocumentAttentionName; INVALID_ARGUMENT naming
// data.packing.document_attention and the value otherwise.
inline absl::StatusOr<DocumentAttention> ParseDocumentAttention(absl::string_view name) {
  for (const DocumentAttention mode :
       {DocumentAttention::kAuto, DocumentAttention::kIsolated, DocumentAttention::kShared}) {
    if (name == DocumentAttentionName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kDocumentAttentionField, ": must be auto, isolated or shared, got '", name, "'"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_DOCUMENT_ATTENTION_H_
