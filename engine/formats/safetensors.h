// Reading and writing the safetensors format (Hugging Face), the format of
// model weights that MegaTrain loads and of the weights it exports.
//
// Format (huggingface/safetensors README, "Format"):
//   bytes [0, 8)        N, u64 little-endian: size of the JSON header
//   bytes [8, 8 + N)    UTF-8 JSON object, starting with '{', possibly padded
//                       at the end with spaces (0x20):
//                         {"__metadata__": {"format": "pt"},       optional,
//                                                                  str -> str
//                          "<name>": {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [begin, end]}, ...}
//   bytes [8 + N, EOF)  the data section; a tensor's bytes are
//                       [8 + N + begin, 8 + N + end), row-major, little-endian.
//
// What ParseSafetensorsHeader() accepts is what the reference implementation
// (safetensors/src/tensor.rs, `read_metadata` and `Metadata::validate`)
// accepts, plus the README's "must begin with '{'": N <= 100 MB; the header is
// valid JSON without duplicate keys; each dtype is known; shapes are
// non-negative integers; begin <= end; end - begin equals shape x dtype size
// (overflow-checked); and, sorted by offset, the tensors tile the data section
// exactly: no overlap, no hole, nothing after the last tensor. The last rule
// (the reference's InvalidOffset / MetadataIncompleteBuffer) keeps files from
// hiding data that no tensor describes.
//
// Sharded checkpoints (HF transformers `save_pretrained`): a directory with
// `model.safetensors.index.json`
//   {"metadata": {"total_size": <bytes>}, "weight_map": {"<tensor>": "<file>"}}
// and the shard files it names, or a single `model.safetensors`.
//
// Errors: corrupt or truncated files are DATA_LOSS, and the message names the
// file, the tensor and the offending offset or byte count, e.g.
//   model.safetensors: tensor 'lm_head.weight': 8 bytes on disk, dtype x shape
//   needs 12
// A tensor that is not there is NOT_FOUND; a dtype we cannot convert is
// UNIMPLEMENTED.
//
// Conventions: sizes in bytes unless a name says elements; shapes are in
// elements per dimension, row-major; a shape of [] is a scalar (1 element).
// This host must be little-endian (checked at compile time).
//
// Pure C++ (no LibTorch): the parser is fuzzed by
// tests/fuzz/safetensors_header_fuzz.cc.
#ifndef MEGATRAIN_ENGINE_SAFETENSORS_H_
#define MEGATRAIN_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/fs/mapped_file.h"

namespace megatrain::engine {

// Element types of the safetensors format; the names in the file are the
// enumerator names without the `k` ("F32", "BF16", "F8_E4M3", ...).
enum class SafetensorsDtype : uint8_t {
  kBool,  // 1 byte, 0 or 1
  kU8,
  kI8,
  kF8E5M2,  // "F8_E5M2", 1 byte (arXiv:2209.05433)
  kF8E4M3,  // "F8_E4M3", 1 byte
  kI16,
  kU16,
  kF16,   // IEEE-754 binary16
  kBF16,  // bfloat16: upper half of a binary32
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// The dtype's name as written in the header, e.g. "BF16".
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);

// Parses a header dtype name ("F32"); std::nullopt when unknown.
std::optional<SafetensorsDtype> SafetensorsDtypeFromName(std::string_view name);

// Bytes per element: 1, 2, 4 or 8.
size_t SafetensorsDtypeSizeBytes(SafetensorsDtype dtype);

// Largest JSON header we accept, in bytes; the reference's MAX_HEADER_SIZE.
// Real headers are a few hundred KB even for models with thousands of
// tensors; the cap bounds the memory a hostile file can make us allocate.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor entry of the header.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;  // elements per dimension; [] is a scalar
  int64_t num_elements = 0;    // product of shape (1 for a scalar)
  uint64_t data_begin = 0;     // bytes, relative to the data section
  uint64_t data_end = 0;       // bytes, relative to the data section

  // Bytes of the tensor's data: data_end - data_begin.
  uint64_t size_bytes() const { return data_end - data_begin; }
};

