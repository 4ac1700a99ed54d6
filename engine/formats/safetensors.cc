// safetensors reader, writer and sharded-model loader (see safetensors.h).
#include "engine/formats/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a "
              "little-endian host");

namespace {

using Json = nlohmann::json;

// Bytes of the little-endian header length prefix.
constexpr uint64_t kLengthPrefixBytes = 8;

// Deepest JSON nesting we parse. A safetensors header needs 3 levels (root,
// tensor entry, shape array) and an index 3; the bound stops a hostile header
// from building a deep tree.
constexpr int kMaxJsonDepth = 16;

// fp32 elements converted per chunk when writing BF16: 256 KiB of output
// keeps the buffer in L2 and the write calls large.
constexpr size_t kConvertChunkElements = size_t{1} << 17;

struct DtypeEntry {
  SafetensorsDtype dtype;
  std::string_view name;
  size_t size_bytes;
};

// Names and sizes from the reference's `Dtype` enum (safetensors/src/tensor.rs).
constexpr DtypeEntry kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 1},      {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},          {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},        {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},      {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},        {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},        {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kU64, "U64", 8},
};

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;  // little-endian host (static_assert above)
}

// Parses `text` as JSON, refusing duplicate keys at any level (nlohmann would
// silently keep the last one, and two entries for one tensor name must not
// pass) and nesting deeper than kMaxJsonDepth. Errors: DATA_LOSS prefixed by
// `context`, with the parser's byte position.
absl::StatusOr<Json> ParseJsonStrict(std::string_view text, std::string_view context) {
  std::vector<absl::flat_hash_set<std::string>> open_objects;
  std::string duplicate_key;
  bool too_deep = false;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          too_deep = true;
          return false;  // Discard the subtree; the parse fails below.
        }
        if (event == Json::parse_event_t::object_start) {
          open_objects.emplace_back();
        }
        return true;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        return true;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate_key.empty()) {
          duplicate_key = parsed.get<std::string>();
        }
        return true;
      default:
        return true;
    }
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), callback,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrFormat("%s: invalid JSON: %s", context, e.what()));
  }
  if (too_deep) {
    return absl::DataLossError(
        absl::StrFormat("%s: JSON nested deeper than %d levels", context, kMaxJsonDepth));
  }
  if (!duplicate_key.empty()) {
    return absl::DataLossError(
        absl::StrFormat("%s: duplicate JSON key '%s'", context, duplicate_key));
  }
  return json;
}

// Serializes `s` as a JSON string literal. Errors: INVALID_ARGUMENT when `s`
// is not valid UTF-8.
absl::StatusOr<std::string> JsonQuote(const std::string& s, std::string_view what) {
  try {
    return Json(s).dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s '%s': not valid UTF-8", what, absl::CHexEscape(ToAbsl(s))));
  }
}

// Reads a non-negative JSON integer; false for anything else (negative,
// fractional, beyond 64 bits, not a number).
bool GetUnsigned(const Json& value, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t dim_idx = 0; dim_idx < shape.size(); ++dim_idx) {
    if (dim_idx > 0) out += ", ";
    out += std::to_string(shape[dim_idx]);
  }
  return out + "]";
}

