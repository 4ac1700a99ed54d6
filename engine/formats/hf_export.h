// Exports of Hugging Face model directories that keep what the source
// directory had (Note [Export copies]): its config.json keys, tokenizer,
// chat template and generation files. Extends hf_model.h
// (ExportHfDirectory) and checkpoint_info.h (ExportHfModel); a header
// without LibTorch, so that the daemon's core can carry an HfExportReport.
//
// Thread-safety: no global state; concurrent exports to different
// directories are safe.
#ifndef MEGATRAIN_ENGINE_FORMATS_HF_EXPORT_H_
#define MEGATRAIN_ENGINE_FORMATS_HF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine {

class HostStore;         // engine/store/host_store.h
enum class ExportDtype;  // engine/formats/hf_model.h

// Note [Export copies]
// An export is a model directory people use as is, so when the model came
// from a HF directory (`HfExportOptions::source_dir`, the job's
// model.hf_dir):
//   - config.json is the source's, key for key, except the keys whose
//     value the trained model's config gives differently (the keys where
//     ModelConfig::ToHfConfigJson of the checkpoint's config and of the
//     source's parsed config disagree) and the dtype, written under the
//     spelling the source used (`dtype` or `torch_dtype`). No key is
//     dropped or reset (initializer_range, pretraining_tp,
//     transformers_version stay), for every family alike. Without a source
//     (a preset) config.json is ToHfConfigJson.
//   - kExportCopiedFiles (tokenizer, chat template and generation files)
//     are copied when present; the source's generation_config.json replaces
//     the one made from bos/eos ids.
// The daemon reads the source on behalf of a user, so the copy is confined
// (Note [Confined reads] in dir_fd.h): each file is opened below the
// source directory's descriptor, following links only while they stay
// inside it, non-blocking, regular files only, at most
// kMaxExportCopiedFileBytes each. A file that fails any of these (a link
// leading out of the directory, a FIFO, an oversized file) is skipped and
// reported in HfExportReport::skipped_files; the export still succeeds.
// A missing file is neither copied nor reported.

// Files copied from the source directory (Note [Export copies]).
inline constexpr const char* kExportCopiedFiles[] = {"tokenizer.json",
                                                     "tokenizer_config.json",
                                                     "special_tokens_map.json",
                                                     "tokenizer.model",
                                                     "added_tokens.json",
                                                     "vocab.json",
                                                     "merges.txt",
                                                     "chat_template.jinja",
                                                     "chat_template.json",
                                                     "generation_config.json"};

// Cap on one copied file, in bytes: the largest released tokenizer.json
// files are about 35 MB (Gemma 3); 128 MiB leaves room and bounds what one
// export reads into memory per file.
inline constexpr int64_t kMaxExportCopiedFileBytes = int64_t{128} << 20;

// What an export took from its source directory.
struct HfExportReport {
  // Names (kExportCopiedFiles) copied into the export.
  std::vector<std::string> copied_files;
  // "tokenizer.json: <why>" for each present file not copied.
  std::vector<std::string> skipped_files;
};

// How ExportHfDirectory writes.
struct HfExportOptions {
  // Value-initialised: ExportDtype::kBf16.
  ExportDtype dtype{};
  // Largest safetensors shard, in bytes; 0: kDefaultMaxShardBytes.
  int64_t max_shard_bytes = 0;
  // Absolute directory `out_dir` must lie below (ExportHfDirectory in
  // hf_model.h).
  std::string root = "/";
  // The HF directory the model was loaded from (absolute, resolved: no
  // symbolic link on the way), or empty (Note [Export copies]).
  std::string source_dir;
};

// ExportHfDirectory (hf_model.h) with the source directory's files (Note
// [Export copies]). Errors as there (INVALID_ARGUMENT for a negative
// max_shard_bytes); a source directory that cannot be opened (missing, a
// symbolic link) is not an error: it is reported in skipped_files.
absl::StatusOr<HfExportReport> ExportHfDirectory(const HostStore& store, const std::string& out_dir,
                                                 const HfExportOptions& options);

// ExportHfModel (checkpoint_info.h) keeping `source_dir`'s config keys and
// files: the HF directory the job loaded (resolved), or empty for a preset.
// Errors as ExportHfModel.
absl::StatusOr<HfExportReport> ExportHfModelFrom(const std::string& checkpoint_dir,
                                                 const std::string& out_dir,
                                                 const std::string& dtype,
                                                 const std::string& source_dir);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_FORMATS_HF_EXPORT_H_
