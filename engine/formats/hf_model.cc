// Hugging Face model directories in and out of the host store (see
// hf_model.h).
#include "engine/formats/hf_model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/fs/dir_fd.h"
#include "engine/formats/hf_export.h"
#include "engine/formats/hf_moe_names.h"
#include "engine/fs/mapped_file.h"
#include "engine/model/moe_layout.h"
#include "engine/model/param_layout.h"
#include "engine/formats/safetensors.h"
#include "engine/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using Json = nlohmann::json;

constexpr char kConfigFileName[] = "config.json";
constexpr char kGenerationConfigFileName[] = "generation_config.json";
constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";

// HF configs are a few KiB; 4 MiB is the daemon's cap at submission too
// (kMaxHfConfigBytes).
constexpr int64_t kMaxConfigBytes = int64_t{4} << 20;

// Elements compared per chunk when checking a tied lm_head.weight against
// the embedding: 256 KiB of fp32, a bounded buffer whatever the vocabulary.
constexpr size_t kCompareChunkElements = size_t{1} << 16;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ErrnoError(int error_number, const std::string& path, const char* operation) {
  return absl::ErrnoToStatus(error_number, absl::StrFormat("%s: %s", path, operation));
}

// Writes `text` to `path` atomically (temporary file, fsync, rename).
absl::Status WriteTextFile(const std::string& path, std::string_view text) {
  MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  MEGATRAIN_RETURN_IF_ERROR(out.Append(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  return out.Commit();
}

// One tensor to export: a view of the store's master.
struct ExportTensor {
  const ParamSpec* param = nullptr;
  const float* data = nullptr;  // [param->numel] fp32, the store's master
  int64_t size_bytes = 0;       // in the exported dtype
};

// Zeroes the master of `block` outside its parameters (alignment padding).
void ZeroPadding(const BlockLayout& block, float* master) {
  int64_t covered_end = 0;
  for (const ParamSpec& p : block.params) {
    if (p.offset > covered_end) std::fill(master + covered_end, master + p.offset, 0.0f);
    covered_end = std::max(covered_end, p.offset + p.numel);
  }
  if (block.numel > covered_end) std::fill(master + covered_end, master + block.numel, 0.0f);
}

// Checks a tied model's lm_head.weight against the (already loaded)
// embedding, chunk by chunk, bit for bit after conversion to fp32.
absl::Status CheckTiedHead(const SafetensorsModel::TensorRef& head, const float* embedding,
                           int64_t numel) {
  const size_t element_bytes = SafetensorsDtypeSizeBytes(head.info->dtype);
  const absl::Span<const uint8_t> bytes = head.file->Data(*head.info);
  std::vector<float> chunk(std::min(static_cast<size_t>(numel), kCompareChunkElements));
  for (size_t begin = 0; begin < static_cast<size_t>(numel); begin += chunk.size()) {
    const size_t count = std::min(chunk.size(), static_cast<size_t>(numel) - begin);
    MEGATRAIN_RETURN_IF_ERROR(ConvertToFloat32(
        head.info->dtype, bytes.subspan(begin * element_bytes, count * element_bytes),
        absl::Span<float>(chunk.data(), count)));
    if (std::memcmp(chunk.data(), embedding + begin, count * sizeof(float)) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tie_word_embeddings is true but tensor 'lm_head.weight' differs from "
          "'model.embed_tokens.weight' (first difference in elements [%u, %u)); set "
          "tie_word_embeddings to false in config.json to train an untied head",
          head.file->path(), begin, begin + count));
    }
  }
  return absl::OkStatus();
}

// The store's fp32 masters by HF name, as views (no copy).
MoeTensorMap MoeParamsOfStore(const HostStore& store) {
  MoeTensorMap out;
  for (int64_t block_idx = 0; block_idx < store.num_blocks(); ++block_idx) {
    for (const ParamSpec& p : store.layout().blocks[block_idx].params) {
      out[p.hf_name] = at::from_blob(store.master(block_idx) + p.offset, p.shape, at::kFloat);
    }
  }
  return out;
}