// Validates one tensor entry of the header and fills `info` (name already
// set). `data_size_bytes` is the size of the data section.
absl::Status ParseTensorEntry(const Json& entry, uint64_t data_size_bytes,
                              uint64_t data_offset_bytes, std::string_view source,
                              SafetensorsTensorInfo* info) {
  const std::string where = absl::StrFormat("%s: tensor '%s'", source, info->name);
  if (!entry.is_object()) {
    return absl::DataLossError(
        absl::StrFormat("%s: entry is a JSON %s, not an object", where, entry.type_name()));
  }
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end()) {
    return absl::DataLossError(
        absl::StrFormat("%s: entry needs \"dtype\", \"shape\" and \"data_offsets\"", where));
  }

  if (!dtype_it->is_string()) {
    return absl::DataLossError(absl::StrFormat("%s: \"dtype\" is not a string", where));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  const std::optional<SafetensorsDtype> dtype = SafetensorsDtypeFromName(dtype_name);
  if (!dtype.has_value()) {
    return absl::DataLossError(
        absl::StrFormat("%s: unknown dtype '%s'", where, absl::CHexEscape(dtype_name)));
  }
  info->dtype = *dtype;

  if (!shape_it->is_array()) {
    return absl::DataLossError(absl::StrFormat("%s: \"shape\" is not an array", where));
  }
  info->shape.clear();
  info->shape.reserve(shape_it->size());
  uint64_t num_elements = 1;
  bool overflow = false;
  for (size_t dim_idx = 0; dim_idx < shape_it->size(); ++dim_idx) {
    uint64_t dim;
    const Json& dim_json = (*shape_it)[dim_idx];
    if (!GetUnsigned(dim_json, &dim) ||
        dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::DataLossError(
          absl::StrFormat("%s: shape[%u] = %s is not a non-negative 64-bit integer", where, dim_idx,
                          dim_json.dump(-1, ' ', false, Json::error_handler_t::replace)));
    }
    info->shape.push_back(static_cast<int64_t>(dim));
    overflow |= __builtin_mul_overflow(num_elements, dim, &num_elements);
  }
  const size_t element_bytes = SafetensorsDtypeSizeBytes(info->dtype);
  uint64_t needed_bytes = 0;
  if (overflow || num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(num_elements, uint64_t{element_bytes}, &needed_bytes)) {
    return absl::DataLossError(absl::StrFormat("%s: %s x shape %s overflows 64 bits", where,
                                               dtype_name, ShapeString(info->shape)));
  }
  info->num_elements = static_cast<int64_t>(num_elements);

  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !GetUnsigned((*offsets_it)[0], &info->data_begin) ||
      !GetUnsigned((*offsets_it)[1], &info->data_end)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: \"data_offsets\" is not [begin, end] of non-negative integers", where));
  }
  if (info->data_begin > info->data_end) {
    return absl::DataLossError(absl::StrFormat("%s: data_offsets [%u, %u] end before they begin",
                                               where, info->data_begin, info->data_end));
  }
  if (info->data_end > data_size_bytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: data_offsets [%u, %u] run past the data section of %u bytes "
                        "(file offset %u > file size %u)",
                        where, info->data_begin, info->data_end, data_size_bytes,
                        data_offset_bytes + info->data_end, data_offset_bytes + data_size_bytes));
  }
  if (info->size_bytes() != needed_bytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %u bytes on disk, dtype x shape needs %u (%s %s, data_offsets "
                        "[%u, %u])",
                        where, info->size_bytes(), needed_bytes, dtype_name,
                        ShapeString(info->shape), info->data_begin, info->data_end));
  }
  return absl::OkStatus();
}

absl::Status ParseMetadata(const Json& metadata, std::string_view source,
                           std::map<std::string, std::string>* out) {
  if (!metadata.is_object()) {
    return absl::DataLossError(absl::StrFormat("%s: \"__metadata__\" is a JSON %s, not an object",
                                               source, metadata.type_name()));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return absl::DataLossError(
          absl::StrFormat("%s: \"__metadata__\" value of '%s' is a JSON %s, not a string", source,
                          key, value.type_name()));
    }
    (*out)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Dtypes and conversion

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.dtype == dtype) return entry.name;
  }
  return "?";
}

std::optional<SafetensorsDtype> SafetensorsDtypeFromName(std::string_view name) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

size_t SafetensorsDtypeSizeBytes(SafetensorsDtype dtype) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.dtype == dtype) return entry.size_bytes;
  }
  return 1;
}

float Fp16BitsToFloat(uint16_t bits) {
  // binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Rebias the
  // exponent to binary32's 127; subnormals are normalized by shifting.
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1fu) {  // inf or NaN; keep the payload, NaN stays NaN
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // +-0
    out = sign;
  } else {           // subnormal: value = mantissa x 2^-24
    exponent = 113;  // 127 - 15 + 1
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    out = sign | (exponent << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof(value));
  return value;
}