// The parsed, validated header of one safetensors file.
//
// Thread-safety: plain value type.
struct SafetensorsHeader {
  uint64_t header_size_bytes = 0;  // N, the JSON header's size
  uint64_t data_offset_bytes = 0;  // 8 + N: file offset of the data section
  uint64_t data_size_bytes = 0;    // file size - 8 - N
  // Sorted by data_begin (then name for empty tensors); they tile
  // [0, data_size_bytes) exactly.
  std::vector<SafetensorsTensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", may be empty
};

// Parses and validates a safetensors header. `file_bytes_prefix` holds the
// first bytes of the file (at least 8 + N of them; passing the whole file is
// fine); `file_size` is the file's full size in bytes, against which the
// offsets are checked; `source` names the file in error messages. Pure: no
// I/O, no global state, safe on any input (this is the fuzzed entry point).
//
// Errors:
//   DATA_LOSS for a corrupt or truncated file: file shorter than 8 bytes,
//     N > kSafetensorsMaxHeaderBytes or past the end of the file, header not
//     starting with '{', invalid JSON or UTF-8, duplicate keys, a non-object
//     entry, missing or mistyped fields, an unknown dtype, a negative or
//     non-integer dimension, element count or byte size overflowing 64 bits,
//     begin > end, end past the data section, byte length != shape x dtype
//     size, overlapping tensors, a hole between tensors or bytes after the
//     last tensor, `__metadata__` not a str -> str object.
//   OUT_OF_RANGE when the file is long enough but `file_bytes_prefix` stops
//     before the end of the header (read more and call again).
//   INVALID_ARGUMENT when `file_bytes_prefix` is longer than `file_size`.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::Span<const uint8_t> file_bytes_prefix, uint64_t file_size, std::string_view source);

// IEEE-754 binary16 bits -> float (exact; handles subnormals, infinities and
// NaN).
float Fp16BitsToFloat(uint16_t bits);

// Converts `src`, little-endian elements of `dtype`, to fp32 in `dst`
// (dst.size() elements). F32 is copied bit for bit; BF16 and F16 widen
// exactly.
// Errors: UNIMPLEMENTED for any other dtype (the message names it);
// INVALID_ARGUMENT when src.size() != dst.size() x element size.
absl::Status ConvertToFloat32(SafetensorsDtype dtype, absl::Span<const uint8_t> src,
                              absl::Span<float> dst);

// A memory-mapped, validated safetensors file.
//
// Ownership and lifetime: move-only; owns the mapping (MappedFile). Spans
// returned by Data() point into the mapping and are valid while this object
// (or the one it was moved into) lives.
//
// Thread-safety: immutable after Open(); const methods are safe to call
// concurrently.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsFile file,
//                              SafetensorsFile::Open("model.safetensors"));
//   std::vector<float> w(hidden * vocab);
//   MEGATRAIN_RETURN_IF_ERROR(
//       file.ReadAsFloat32("lm_head.weight", w.data(), w.size()));
class SafetensorsFile {
 public:
  // Maps `path` and validates its header (ParseSafetensorsHeader).
  // Errors: those of MappedFile::Open (NOT_FOUND for a missing file) and of
  // ParseSafetensorsHeader (DATA_LOSS), messages starting with `path`.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The path given to Open().
  const std::string& path() const { return file_.path(); }
  // The parsed header.
  const SafetensorsHeader& header() const { return header_; }
  // Every tensor, sorted by offset in the file.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  // The "__metadata__" map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // File size in bytes.
  uint64_t size_bytes() const { return file_.size(); }

  // Whether a tensor called `name` exists.
  bool Contains(std::string_view name) const;

  // The tensor called `name`. The pointer is valid while this object lives.
  // Errors: NOT_FOUND naming the file and the tensor.
  absl::StatusOr<const SafetensorsTensorInfo*> Find(std::string_view name) const;

  // The raw little-endian bytes of `info`, which must come from tensors() or
  // Find() of this file (not checked).
  absl::Span<const uint8_t> Data(const SafetensorsTensorInfo& info) const;

  // The raw bytes of the tensor called `name`.
  // Errors: NOT_FOUND.
  absl::StatusOr<absl::Span<const uint8_t>> Data(std::string_view name) const;