// A MoE model (hf_moe_names.h: per-expert names, fused experts, MXFP4):
// LoadMoeHfParams' three phases, then a copy into the store's masters.
absl::Status LoadMoeHfWeights(const std::string& hf_dir, const SafetensorsModel& model,
                              HostStore* store) {
  const ModelLayout& layout = store->layout();
  absl::StatusOr<MoeTensorMap> loaded = LoadMoeHfParams(MoeModelConfigOf(store->config()), model);
  if (!loaded.ok()) return Annotate(loaded.status(), hf_dir);
  MoeTensorMap params = *std::move(loaded);
  for (int64_t block_idx = 0; block_idx < store->num_blocks(); ++block_idx) {
    ZeroPadding(layout.blocks[block_idx], store->master(block_idx));
    for (const ParamSpec& p : layout.blocks[block_idx].params) {
      auto it = params.find(p.hf_name);
      if (it == params.end()) {  // LoadMoeHfParams returns every parameter
        return absl::InternalError(absl::StrCat(hf_dir, ": parameter '", p.hf_name, "' not read"));
      }
      std::memcpy(store->master(block_idx) + p.offset, it->second.contiguous().data_ptr<float>(),
                  static_cast<size_t>(p.numel) * sizeof(float));
      it->second = at::Tensor();  // release it early
    }
  }
  store->RefreshAllStreamingCopies();
  return absl::OkStatus();
}

// The layout's names of a multimodal checkpoint's tensors, mapped to the
// names in its files (empty for other checkpoints: the names agree).
using FileNames = std::map<std::string, std::string>;

// LoadHfWeights phase 1: every tensor in the files is one the layout knows
// (INVALID_ARGUMENT naming the first that is not). A multimodal Gemma 3
// checkpoint names its text tensors under a language_model prefix
// (transformers 5: model.language_model.X; 4: language_model.model.X and
// language_model.lm_head.weight); the returned map takes the layout's names
// to the file's, and the vision tower is skipped.
absl::StatusOr<FileNames> CheckNoUnknownTensors(const std::string& hf_dir,
                                                const SafetensorsModel& model,
                                                const ModelLayout& layout,
                                                const ModelConfig& config) {
  FileNames file_names;
  for (const std::string& file_name : model.TensorNames()) {
    std::string name = file_name;
    if (config.multimodal_checkpoint) {
      if (absl::StartsWith(name, "vision_tower.") ||
          absl::StartsWith(name, "model.vision_tower.") ||
          absl::StartsWith(name, "multi_modal_projector.") ||
          absl::StartsWith(name, "model.multi_modal_projector.")) {
        continue;
      }
      for (const auto& [prefix, replacement] :
           {std::pair<const char*, const char*>{"model.language_model.", "model."},
            {"language_model.model.", "model."},
            {"language_model.lm_head.", "lm_head."}}) {
        if (absl::StartsWith(name, prefix)) {
          name = absl::StrCat(replacement, name.substr(std::strlen(prefix)));
          break;
        }
      }
      file_names[name] = file_name;
    }
    if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    int64_t block_idx = 0;
    const ParamSpec* param = nullptr;
    if (!layout.FindHfName(name, &block_idx, &param)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unexpected tensor '%s' (not part of a %s model with this config.json: "
          "%d layers%s)",
          hf_dir, name, config.model_type, config.num_hidden_layers,
          config.tie_word_embeddings ? ", tied embeddings" : ""));
    }
  }
  return file_names;
}

// One tensor LoadHfWeights converts: where in the files, where in the store.
struct PlannedTensor {
  SafetensorsModel::TensorRef ref;
  float* dst = nullptr;  // [numel] fp32 in the store's master
  int64_t numel = 0;
};