absl::Status ConvertToFloat32(SafetensorsDtype dtype, absl::Span<const uint8_t> src,
                              absl::Span<float> dst) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
    case SafetensorsDtype::kBF16:
    case SafetensorsDtype::kF16:
      break;
    default:
      return absl::UnimplementedError(
          absl::StrFormat("conversion of dtype %s to F32 is not supported (F32, BF16 and F16 "
                          "are)",
                          SafetensorsDtypeName(dtype)));
  }
  const size_t element_bytes = SafetensorsDtypeSizeBytes(dtype);
  if (src.size() / element_bytes != dst.size() || src.size() % element_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%u bytes of %s do not hold %u elements",
                                                      src.size(), SafetensorsDtypeName(dtype),
                                                      dst.size()));
  }
  if (dst.empty()) return absl::OkStatus();
  const uint8_t* in = src.data();
  float* out = dst.data();
  const size_t n = dst.size();
  switch (dtype) {
    case SafetensorsDtype::kF32:
      std::memcpy(out, in, n * sizeof(float));
      break;
    case SafetensorsDtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, sizeof(bits));
        out[i] = Bf16ToFloat(bits);
      }
      break;
    case SafetensorsDtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, sizeof(bits));
        out[i] = Fp16BitsToFloat(bits);
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Header parser

namespace {

// The 8-byte length prefix and the sizes it implies (header, data offset
// and size in `header`), checked against the file and the prefix given.
absl::Status ParseLengthPrefix(absl::Span<const uint8_t> file_bytes_prefix, uint64_t file_size,
                               std::string_view source, SafetensorsHeader* header) {
  if (file_bytes_prefix.size() > file_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: prefix of %u bytes is longer than the file size %u", source,
                        file_bytes_prefix.size(), file_size));
  }
  if (file_size < kLengthPrefixBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: file is %u bytes, shorter than the 8-byte header length "
                        "(truncated?)",
                        source, file_size));
  }
  if (file_bytes_prefix.size() < kLengthPrefixBytes) {
    return absl::OutOfRangeError(absl::StrFormat("%s: need the first 8 bytes of the file, got %u",
                                                 source, file_bytes_prefix.size()));
  }
  header->header_size_bytes = LoadLe64(file_bytes_prefix.data());
  if (header->header_size_bytes > kSafetensorsMaxHeaderBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: header length %u bytes (at offset 0) exceeds the %u-byte limit",
                        source, header->header_size_bytes, kSafetensorsMaxHeaderBytes));
  }
  header->data_offset_bytes = kLengthPrefixBytes + header->header_size_bytes;
  if (header->data_offset_bytes > file_size) {
    return absl::DataLossError(
        absl::StrFormat("%s: header length %u bytes (at offset 0) runs past the end of the "
                        "%u-byte file (truncated?)",
                        source, header->header_size_bytes, file_size));
  }
  if (file_bytes_prefix.size() < header->data_offset_bytes) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s: need the first %u bytes of the file to parse the header, got %u",
                        source, header->data_offset_bytes, file_bytes_prefix.size()));
  }
  header->data_size_bytes = file_size - header->data_offset_bytes;
  return absl::OkStatus();
}