  // Converts the tensor called `name` to fp32 into `dst`, which holds `n`
  // floats; `n` must equal the tensor's element count.
  // Errors: NOT_FOUND; INVALID_ARGUMENT when `n` differs from the element
  // count; UNIMPLEMENTED when the dtype is not F32, BF16 or F16 (the message
  // names it).
  absl::Status ReadAsFloat32(std::string_view name, float* dst, int64_t n) const;

 private:
  SafetensorsFile(MappedFile file, SafetensorsHeader header);

  MappedFile file_;
  SafetensorsHeader header_;
  // Tensor name -> index in header_.tensors.
  absl::flat_hash_map<std::string, size_t> index_;
};

// Writes one safetensors file, streaming tensor data from the caller's
// buffers: fp32 sources are written as F32 straight from the buffer or
// converted to BF16 (FloatToBf16: round to nearest even) through a small
// chunk buffer, so no second full copy of the model is made.
//
// Layout (as the reference writer does): the header lists "__metadata__"
// (always with {"format": "pt"}, as PyTorch's save_file writes) then the
// tensors in data order; it is padded with spaces so the data section starts
// 8-byte aligned; tensors are ordered by element size, largest first, then by
// name, so every tensor starts aligned to its element size.
//
// The file appears at `path` only when Finish() succeeds (AtomicFileWriter:
// temporary file, fsync, rename).
//
// Ownership and lifetime: move-only. Add*() records a pointer to the
// caller's data without copying it: the data must stay alive and unchanged
// until Finish() returns. Destroying an unfinished writer deletes the
// temporary file.
//
// Thread-safety: not thread-safe.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsWriter writer,
//                              SafetensorsWriter::Create(path));
//   MEGATRAIN_RETURN_IF_ERROR(writer.AddFloat32(
//       "lm_head.weight", SafetensorsDtype::kBF16, {vocab, hidden}, w));
//   MEGATRAIN_RETURN_IF_ERROR(writer.Finish());
class SafetensorsWriter {
 public:
  // Creates the temporary file next to `path`.
  // Errors: those of AtomicFileWriter::Create (NOT_FOUND for a missing
  // directory, PERMISSION_DENIED, ...).
  static absl::StatusOr<SafetensorsWriter> Create(const std::string& path);

  SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Adds a tensor from fp32 `data` (product of `shape` elements, row-major),
  // stored as `dtype`, which must be kF32 or kBF16.
  // Errors: INVALID_ARGUMENT for an empty name, the name "__metadata__", a
  // name that is not valid UTF-8, a negative dimension, an element count
  // overflowing int64, a null `data` with a non-zero element count, or a
  // dtype other than F32/BF16; ALREADY_EXISTS for a repeated name;
  // FAILED_PRECONDITION after Finish().
  absl::Status AddFloat32(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                          const float* data);

  // Adds a tensor whose data is already encoded: `bytes` holds the
  // little-endian elements of `dtype` (any dtype), e.g. bf16 weights kept as
  // bf16 bits. The bytes are written as they are.
  // Errors: as AddFloat32, plus INVALID_ARGUMENT when bytes.size() is not
  // product(shape) x element size.
  absl::Status AddBytes(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                        absl::Span<const uint8_t> bytes);

  // Sets `key` in "__metadata__" (overwriting an earlier value, "format"
  // included).
  // Errors: INVALID_ARGUMENT when key or value is not valid UTF-8;
  // FAILED_PRECONDITION after Finish().
  absl::Status SetMetadata(std::string key, std::string value);

  // Writes the header and every tensor, fsyncs and renames the file onto
  // `path`. Blocks until the data is on disk.
  // Errors: RESOURCE_EXHAUSTED when the disk is full; others from the file
  // system, naming the path; FAILED_PRECONDITION when called twice.
  absl::Status Finish();

  // Total size of the tensors added so far, in bytes (the data section).
  uint64_t data_size_bytes() const { return data_size_bytes_; }