// LoadHfWeights phase 2 for one tensor: layout name `name` is in the files
// (NOT_FOUND), with `expected_shape` (INVALID_ARGUMENT) and a dtype we read
// (UNIMPLEMENTED).
absl::StatusOr<SafetensorsModel::TensorRef> FindLayoutTensor(
    const std::string& hf_dir, const SafetensorsModel& model, const FileNames& file_names,
    const std::string& name, const std::vector<int64_t>& expected_shape) {
  auto mapped = file_names.find(name);
  absl::StatusOr<SafetensorsModel::TensorRef> found =
      model.Find(mapped == file_names.end() ? name : mapped->second);
  if (!found.ok()) {
    return absl::NotFoundError(
        absl::StrFormat("%s: tensor '%s' is missing (expected shape %s from config.json)", hf_dir,
                        name, ShapeString(expected_shape)));
  }
  if (found->info->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensor '%s': shape %s in %s, config.json expects %s", hf_dir, name,
        ShapeString(found->info->shape), found->file->path(), ShapeString(expected_shape)));
  }
  const SafetensorsDtype dtype = found->info->dtype;
  if (dtype != SafetensorsDtype::kF32 && dtype != SafetensorsDtype::kBF16 &&
      dtype != SafetensorsDtype::kF16) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: tensor '%s' has dtype %s; only F32, BF16 and F16 are supported",
                        found->file->path(), name, SafetensorsDtypeName(dtype)));
  }
  return *found;
}

// Where an export goes: `root` (absolute, opened by path; the caller trusts
// it) and below it `parent` ('/'-separated components, empty for the root
// itself) holding the new directory `name`.
struct ExportTarget {
  std::string root;
  std::string parent;  // relative to root; "" when out_dir is root/<name>
  std::string name;
  std::string path;  // out_dir, normalised, for messages
};

// Splits `out_dir` into ExportTarget. INVALID_ARGUMENT when it is relative,
// has a "." or ".." component, names no directory, or does not lie below
// `root`.
absl::StatusOr<ExportTarget> SplitExportTarget(const std::string& out_dir,
                                               const std::string& root) {
  if (root.empty() || root.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("export root: must be an absolute path, got '", root, "'"));
  }
  if (out_dir.empty() || out_dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: must be an absolute path, got '", out_dir, "'"));
  }
  std::vector<std::string> components;
  for (absl::string_view component : absl::StrSplit(out_dir, '/', absl::SkipEmpty())) {
    if (component == "." || component == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("out_dir: '.' and '..' components are not allowed, got '", out_dir, "'"));
    }
    components.emplace_back(component);
  }
  if (components.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: must name a directory to create, got '", out_dir, "'"));
  }
  std::vector<std::string> root_components = absl::StrSplit(root, '/', absl::SkipEmpty());
  if (root_components.size() >= components.size() ||
      !std::equal(root_components.begin(), root_components.end(), components.begin())) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: '", out_dir, "' does not lie below the export root '", root, "'"));
  }
  ExportTarget target;
  target.root = absl::StrCat("/", absl::StrJoin(root_components, "/"));
  target.name = components.back();
  target.parent =
      absl::StrJoin(components.begin() + root_components.size(), components.end() - 1, "/");
  target.path = absl::StrCat("/", absl::StrJoin(components, "/"));
  return target;
}

// Opens (creating missing directories) the export's parent below its root,
// one component at a time without following a symbolic link (Note
// [Directory descriptors] in dir_fd.h). FAILED_PRECONDITION naming the
// component when a link or a non-directory is in the way.
absl::StatusOr<DirFd> OpenExportParent(const ExportTarget& target) {
  if (target.parent.empty()) return DirFd::Open(target.root);
  return DirFd::OpenBeneath(target.root, target.parent, DirFd::Create::kYes);
}

// OK when `target.name` does not exist in `parent_fd` or is an empty
// directory (not a link); ALREADY_EXISTS otherwise.
absl::Status CheckExportTargetFree(const DirFd& parent_fd, const ExportTarget& target) {
  absl::StatusOr<struct stat> existing = parent_fd.StatAt(target.name);
  if (absl::IsNotFound(existing.status())) return absl::OkStatus();
  if (!existing.ok()) return existing.status();
  bool empty_dir = false;
  if (S_ISDIR(existing->st_mode)) {
    MEGATRAIN_ASSIGN_OR_RETURN(DirFd target_fd,
                               parent_fd.OpenChild(target.name, DirFd::Create::kNo));
    std::error_code ec;
    empty_dir = std::filesystem::is_empty(target_fd.IoPath(), ec) && !ec;
  }
  if (empty_dir) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      target.path,
      ": already exists and is not an empty directory; remove it or export elsewhere"));
}