// Sorted by offsets, the tensors must tile the data section: each starts
// where the previous one ended (reference: Metadata::validate).
absl::Status CheckTensorsTileData(SafetensorsHeader* header, std::string_view source) {
  std::sort(header->tensors.begin(), header->tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  uint64_t expected_begin = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const SafetensorsTensorInfo& info : header->tensors) {
    if (info.data_begin < expected_begin) {
      return absl::DataLossError(
          absl::StrFormat("%s: tensor '%s': data_offsets [%u, %u] overlap tensor '%s' "
                          "[%u, %u]",
                          source, info.name, info.data_begin, info.data_end, previous->name,
                          previous->data_begin, previous->data_end));
    }
    if (info.data_begin > expected_begin) {
      return absl::DataLossError(absl::StrFormat(
          "%s: tensor '%s': data_offsets [%u, %u] leave a hole of %u bytes "
          "after %s (data section offset %u)",
          source, info.name, info.data_begin, info.data_end, info.data_begin - expected_begin,
          previous == nullptr ? std::string("the header")
                              : absl::StrFormat("tensor '%s'", previous->name),
          expected_begin));
    }
    expected_begin = info.data_end;
    previous = &info;
  }
  if (expected_begin != header->data_size_bytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %u bytes after the last tensor are described by no tensor (data "
                        "section of %u bytes, tensors end at %u; file offset %u)",
                        source, header->data_size_bytes - expected_begin, header->data_size_bytes,
                        expected_begin, header->data_offset_bytes + expected_begin));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::Span<const uint8_t> file_bytes_prefix, uint64_t file_size, std::string_view source) {
  SafetensorsHeader header;
  MEGATRAIN_RETURN_IF_ERROR(ParseLengthPrefix(file_bytes_prefix, file_size, source, &header));
  const std::string_view text(
      reinterpret_cast<const char*>(file_bytes_prefix.data()) + kLengthPrefixBytes,
      static_cast<size_t>(header.header_size_bytes));
  if (text.empty() || text.front() != '{') {
    return absl::DataLossError(
        absl::StrFormat("%s: JSON header at offset 8 does not start with '{'", source));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(
      Json json, ParseJsonStrict(text, absl::StrFormat("%s: header (offset 8, %u bytes)", source,
                                                       text.size())));
  if (!json.is_object()) {
    return absl::DataLossError(absl::StrFormat("%s: JSON header is not an object", source));
  }

  header.tensors.reserve(json.size());
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      MEGATRAIN_RETURN_IF_ERROR(ParseMetadata(value, source, &header.metadata));
      continue;
    }
    SafetensorsTensorInfo info;
    info.name = key;
    MEGATRAIN_RETURN_IF_ERROR(
        ParseTensorEntry(value, header.data_size_bytes, header.data_offset_bytes, source, &info));
    header.tensors.push_back(std::move(info));
  }

  MEGATRAIN_RETURN_IF_ERROR(CheckTensorsTileData(&header, source));
  return header;
}

// ---------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(MappedFile file, SafetensorsHeader header)
    : file_(std::move(file)), header_(std::move(header)) {
  index_.reserve(header_.tensors.size());
  for (size_t tensor_idx = 0; tensor_idx < header_.tensors.size(); ++tensor_idx) {
    index_.emplace(header_.tensors[tensor_idx].name, tensor_idx);
  }
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsHeader header,
                             ParseSafetensorsHeader(file.bytes(), file.size(), path));
  return SafetensorsFile(std::move(file), std::move(header));
}

bool SafetensorsFile::Contains(std::string_view name) const {
  return index_.contains(ToAbsl(name));
}

absl::StatusOr<const SafetensorsTensorInfo*> SafetensorsFile::Find(std::string_view name) const {
  const auto it = index_.find(ToAbsl(name));
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrFormat("%s: no tensor '%s' (file has %u tensors)", path(),
                                               name, header_.tensors.size()));
  }
  return &header_.tensors[it->second];
}

absl::Span<const uint8_t> SafetensorsFile::Data(const SafetensorsTensorInfo& info) const {
  return file_.bytes().subspan(static_cast<size_t>(header_.data_offset_bytes + info.data_begin),
                               static_cast<size_t>(info.size_bytes()));
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::Data(std::string_view name) const {
  MEGATRAIN_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  return Data(*info);
}

absl::Status SafetensorsFile::ReadAsFloat32(std::string_view name, float* dst, int64_t n) const {
  MEGATRAIN_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  if (n != info->num_elements) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor '%s': destination holds %d floats, tensor has %d "
                        "elements (shape %s)",
                        path(), name, n, info->num_elements, ShapeString(info->shape)));
  }
  return Annotate(
      ConvertToFloat32(info->dtype, Data(*info), absl::Span<float>(dst, static_cast<size_t>(n))),
      absl::StrFormat("%s: tensor '%s'", path(), name));
}

// ---------------------------------------------------------------------------
// SafetensorsWriter

SafetensorsWriter::SafetensorsWriter(AtomicFileWriter file) : file_(std::move(file)) {
  metadata_["format"] = "pt";
}

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(const std::string& path) {
  MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path));
  return SafetensorsWriter(std::move(file));
}