 private:
  // One tensor to write; `source` is borrowed.
  struct Entry {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    int64_t num_elements;
    uint64_t size_bytes;
    const float* float_source;   // non-null: fp32 source, convert to dtype
    const uint8_t* byte_source;  // non-null: already-encoded bytes
  };

  explicit SafetensorsWriter(AtomicFileWriter file);
  absl::StatusOr<int64_t> CheckNewTensor(const std::string& name,
                                         const std::vector<int64_t>& shape);
  absl::Status WriteEntry(const Entry& entry);

  AtomicFileWriter file_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> names_;  // name -> entries_ index
  std::map<std::string, std::string> metadata_;
  uint64_t data_size_bytes_ = 0;
  bool finished_ = false;
};

// The parsed `model.safetensors.index.json` of a sharded checkpoint.
struct SafetensorsIndex {
  // "metadata"."total_size" in bytes, when present. Informational: writers
  // differ on whether it counts tied or padded tensors, so it is not checked
  // against the shards.
  std::optional<uint64_t> total_size_bytes;
  // Tensor name -> shard file name, relative to the index's directory.
  std::map<std::string, std::string> weight_map;

  // The distinct shard file names, sorted.
  std::vector<std::string> ShardFiles() const;
};

// Parses and validates the text of a `model.safetensors.index.json`.
// `source` names the file in error messages. Pure (fuzzable).
// Errors: DATA_LOSS when the text is not a JSON object with a non-empty
// "weight_map" object of str -> str, when "metadata" is present but not an
// object or its "total_size" is not a non-negative integer, when keys repeat,
// or when a shard name is empty, ".", "..", or contains '/' or a NUL (a
// shard must sit next to its index).
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json,
                                                       std::string_view source);

// The weights of one model: either a single `model.safetensors` or the
// shards listed by `model.safetensors.index.json`, all mapped, with lookup by
// tensor name across files.
//
// Ownership and lifetime: move-only; owns every SafetensorsFile. Pointers and
// spans it returns are valid while it (or the object it was moved into)
// lives.
//
// Thread-safety: immutable after Open(); const methods are safe to call
// concurrently.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsModel model,
//                              SafetensorsModel::Open("/models/llama-1b"));
//   MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsModel::TensorRef ref,
//                              model.Find("model.embed_tokens.weight"));
//   // ref.info->shape, ref.file->Data(*ref.info)
class SafetensorsModel {
 public:
  // A tensor and the file that holds it.
  struct TensorRef {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensorInfo* info = nullptr;
  };

  // Opens `dir`/model.safetensors when it exists, otherwise
  // `dir`/model.safetensors.index.json and every shard it names.
  // Errors: NOT_FOUND when neither file exists (naming both) or a shard is
  // missing; DATA_LOSS for a corrupt file, an index entry whose tensor is not
  // in its shard, or a shard tensor that the index does not map to that
  // shard; others from MappedFile::Open.
  static absl::StatusOr<SafetensorsModel> Open(const std::string& dir);

  SafetensorsModel(SafetensorsModel&&) noexcept = default;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept = default;
  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  // The tensor called `name`.
  // Errors: NOT_FOUND naming the directory and the tensor.
  absl::StatusOr<TensorRef> Find(std::string_view name) const;

  // Whether a tensor called `name` exists.
  bool Contains(std::string_view name) const;

  // Every tensor name, sorted.
  std::vector<std::string> TensorNames() const;

  // Number of tensors over all files.
  size_t num_tensors() const { return index_.size(); }

  // The opened files: one, or one per shard (sorted by file name).
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // The parsed index; std::nullopt for a single-file model.
  const std::optional<SafetensorsIndex>& index() const { return index_json_; }

  // Sum of every tensor's size in bytes.
  uint64_t tensor_bytes() const { return tensor_bytes_; }

  // As SafetensorsFile::ReadAsFloat32 on the file holding `name`.
  absl::Status ReadAsFloat32(std::string_view name, float* dst, int64_t n) const;

 private:
  SafetensorsModel() = default;

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::optional<SafetensorsIndex> index_json_;
  // Tensor name -> (index in files_, index in that file's tensors()).
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> index_;
  uint64_t tensor_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SAFETENSORS_H_
