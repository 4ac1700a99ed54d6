// Hugging Face model directories in and out of the host store.
//
// In: `config.json` plus `model.safetensors` or a sharded
// `model.safetensors.index.json` (SafetensorsModel). Every tensor is
// converted from the memory-mapped file straight into the fp32 master of the
// host store (F32 copied bit for bit, BF16 and F16 widened exactly): no
// second copy of the model is made, and the only memory beyond the store is
// the kernel's page cache behind the mappings, which it can drop at will.
//
// Out: an HF directory that `transformers.AutoModelForCausalLM
// .from_pretrained` loads: `config.json`, `generation_config.json`, and
// either one `model.safetensors` or shards `model-00001-of-0000N.safetensors`
// with `model.safetensors.index.json` (the names and index layout of HF
// transformers `save_pretrained`, modeling_utils.py). The directory appears
// atomically: it is written under a temporary name next to `out_dir`, every
// file and the directory fsync'd, then renamed.
//
// Name mapping: the host store's layout already uses HF tensor names
// (param_layout.h), so import and export are name lookups. A multimodal
// Gemma 3 checkpoint (config.multimodal_checkpoint) is read through its
// text tower: `model.language_model.X` / `language_model.model.X` are the
// layout's `model.X`, the vision tower and projector are skipped; it is
// exported as a text-only gemma3_text model.
//
// Tied embeddings (`tie_word_embeddings: true`): the layout has no
// `lm_head.weight`; exports omit it (as save_pretrained does). On import, a
// file that nevertheless holds `lm_head.weight` is accepted only when it is
// bit-identical (after conversion to fp32) to `model.embed_tokens.weight`;
// otherwise the model is not really tied and loading it would silently drop
// trained weights, so it is refused (INVALID_ARGUMENT).
//
// Conventions: sizes in bytes; shapes are PyTorch's, row-major. Little-endian
// hosts only (x86-64, aarch64), as safetensors.h checks at compile time.
//
// Thread-safety: the functions hold no global state; concurrent calls on
// different stores and directories are safe. A store must not be used by
// anything else (trainer, executor) while LoadHfWeights writes it.
#ifndef MEGATRAIN_ENGINE_HF_MODEL_H_
#define MEGATRAIN_ENGINE_HF_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/store/host_store.h"
#include "engine/model/model_config.h"

namespace megatrain::engine {

// Element type of exported weights.
enum class ExportDtype {
  kBf16,  // safetensors BF16, rounded to nearest even; config torch_dtype "bfloat16"
  kFp32,  // safetensors F32, the fp32 masters bit for bit; torch_dtype "float32"
};

// Parses "bf16" / "bfloat16" or "fp32" / "float32".
// Errors: INVALID_ARGUMENT "dtype: must be bf16 or fp32, got 'x'".
absl::StatusOr<ExportDtype> ParseExportDtype(absl::string_view name);

// Largest shard HF transformers writes by default ("5GB"), in bytes.
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// Reads and parses `hf_dir`/config.json (LoadHfConfigFile).
// Errors: NOT_FOUND when it is missing; INVALID_ARGUMENT / UNIMPLEMENTED as
// ParseHfConfig (naming the field).
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& hf_dir);