absl::StatusOr<int64_t> SafetensorsWriter::CheckNewTensor(const std::string& name,
                                                          const std::vector<int64_t>& shape) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: cannot add tensor '%s' after Finish()", file_.path(), name));
  }
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor name '%s' is reserved or empty", file_.path(), name));
  }
  MEGATRAIN_RETURN_IF_ERROR(Annotate(JsonQuote(name, "tensor name").status(), file_.path()));
  if (names_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s: tensor '%s' added twice", file_.path(), name));
  }
  int64_t num_elements = 1;
  for (size_t dim_idx = 0; dim_idx < shape.size(); ++dim_idx) {
    if (shape[dim_idx] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: tensor '%s': shape[%u] = %d is negative", file_.path(), name,
                          dim_idx, shape[dim_idx]));
    }
    if (__builtin_mul_overflow(num_elements, shape[dim_idx], &num_elements)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: tensor '%s': shape %s has more than 2^63 elements", file_.path(),
                          name, ShapeString(shape)));
    }
  }
  return num_elements;
}

absl::Status SafetensorsWriter::AddFloat32(std::string name, SafetensorsDtype dtype,
                                           std::vector<int64_t> shape, const float* data) {
  MEGATRAIN_ASSIGN_OR_RETURN(const int64_t num_elements, CheckNewTensor(name, shape));
  if (dtype != SafetensorsDtype::kF32 && dtype != SafetensorsDtype::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tensor '%s': fp32 data can be stored as F32 or BF16, not %s",
                        file_.path(), name, SafetensorsDtypeName(dtype)));
  }
  if (data == nullptr && num_elements > 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor '%s': null data for %d elements",
                                                      file_.path(), name, num_elements));
  }
  const uint64_t size_bytes =
      static_cast<uint64_t>(num_elements) * SafetensorsDtypeSizeBytes(dtype);
  names_.emplace(name, entries_.size());
  entries_.push_back(
      Entry{std::move(name), dtype, std::move(shape), num_elements, size_bytes, data, nullptr});
  data_size_bytes_ += size_bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddBytes(std::string name, SafetensorsDtype dtype,
                                         std::vector<int64_t> shape,
                                         absl::Span<const uint8_t> bytes) {
  MEGATRAIN_ASSIGN_OR_RETURN(const int64_t num_elements, CheckNewTensor(name, shape));
  uint64_t size_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(num_elements),
                             uint64_t{SafetensorsDtypeSizeBytes(dtype)}, &size_bytes) ||
      size_bytes != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensor '%s': %u bytes given, %s x shape %s needs %u", file_.path(), name, bytes.size(),
        SafetensorsDtypeName(dtype), ShapeString(shape), size_bytes));
  }
  names_.emplace(name, entries_.size());
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), num_elements, size_bytes,
                           nullptr, bytes.data()});
  data_size_bytes_ += size_bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: cannot set metadata after Finish()", file_.path()));
  }
  MEGATRAIN_RETURN_IF_ERROR(Annotate(JsonQuote(key, "metadata key").status(), file_.path()));
  MEGATRAIN_RETURN_IF_ERROR(Annotate(JsonQuote(value, "metadata value").status(), file_.path()));
  metadata_[std::move(key)] = std::move(value);
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::WriteEntry(const Entry& entry) {
  const size_t n = static_cast<size_t>(entry.num_elements);
  if (entry.byte_source != nullptr) {
    return file_.Append(
        absl::Span<const uint8_t>(entry.byte_source, static_cast<size_t>(entry.size_bytes)));
  }
  if (entry.dtype == SafetensorsDtype::kF32) {
    // Little-endian host: the fp32 buffer already is the file's encoding.
    return file_.Append(absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(entry.float_source), n * sizeof(float)));
  }
  // BF16: convert through a bounded chunk buffer.
  std::vector<bf16_bits> chunk(std::min(n, kConvertChunkElements));
  for (size_t begin = 0; begin < n; begin += chunk.size()) {
    const size_t count = std::min(chunk.size(), n - begin);
    for (size_t i = 0; i < count; ++i) {
      chunk[i] = FloatToBf16(entry.float_source[begin + i]);
    }
    MEGATRAIN_RETURN_IF_ERROR(file_.Append(absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(chunk.data()), count * sizeof(bf16_bits))));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: Finish() called twice", file_.path()));
  }
  finished_ = true;

  // Data order: element size descending, then name (reference `prepare`), so
  // each tensor starts aligned to its element size.
  std::vector<const Entry*> order;
  order.reserve(entries_.size());
  for (const Entry& entry : entries_) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const size_t a_size = SafetensorsDtypeSizeBytes(a->dtype);
    const size_t b_size = SafetensorsDtypeSizeBytes(b->dtype);
    if (a_size != b_size) return a_size > b_size;
    return a->name < b->name;
  });

  // Header JSON by hand, to control the order: __metadata__ first, then the
  // tensors in data order. Names and metadata were checked to be UTF-8.
  std::string json = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [key, value] : metadata_) {
    if (!first) json += ',';
    first = false;
    json += *JsonQuote(key, "metadata key");
    json += ':';
    json += *JsonQuote(value, "metadata value");
  }
  json += '}';
  uint64_t offset = 0;
  for (const Entry* entry : order) {
    json += ',';
    json += *JsonQuote(entry->name, "tensor name");
    json += absl::StrFormat(":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%u,%u]}",
                            SafetensorsDtypeName(entry->dtype), Json(entry->shape).dump(), offset,
                            offset + entry->size_bytes);
    offset += entry->size_bytes;
  }
  json += '}';
  // Pad with spaces so the data section starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');

  const uint64_t header_size_bytes = json.size();
  uint8_t length_prefix[kLengthPrefixBytes];
  std::memcpy(length_prefix, &header_size_bytes, sizeof(length_prefix));
  MEGATRAIN_RETURN_IF_ERROR(file_.Append(length_prefix));
  MEGATRAIN_RETURN_IF_ERROR(file_.Append(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(json.data()), json.size())));
  for (const Entry* entry : order) {
    MEGATRAIN_RETURN_IF_ERROR(WriteEntry(*entry));
  }
  return file_.Commit();
}