// The tensors of an export in HF order. `tensors` point into the store or
// into `moe_tensors` / `moe_specs`, which the plan owns.
struct ExportPlan {
  std::vector<ExportTensor> tensors;
  // A MoE model's tensors are named and laid out as transformers writes
  // them (ExportMoeHfTensors: per-expert for mixtral and qwen2/3_moe).
  std::vector<std::pair<std::string, at::Tensor>> moe_tensors;
  std::vector<ParamSpec> moe_specs;
};

// Fills `plan` (empty) with the tensors of `store`, each `element_bytes`
// per element on disk.
absl::Status CollectExportTensors(const HostStore& store, int64_t element_bytes, ExportPlan* plan) {
  const ModelConfig& config = store.config();
  if (config.moe == nullptr) {
    for (int64_t block_idx = 0; block_idx < store.num_blocks(); ++block_idx) {
      for (const ParamSpec& p : store.layout().blocks[block_idx].params) {
        plan->tensors.push_back(
            ExportTensor{&p, store.master(block_idx) + p.offset, p.numel * element_bytes});
      }
    }
    return absl::OkStatus();
  }
  MEGATRAIN_ASSIGN_OR_RETURN(plan->moe_tensors,
                             ExportMoeHfTensors(MoeModelConfigOf(config), MoeParamsOfStore(store),
                                                MoeExportFormat::kCheckpoint));
  for (const auto& [hf_name, t] : plan->moe_tensors) {
    ParamSpec spec;
    spec.hf_name = hf_name;
    spec.shape = t.sizes().vec();
    spec.numel = t.numel();
    plan->moe_specs.push_back(std::move(spec));
  }
  // Pointers into moe_specs are taken only once it is complete.
  for (size_t i = 0; i < plan->moe_specs.size(); ++i) {
    plan->tensors.push_back(ExportTensor{&plan->moe_specs[i],
                                         plan->moe_tensors[i].second.data_ptr<float>(),
                                         plan->moe_specs[i].numel * element_bytes});
  }
  return absl::OkStatus();
}