// Loads the weights of the HF directory `hf_dir` into `store`'s fp32 master,
// then refreshes the bf16 streaming copy. The store's config decides what is
// expected (normally it came from LoadHfConfig(hf_dir)). Alignment padding
// between parameters is set to zero. Gradients and AdamW moments are not
// touched.
//
// Everything is checked before the first byte of the store is written, so a
// failed load leaves the store as it was:
//   - every tensor of the layout must be in the files, else NOT_FOUND
//     "<hf_dir>: tensor 'model.norm.weight' is missing (expected shape [64]
//     from config.json)";
//   - every tensor in the files must be in the layout, else INVALID_ARGUMENT
//     "<hf_dir>: unexpected tensor 'foo' (not part of a llama model with this
//     config.json)". Ignored: `*.rotary_emb.inv_freq` buffers (some exporters
//     write them; RoPE is recomputed from config.json) and, for a tied model,
//     an `lm_head.weight` equal to the embedding (see the file comment);
//   - shapes must match config.json, else INVALID_ARGUMENT "<hf_dir>: tensor
//     'X': shape [a, b] in <file>, config.json expects [c, d]";
//   - dtypes must be F32, BF16 or F16, else UNIMPLEMENTED naming the tensor.
// Corrupt, truncated or missing files are DATA_LOSS / NOT_FOUND from
// SafetensorsModel::Open (naming the file). An `lm_head.weight` of a tied
// model that differs from the embedding is INVALID_ARGUMENT (the store's
// embedding has then already been written).
//
// Memory: no allocation proportional to the model; tensors are converted
// from the mappings into place.
absl::Status LoadHfWeights(const std::string& hf_dir, HostStore* store);

// Writes `store`'s fp32 master weights as the HF directory `out_dir`:
// `config.json` (ModelConfig::ToHfConfigJson, torch_dtype "bfloat16" or
// "float32"), `generation_config.json` (bos/eos token ids), and the tensors
// of the layout in `dtype`. Tensors are assigned to shards in HF order
// (embedding, layers, final norm, lm_head), a new shard starting when the
// next tensor would take the current one past `max_shard_bytes` (a tensor
// larger than that gets a shard of its own, as in transformers). One shard
// is written as `model.safetensors`; several as
// `model-00001-of-0000N.safetensors` plus `model.safetensors.index.json`
// ({"metadata": {"total_size": <tensor bytes>}, "weight_map": {...}}).
//
// `out_dir` must not exist or be an empty directory; missing parent
// directories are created. The files are written into a temporary directory
// `.<name>.tmp.XXXXXX` beside `out_dir`, each fsync'd, then the directory is
// fsync'd and renamed onto `out_dir` and the parent fsync'd: a crash leaves
// either no `out_dir` or a complete one (plus, possibly, the hidden
// temporary directory, which no later export deletes: a user's own entry
// could bear such a name).
//
// Paths (Note [Directory descriptors] in dir_fd.h): `out_dir` must be
// absolute, without "." or ".." components, and lie below `root` (an
// absolute directory the caller trusts, opened by path; its last component
// must not be a symbolic link). Every component between `root` and
// `out_dir`, and everything written below, is reached through directory
// descriptors from `root` (mkdirat / openat with O_NOFOLLOW), never by path:
// a symbolic link at any of them, there before the call or swapped in
// during it, fails the export with FAILED_PRECONDITION naming the
// component, and nothing outside `root` is created, written or deleted.
// The daemon passes the path it checked against --output_roots resolved
// (no links), so the default root "/" makes the whole path link-free; a
// local caller whose path crosses its own links passes a resolved path
// (std::filesystem::weakly_canonical) or the root it trusts.
//
// Memory: bf16 conversion goes through a bounded buffer (SafetensorsWriter);
// fp32 is written straight from the store.
//
// Errors: INVALID_ARGUMENT for max_shard_bytes < 1, or an `out_dir` that is
// relative, has "."/".." components or is not below `root`; ALREADY_EXISTS
// when `out_dir` exists and is not an empty directory (a symbolic link
// there counts as existing); FAILED_PRECONDITION when a symbolic link or a
// non-directory is on the way below `root`; RESOURCE_EXHAUSTED when the
// disk is full; others from the file system, naming the path.
//
// Example:
//   MEGATRAIN_RETURN_IF_ERROR(ExportHfDirectory(trainer->store(),
//                                               "/out/hf-step-1000",
//                                               ExportDtype::kBf16));
absl::Status ExportHfDirectory(const HostStore& store, const std::string& out_dir,
                               ExportDtype dtype, int64_t max_shard_bytes = kDefaultMaxShardBytes,
                               const std::string& root = "/");

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_HF_MODEL_H_