// ---------------------------------------------------------------------------
// Sharded index

std::vector<std::string> SafetensorsIndex::ShardFiles() const {
  std::set<std::string> files;
  for (const auto& [tensor, file] : weight_map) files.insert(file);
  return std::vector<std::string>(files.begin(), files.end());
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json_text,
                                                       std::string_view source) {
  MEGATRAIN_ASSIGN_OR_RETURN(Json json, ParseJsonStrict(json_text, source));
  if (!json.is_object()) {
    return absl::DataLossError(absl::StrFormat("%s: index is not a JSON object", source));
  }
  SafetensorsIndex index;
  const auto metadata_it = json.find("metadata");
  if (metadata_it != json.end() && !metadata_it->is_null()) {
    if (!metadata_it->is_object()) {
      return absl::DataLossError(absl::StrFormat("%s: \"metadata\" is a JSON %s, not an object",
                                                 source, metadata_it->type_name()));
    }
    const auto total_it = metadata_it->find("total_size");
    if (total_it != metadata_it->end()) {
      uint64_t total_size_bytes;
      if (!GetUnsigned(*total_it, &total_size_bytes)) {
        return absl::DataLossError(
            absl::StrFormat("%s: \"metadata.total_size\" is not a non-negative integer", source));
      }
      index.total_size_bytes = total_size_bytes;
    }
  }
  const auto weight_map_it = json.find("weight_map");
  if (weight_map_it == json.end() || !weight_map_it->is_object() || weight_map_it->empty()) {
    return absl::DataLossError(
        absl::StrFormat("%s: \"weight_map\" is missing, empty or not an object", source));
  }
  for (const auto& [tensor, file_json] : weight_map_it->items()) {
    if (!file_json.is_string()) {
      return absl::DataLossError(
          absl::StrFormat("%s: weight_map['%s'] is a JSON %s, not a file name", source, tensor,
                          file_json.type_name()));
    }
    const std::string& file = file_json.get_ref<const std::string&>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      return absl::DataLossError(
          absl::StrFormat("%s: weight_map['%s'] = '%s' is not a file name next to the index",
                          source, tensor, absl::CHexEscape(file)));
    }
    index.weight_map.emplace(tensor, file);
  }
  return index;
}

// ---------------------------------------------------------------------------
// SafetensorsModel

namespace {

constexpr std::string_view kSingleFileName = "model.safetensors";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

}  // namespace