// Assigns `tensors` to shards in order, a new shard starting when the next
// tensor would take the current one past `max_shard_bytes`.
std::vector<std::vector<ExportTensor>> AssignShards(const std::vector<ExportTensor>& tensors,
                                                    int64_t max_shard_bytes) {
  std::vector<std::vector<ExportTensor>> shards;
  int64_t shard_bytes = 0;
  for (const ExportTensor& tensor : tensors) {
    if (shards.empty() ||
        (!shards.back().empty() && shard_bytes + tensor.size_bytes > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(tensor);
    shard_bytes += tensor.size_bytes;
  }
  return shards;
}

// Writes the safetensors shards of `shards` into `dir` and, for more than
// one shard, their index.
absl::Status WriteExportShards(const std::vector<std::vector<ExportTensor>>& shards,
                               SafetensorsDtype file_dtype, const std::string& dir) {
  Json weight_map = Json::object();
  int64_t total_bytes = 0;
  for (size_t shard_idx = 0; shard_idx < shards.size(); ++shard_idx) {
    const std::string file_name =
        shards.size() == 1
            ? std::string(kSingleFileName)
            : absl::StrFormat("model-%05d-of-%05d.safetensors", shard_idx + 1, shards.size());
    MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                               SafetensorsWriter::Create(JoinPath(dir, file_name)));
    for (const ExportTensor& tensor : shards[shard_idx]) {
      MEGATRAIN_RETURN_IF_ERROR(
          writer.AddFloat32(tensor.param->hf_name, file_dtype, tensor.param->shape, tensor.data));
      weight_map[tensor.param->hf_name] = file_name;
      total_bytes += tensor.size_bytes;
    }
    MEGATRAIN_RETURN_IF_ERROR(writer.Finish());
  }
  if (shards.size() <= 1) return absl::OkStatus();
  Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return WriteTextFile(JoinPath(dir, kIndexFileName), index.dump(2));
}

// Copies kExportCopiedFiles from `source_dir` (empty: none) into `dir`
// under a confinement to `source_dir` (Note [Export copies]) and returns
// the source's config.json text ("" when there is none to keep). Errors
// only from writing into `dir`; what cannot be read is reported skipped.
absl::StatusOr<std::string> CopySourceFiles(const std::string& source_dir, const std::string& dir,
                                            HfExportReport* report) {
  if (source_dir.empty()) return std::string();
  absl::StatusOr<ReadConfinement> confinement =
      ReadConfinement::Create({ReadConfinement::Root{source_dir, /*follow_links=*/true}});
  if (!confinement.ok()) {
    report->skipped_files.push_back(
        absl::StrCat(source_dir, ": ", confinement.status().message(), "; nothing copied"));
    return std::string();
  }
  ScopedReadConfinement scope(&*confinement);
  for (const char* name : kExportCopiedFiles) {
    absl::StatusOr<std::string> bytes =
        ReadInputFile(JoinPath(source_dir, name), kMaxExportCopiedFileBytes);
    if (absl::IsNotFound(bytes.status())) continue;
    if (!bytes.ok()) {
      report->skipped_files.push_back(absl::StrCat(name, ": ", bytes.status().message()));
      continue;
    }
    MEGATRAIN_RETURN_IF_ERROR(WriteTextFile(JoinPath(dir, name), *bytes));
    report->copied_files.push_back(name);
  }
  absl::StatusOr<std::string> config =
      ReadInputFile(JoinPath(source_dir, kConfigFileName), kMaxConfigBytes);
  if (config.ok()) return std::move(*config);
  if (!absl::IsNotFound(config.status())) {
    report->skipped_files.push_back(absl::StrCat(kConfigFileName, ": ", config.status().message(),
                                                 "; written from the checkpoint's config"));
  }
  return std::string();
}

// The exported config.json (Note [Export copies]): `source_text` (the
// source's config.json; "" for none) with the keys where `trained`
// differs from the source's parsed config, and `trained.torch_dtype` under
// the source's dtype spelling; ToHfConfigJson when there is no usable
// source (none, unparsable, or a multimodal Gemma 3 exported as text-only).
std::string ExportConfigJson(const ModelConfig& trained, const std::string& source_text,
                             HfExportReport* report) {
  const std::string generated = trained.ToHfConfigJson();
  if (source_text.empty()) return generated;
  Json source = Json::parse(source_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<ModelConfig> parsed = ParseHfConfig(source_text, kConfigFileName);
  if (source.is_discarded() || !source.is_object() || !parsed.ok()) {
    report->skipped_files.push_back(
        absl::StrCat(kConfigFileName, ": the source's no longer parses (",
                     parsed.ok() ? "not a JSON object" : parsed.status().message(),
                     "); written from the checkpoint's config"));
    return generated;
  }
  if (parsed->multimodal_checkpoint) return generated;
  parsed->torch_dtype = trained.torch_dtype;
  const Json trained_json = Json::parse(generated);
  const Json source_json = Json::parse(parsed->ToHfConfigJson());
  for (const auto& [key, value] : trained_json.items()) {
    if (key == "dtype" || key == "torch_dtype") continue;
    const auto it = source_json.find(key);
    if (it == source_json.end() || *it != value) source[key] = value;
  }
  const char* dtype_key =
      source.contains("torch_dtype") && !source.contains("dtype") ? "torch_dtype" : "dtype";
  source[dtype_key] = trained.torch_dtype;
  return source.dump(2);
}

// Writes every file of the export into `dir` (a path through the
// temporary directory's descriptor).
absl::Status WriteExportFiles(const HostStore& store, const HfExportOptions& options,
                              const std::string& dir, HfExportReport* report) {
  MEGATRAIN_ASSIGN_OR_RETURN(const std::string source_config,
                             CopySourceFiles(options.source_dir, dir, report));
  ModelConfig config = store.config();
  config.torch_dtype = options.dtype == ExportDtype::kBf16 ? "bfloat16" : "float32";
  MEGATRAIN_RETURN_IF_ERROR(WriteTextFile(JoinPath(dir, kConfigFileName),
                                          ExportConfigJson(config, source_config, report)));
  const auto& copied = report->copied_files;
  if (std::find(copied.begin(), copied.end(), kGenerationConfigFileName) == copied.end()) {
    Json generation = {{"_from_model_config", true},
                       {"bos_token_id", config.bos_token_id},
                       {"eos_token_id", config.eos_token_id}};
    MEGATRAIN_RETURN_IF_ERROR(
        WriteTextFile(JoinPath(dir, kGenerationConfigFileName), generation.dump(2)));
  }

  const SafetensorsDtype file_dtype =
      options.dtype == ExportDtype::kBf16 ? SafetensorsDtype::kBF16 : SafetensorsDtype::kF32;
  ExportPlan plan;
  MEGATRAIN_RETURN_IF_ERROR(CollectExportTensors(
      store, static_cast<int64_t>(SafetensorsDtypeSizeBytes(file_dtype)), &plan));
  const int64_t max_shard_bytes =
      options.max_shard_bytes > 0 ? options.max_shard_bytes : kDefaultMaxShardBytes;
  return WriteExportShards(AssignShards(plan.tensors, max_shard_bytes), file_dtype, dir);
}

// Makes the temporary directory's entries durable, then renames it onto
// `target.name` (which must still be absent or an empty directory).
absl::Status PublishExport(const DirFd& parent_fd, const DirFd& temp_fd,
                           const std::string& temp_name, const ExportTarget& target) {
  MEGATRAIN_RETURN_IF_ERROR(temp_fd.Fsync());
  if (::renameat(parent_fd.fd(), temp_name.c_str(), parent_fd.fd(), target.name.c_str()) != 0) {
    const int rename_errno = errno;
    if (rename_errno == ENOTEMPTY || rename_errno == EEXIST || rename_errno == ENOTDIR) {
      return absl::AlreadyExistsError(absl::StrCat(
          target.path, ": appeared and is not an empty directory; export not published"));
    }
    return ErrnoError(rename_errno, target.path, "rename exported directory into place");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportDtype> ParseExportDtype(absl::string_view name) {
  if (name == "bf16" || name == "bfloat16") return ExportDtype::kBf16;
  if (name == "fp32" || name == "float32") return ExportDtype::kFp32;
  return absl::InvalidArgumentError(absl::StrCat("dtype: must be bf16 or fp32, got '", name, "'"));
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& hf_dir) {
  // Note [Confined reads] in dir_fd.h.
  const std::string path = JoinPath(hf_dir, kConfigFileName);
  MEGATRAIN_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, kMaxConfigBytes));
  return ParseHfConfig(text, path);
}

absl::Status LoadHfWeights(const std::string& hf_dir, HostStore* store) {
  if (store == nullptr) return absl::InvalidArgumentError("LoadHfWeights: store is null");
  MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsModel model, SafetensorsModel::Open(hf_dir));
  const ModelLayout& layout = store->layout();
  const ModelConfig& config = store->config();
  if (config.moe != nullptr) return LoadMoeHfWeights(hf_dir, model, store);

  // 1. Nothing in the files that the layout does not know.
  MEGATRAIN_ASSIGN_OR_RETURN(const FileNames file_names,
                             CheckNoUnknownTensors(hf_dir, model, layout, config));

  // 2. Every layout tensor present, with the right shape and a dtype we read.
  std::vector<PlannedTensor> plan;
  for (int64_t block_idx = 0; block_idx < store->num_blocks(); ++block_idx) {
    for (const ParamSpec& p : layout.blocks[block_idx].params) {
      PlannedTensor planned;
      MEGATRAIN_ASSIGN_OR_RETURN(planned.ref,
                                 FindLayoutTensor(hf_dir, model, file_names, p.hf_name, p.shape));
      planned.dst = store->master(block_idx) + p.offset;
      planned.numel = p.numel;
      plan.push_back(planned);
    }
  }
  // A tied model's lm_head.weight, if the files carry one anyway.
  SafetensorsModel::TensorRef tied_head;
  const ParamSpec* embedding = layout.blocks[layout.embedding_block()].Find("embed_tokens.weight");
  const bool has_tied_head = config.tie_word_embeddings && (model.Contains("lm_head.weight") ||
                                                            file_names.count("lm_head.weight") > 0);
  if (has_tied_head) {
    MEGATRAIN_ASSIGN_OR_RETURN(
        tied_head, FindLayoutTensor(hf_dir, model, file_names, "lm_head.weight", embedding->shape));
  }

  // 3. Convert from the mappings into place.
  for (int64_t block_idx = 0; block_idx < store->num_blocks(); ++block_idx) {
    ZeroPadding(layout.blocks[block_idx], store->master(block_idx));
  }
  for (const PlannedTensor& planned : plan) {
    MEGATRAIN_RETURN_IF_ERROR(Annotate(
        ConvertToFloat32(planned.ref.info->dtype, planned.ref.file->Data(*planned.ref.info),
                         absl::Span<float>(planned.dst, static_cast<size_t>(planned.numel))),
        absl::StrFormat("%s: tensor '%s'", planned.ref.file->path(), planned.ref.info->name)));
  }
  if (has_tied_head) {
    MEGATRAIN_RETURN_IF_ERROR(CheckTiedHead(
        tied_head, store->master(layout.embedding_block()) + embedding->offset, embedding->numel));
  }
  store->RefreshAllStreamingCopies();
  return absl::OkStatus();
}

absl::Status ExportHfDirectory(const HostStore& store, const std::string& out_dir,
                               ExportDtype dtype, int64_t max_shard_bytes,
                               const std::string& root) {
  if (max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes: must be >= 1, got ", max_shard_bytes));
  }
  HfExportOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = max_shard_bytes;
  options.root = root;
  return ExportHfDirectory(store, out_dir, options).status();
}

absl::StatusOr<HfExportReport> ExportHfDirectory(const HostStore& store, const std::string& out_dir,
                                                 const HfExportOptions& options) {
  if (options.max_shard_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_shard_bytes: must be >= 1 (0: the default), got ", options.max_shard_bytes));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(ExportTarget target, SplitExportTarget(out_dir, options.root));
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd parent_fd, OpenExportParent(target));
  MEGATRAIN_RETURN_IF_ERROR(CheckExportTargetFree(parent_fd, target));

  // A crashed export leaves its `.<name>.tmp.XXXXXX` directory behind; it
  // is not looked for by name (a user's own file could be named so) and
  // never deleted here.
  const std::string temp_prefix = absl::StrCat(".", target.name, ".tmp.");
  std::string temp_io = parent_fd.IoPath(absl::StrCat(temp_prefix, "XXXXXX"));
  if (::mkdtemp(temp_io.data()) == nullptr) {
    return ErrnoError(errno, JoinPath(parent_fd.path(), absl::StrCat(temp_prefix, "XXXXXX")),
                      "create temporary directory");
  }
  const std::string temp_name = std::filesystem::path(temp_io).filename().string();
  bool published = false;
  absl::Cleanup remove_temp = [&] {
    if (!published) (void)parent_fd.RemoveTreeAt(temp_name);
  };
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd temp_fd, parent_fd.OpenChild(temp_name, DirFd::Create::kNo));
  // Files are created by path through the descriptor (AtomicFileWriter:
  // O_EXCL temporaries, renamed within the directory).
  const std::string temp_dir = temp_fd.IoPath();
  HfExportReport report;
  if (absl::Status written = WriteExportFiles(store, options, temp_dir, &report); !written.ok()) {
    // Name the temporary directory by its path, not the descriptor's.
    return absl::Status(written.code(),
                        absl::StrReplaceAll(written.message(), {{temp_dir, temp_fd.path()}}));
  }
  MEGATRAIN_RETURN_IF_ERROR(PublishExport(parent_fd, temp_fd, temp_name, target));
  published = true;
  MEGATRAIN_RETURN_IF_ERROR(parent_fd.Fsync());
  return report;
}

}  // namespace megatrain::engine