absl::StatusOr<SafetensorsModel> SafetensorsModel::Open(const std::string& dir) {
  SafetensorsModel model;
  model.dir_ = dir;
  const std::string single_path =
      JoinPath(dir, absl::string_view(kSingleFileName.data(), kSingleFileName.size()));
  absl::StatusOr<SafetensorsFile> single = SafetensorsFile::Open(single_path);
  if (single.ok()) {
    model.files_.push_back(*std::move(single));
    const SafetensorsFile& file = model.files_.front();
    for (size_t tensor_idx = 0; tensor_idx < file.tensors().size(); ++tensor_idx) {
      model.index_.emplace(file.tensors()[tensor_idx].name, std::make_pair(size_t{0}, tensor_idx));
      model.tensor_bytes_ += file.tensors()[tensor_idx].size_bytes();
    }
    return model;
  }
  if (!absl::IsNotFound(single.status())) return single.status();

  const std::string index_path =
      JoinPath(dir, absl::string_view(kIndexFileName.data(), kIndexFileName.size()));
  absl::StatusOr<MappedFile> index_file = MappedFile::Open(index_path);
  if (absl::IsNotFound(index_file.status())) {
    return absl::NotFoundError(
        absl::StrFormat("%s: neither %s nor %s exists", dir, kSingleFileName, kIndexFileName));
  }
  if (!index_file.ok()) return index_file.status();
  const absl::Span<const uint8_t> index_bytes = index_file->bytes();
  MEGATRAIN_ASSIGN_OR_RETURN(
      SafetensorsIndex index,
      ParseSafetensorsIndex(
          std::string_view(reinterpret_cast<const char*>(index_bytes.data()), index_bytes.size()),
          index_path));

  const std::vector<std::string> shard_names = index.ShardFiles();
  absl::flat_hash_map<std::string, size_t> shard_idx_by_name;
  model.files_.reserve(shard_names.size());
  for (const std::string& shard_name : shard_names) {
    MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsFile shard,
                               SafetensorsFile::Open(JoinPath(dir, shard_name)));
    shard_idx_by_name.emplace(shard_name, model.files_.size());
    model.files_.push_back(std::move(shard));
  }
  // Every shard tensor must be mapped to its shard by the index...
  for (size_t file_idx = 0; file_idx < model.files_.size(); ++file_idx) {
    const SafetensorsFile& shard = model.files_[file_idx];
    for (size_t tensor_idx = 0; tensor_idx < shard.tensors().size(); ++tensor_idx) {
      const SafetensorsTensorInfo& info = shard.tensors()[tensor_idx];
      const auto mapped = index.weight_map.find(info.name);
      if (mapped == index.weight_map.end() || mapped->second != shard_names[file_idx]) {
        return absl::DataLossError(absl::StrFormat(
            "%s: tensor '%s' is in shard %s but the index maps it to %s", index_path, info.name,
            shard_names[file_idx],
            mapped == index.weight_map.end() ? std::string("nothing") : mapped->second));
      }
      model.index_.emplace(info.name, std::make_pair(file_idx, tensor_idx));
      model.tensor_bytes_ += info.size_bytes();
    }
  }
  // ...and every index entry must exist in its shard.
  for (const auto& [tensor, shard_name] : index.weight_map) {
    if (!model.index_.contains(tensor)) {
      return absl::DataLossError(
          absl::StrFormat("%s: index maps tensor '%s' to %s, which has no such tensor", index_path,
                          tensor, shard_name));
    }
  }
  model.index_json_ = std::move(index);
  return model;
}

absl::StatusOr<SafetensorsModel::TensorRef> SafetensorsModel::Find(std::string_view name) const {
  const auto it = index_.find(ToAbsl(name));
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no tensor '%s' in the model (%u tensors in %u files)", dir_, name,
                        index_.size(), files_.size()));
  }
  const SafetensorsFile& file = files_[it->second.first];
  return TensorRef{&file, &file.tensors()[it->second.second]};
}

bool SafetensorsModel::Contains(std::string_view name) const {
  return index_.contains(ToAbsl(name));
}

std::vector<std::string> SafetensorsModel::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, location] : index_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status SafetensorsModel::ReadAsFloat32(std::string_view name, float* dst, int64_t n) const {
  MEGATRAIN_ASSIGN_OR_RETURN(TensorRef ref, Find(name));
  return ref.file->ReadAsFloat32(name, dst, n);
}

}  // namespace megatrain::engine
