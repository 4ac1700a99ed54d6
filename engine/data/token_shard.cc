// Token shard reader and writer (format in token_shard.h and
// docs/data-format.md).
#include "engine/data/token_shard.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/macros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/status_macros.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this code assumes a "
              "little-endian host");

namespace {

// Byte offsets of the header fields (see the table in token_shard.h).
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 8;
constexpr size_t kTokenDtypeOffset = 12;
constexpr size_t kVocabSizeOffset = 16;
constexpr size_t kNumTokensOffset = 24;
constexpr size_t kNumDocumentsOffset = 32;
constexpr size_t kBodyChecksumOffset = 40;
constexpr size_t kFlagsOffset = 48;
constexpr size_t kReservedOffset = 52;
constexpr size_t kHeaderChecksumOffset = 56;
static_assert(kHeaderChecksumOffset + 8 == kTokenShardHeaderBytes);

constexpr uint64_t kXxhSeed = 0;

uint32_t LoadLe32(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

// Index of the first id >= `limit` among `count` little-endian ids of type
// T at `tokens`; `count` when there is none. Branch-light so it vectorizes.
template <typename T>
uint64_t FindIdAtOrAbove(const uint8_t* tokens, uint64_t count, uint64_t limit) {
  constexpr uint64_t kBlock = 4096;
  for (uint64_t block_begin = 0; block_begin < count; block_begin += kBlock) {
    const uint64_t block_end = block_begin + kBlock < count ? block_begin + kBlock : count;
    bool any = false;
    for (uint64_t token_idx = block_begin; token_idx < block_end; ++token_idx) {
      T id;
      std::memcpy(&id, tokens + sizeof(T) * token_idx, sizeof(T));
      any |= static_cast<uint64_t>(id) >= limit;
    }
    if (!any) continue;
    for (uint64_t token_idx = block_begin; token_idx < block_end; ++token_idx) {
      T id;
      std::memcpy(&id, tokens + sizeof(T) * token_idx, sizeof(T));
      if (static_cast<uint64_t>(id) >= limit) return token_idx;
    }
  }
  return count;
}

void StoreLe32(uint8_t* p, uint32_t value) { std::memcpy(p, &value, sizeof(value)); }

void StoreLe64(uint8_t* p, uint64_t value) { std::memcpy(p, &value, sizeof(value)); }

}  // namespace

// ---------------------------------------------------------------------------
// TokenShardView

uint64_t TokenShardView::document_begin(uint64_t doc_idx) const {
  ABSL_HARDENING_ASSERT(doc_idx <= num_documents_);
  return LoadLe64(doc_offsets_ + 8 * doc_idx);
}

uint32_t TokenShardView::token(uint64_t token_idx) const {
  ABSL_HARDENING_ASSERT(token_idx < num_tokens_);
  if (token_dtype_ == TokenDtype::kUint16) {
    uint16_t id;
    std::memcpy(&id, tokens_ + 2 * token_idx, sizeof(id));
    return id;
  }
  return LoadLe32(tokens_ + 4 * token_idx);
}

absl::Span<const uint8_t> TokenShardView::DocumentBytes(uint64_t doc_idx) const {
  const uint64_t begin = document_begin(doc_idx);
  const uint64_t end = document_begin(doc_idx + 1);
  return absl::Span<const uint8_t>(tokens_ + token_bytes() * begin, token_bytes() * (end - begin));
}

template <typename T>
void TokenShardView::CopyTokensUnchecked(uint64_t token_begin, T* dst, size_t count) const {
  static_assert(sizeof(T) == 4);
  if (count == 0) return;
  if (token_dtype_ == TokenDtype::kUint32) {
    std::memcpy(dst, tokens_ + 4 * token_begin, 4 * count);
    return;
  }
  const uint8_t* src = tokens_ + 2 * token_begin;
  for (size_t i = 0; i < count; ++i) {
    uint16_t id;
    std::memcpy(&id, src + 2 * i, sizeof(id));
    dst[i] = static_cast<T>(id);
  }
}

absl::Status TokenShardView::CopyTokens(uint64_t token_begin, absl::Span<int32_t> dst) const {
  if (token_begin > num_tokens_ || dst.size() > num_tokens_ - token_begin) {
    return absl::OutOfRangeError(
        absl::StrFormat("tokens [%u, %u + %u) run past the shard's %u tokens", token_begin,
                        token_begin, dst.size(), num_tokens_));
  }
  CopyTokensUnchecked(token_begin, dst.data(), dst.size());
  return absl::OkStatus();
}

absl::Status TokenShardView::CopyTokens(uint64_t token_begin, absl::Span<uint32_t> dst) const {
  if (token_begin > num_tokens_ || dst.size() > num_tokens_ - token_begin) {
    return absl::OutOfRangeError(
        absl::StrFormat("tokens [%u, %u + %u) run past the shard's %u tokens", token_begin,
                        token_begin, dst.size(), num_tokens_));
  }
  CopyTokensUnchecked(token_begin, dst.data(), dst.size());
  return absl::OkStatus();
}

std::vector<int32_t> TokenShardView::DocumentAsInt32(uint64_t doc_idx) const {
  const uint64_t begin = document_begin(doc_idx);
  std::vector<int32_t> out(document_begin(doc_idx + 1) - begin);
  CopyTokensUnchecked(begin, out.data(), out.size());
  return out;
}

std::vector<uint32_t> TokenShardView::DocumentAsUint32(uint64_t doc_idx) const {
  const uint64_t begin = document_begin(doc_idx);
  std::vector<uint32_t> out(document_begin(doc_idx + 1) - begin);
  CopyTokensUnchecked(begin, out.data(), out.size());
  return out;
}

// ---------------------------------------------------------------------------
// Parser

namespace {

// Phase 1: the header is whole, has the magic and a version this build
// reads, and matches its checksum (before any other field is trusted).
absl::Status CheckHeaderIntegrity(const uint8_t* data, uint64_t file_size,
                                  std::string_view source) {
  if (file_size < kTokenShardHeaderBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: file is %u bytes, shorter than the %u-byte token shard header "
                        "(truncated?)",
                        source, file_size, kTokenShardHeaderBytes));
  }
  if (std::memcmp(data + kMagicOffset, kTokenShardMagic, sizeof(kTokenShardMagic)) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: byte 0: bad magic '%s', expected 'MTTOKSH1' (not a token shard)", source,
        absl::CHexEscape(
            absl::string_view(reinterpret_cast<const char*>(data), sizeof(kTokenShardMagic)))));
  }
  const uint32_t version = LoadLe32(data + kVersionOffset);
  if (version == 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: byte %u: version 0 is invalid", source, kVersionOffset));
  }
  if (version > kTokenShardVersion) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: byte %u: token shard version %u is newer than this build "
                        "reads (%u)",
                        source, kVersionOffset, version, kTokenShardVersion));
  }
  const uint64_t stored_header_xxh64 = LoadLe64(data + kHeaderChecksumOffset);
  const uint64_t header_xxh64 = XXH64(data, kHeaderChecksumOffset, kXxhSeed);
  if (stored_header_xxh64 != header_xxh64) {
    return absl::DataLossError(absl::StrFormat(
        "%s: byte %u: header checksum 0x%016x does not match bytes [0, %u) "
        "(XXH64 0x%016x): corrupt header",
        source, kHeaderChecksumOffset, stored_header_xxh64, kHeaderChecksumOffset, header_xxh64));
  }
  return absl::OkStatus();
}

// Phase 2: token dtype, flags, reserved field and vocabulary size are valid.
absl::Status CheckHeaderFields(const uint8_t* data, std::string_view source) {
  const uint32_t token_dtype = LoadLe32(data + kTokenDtypeOffset);
  if (token_dtype != static_cast<uint32_t>(TokenDtype::kUint16) &&
      token_dtype != static_cast<uint32_t>(TokenDtype::kUint32)) {
    return absl::DataLossError(
        absl::StrFormat("%s: byte %u: token_dtype %u is invalid (2 = uint16, 4 = uint32)", source,
                        kTokenDtypeOffset, token_dtype));
  }
  const uint32_t flags = LoadLe32(data + kFlagsOffset);
  if ((flags & ~kTokenShardFlagBodyChecksum) != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: byte %u: unknown flags 0x%08x", source, kFlagsOffset, flags));
  }
  const bool has_body_checksum = (flags & kTokenShardFlagBodyChecksum) != 0;
  if (!has_body_checksum && LoadLe64(data + kBodyChecksumOffset) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: byte %u: body checksum set but flags say there is none", source, kBodyChecksumOffset));
  }
  const uint32_t reserved = LoadLe32(data + kReservedOffset);
  if (reserved != 0) {
    return absl::DataLossError(absl::StrFormat("%s: byte %u: reserved field is 0x%08x, must be 0",
                                               source, kReservedOffset, reserved));
  }
  const uint64_t vocab_size = LoadLe64(data + kVocabSizeOffset);
  if (vocab_size > kTokenShardMaxVocabSize ||
      (token_dtype == static_cast<uint32_t>(TokenDtype::kUint16) &&
       (vocab_size == 0 || vocab_size > 65536))) {
    return absl::DataLossError(
        absl::StrFormat("%s: byte %u: vocab_size %u is invalid for token_dtype %u (uint16 "
                        "needs [1, 65536], any dtype at most 2^31)",
                        source, kVocabSizeOffset, vocab_size, token_dtype));
  }
  return absl::OkStatus();
}

// Phase 3: the counts fit the file and the file is exactly the header, the
// offsets and the tokens. Returns the tokens' byte offset in the file.
absl::StatusOr<uint64_t> CheckSizes(uint64_t file_size, uint64_t num_documents, uint64_t num_tokens,
                                    uint64_t token_bytes, std::string_view source) {
  // Bound the counts by the file size first so no product overflows.
  const uint64_t body_bytes = file_size - kTokenShardHeaderBytes;
  const uint64_t max_documents = body_bytes / 8;  // each needs an offset
  const uint64_t max_tokens = body_bytes / token_bytes;
  if (num_documents >= max_documents || num_tokens > max_tokens) {
    return absl::DataLossError(absl::StrFormat(
        "%s: bytes %u and %u: %u documents and %u tokens cannot fit in a "
        "%u-byte file (truncated?)",
        source, kNumDocumentsOffset, kNumTokensOffset, num_documents, num_tokens, file_size));
  }
  const uint64_t offsets_bytes = 8 * (num_documents + 1);
  const uint64_t tokens_offset = kTokenShardHeaderBytes + offsets_bytes;
  // Both terms are <= body_bytes, so the sum cannot overflow.
  const uint64_t expected_size = tokens_offset + token_bytes * num_tokens;
  if (expected_size != file_size) {
    return absl::DataLossError(absl::StrFormat(
        "%s: file is %u bytes, but the header (%u documents, %u tokens of %u "
        "bytes) needs %u: %s",
        source, file_size, num_documents, num_tokens, token_bytes, expected_size,
        expected_size > file_size ? "truncated token body" : "trailing bytes after the tokens"));
  }
  return tokens_offset;
}

// Phase 4: document boundaries start at 0, never decrease and end at
// num_tokens.
absl::Status CheckDocOffsets(const uint8_t* doc_offsets, uint64_t num_documents,
                             uint64_t num_tokens, std::string_view source) {
  uint64_t previous = LoadLe64(doc_offsets);
  if (previous != 0) {
    return absl::DataLossError(absl::StrFormat("%s: byte %u: doc_offsets[0] = %u, must be 0",
                                               source, kTokenShardHeaderBytes, previous));
  }
  for (uint64_t doc_idx = 1; doc_idx <= num_documents; ++doc_idx) {
    const uint64_t offset = LoadLe64(doc_offsets + 8 * doc_idx);
    if (offset < previous) {
      return absl::DataLossError(absl::StrFormat(
          "%s: byte %u: doc_offsets[%u] = %u is below doc_offsets[%u] = %u "
          "(boundaries must not decrease)",
          source, kTokenShardHeaderBytes + 8 * doc_idx, doc_idx, offset, doc_idx - 1, previous));
    }
    previous = offset;
  }
  if (previous != num_tokens) {
    return absl::DataLossError(absl::StrFormat(
        "%s: byte %u: doc_offsets[%u] = %u, must equal num_tokens %u", source,
        kTokenShardHeaderBytes + 8 * num_documents, num_documents, previous, num_tokens));
  }
  return absl::OkStatus();
}

// Phase 5 (TokenShardParseOptions::verify_body): the body matches its
// checksum and every id is below the vocabulary (or the int32 limit).
absl::Status VerifyBody(const TokenShardView& view, const uint8_t* data, uint64_t file_size,
                        uint64_t tokens_offset, std::string_view source) {
  const uint64_t body_bytes = file_size - kTokenShardHeaderBytes;
  const uint8_t* tokens = data + tokens_offset;
  if (view.has_body_checksum()) {
    const uint64_t body_xxh64 = XXH64(data + kTokenShardHeaderBytes, body_bytes, kXxhSeed);
    if (body_xxh64 != view.body_xxh64()) {
      return absl::DataLossError(
          absl::StrFormat("%s: byte %u: body checksum 0x%016x does not match bytes [%u, %u) "
                          "(XXH64 0x%016x): corrupt offsets or tokens",
                          source, kBodyChecksumOffset, view.body_xxh64(), kTokenShardHeaderBytes,
                          file_size, body_xxh64));
    }
  }
  // Ids must be below vocab_size, or fit int32 when it is unknown.
  const uint64_t id_limit = view.vocab_size() != 0 ? view.vocab_size() : kTokenShardMaxVocabSize;
  const uint64_t token_idx = view.token_dtype() == TokenDtype::kUint16
                                 ? FindIdAtOrAbove<uint16_t>(tokens, view.num_tokens(), id_limit)
                                 : FindIdAtOrAbove<uint32_t>(tokens, view.num_tokens(), id_limit);
  if (token_idx < view.num_tokens()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: byte %u: token %u = %u is not below %s %u", source,
        tokens_offset + view.token_bytes() * token_idx, token_idx, view.token(token_idx),
        view.vocab_size() != 0 ? "vocab_size" : "the int32 limit", id_limit));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenShardView> ParseTokenShard(absl::Span<const uint8_t> bytes,
                                               std::string_view source,
                                               TokenShardParseOptions options) {
  const uint64_t file_size = bytes.size();
  const uint8_t* data = bytes.data();
  MEGATRAIN_RETURN_IF_ERROR(CheckHeaderIntegrity(data, file_size, source));
  MEGATRAIN_RETURN_IF_ERROR(CheckHeaderFields(data, source));
  TokenShardView view;
  view.version_ = LoadLe32(data + kVersionOffset);
  view.token_dtype_ = static_cast<TokenDtype>(LoadLe32(data + kTokenDtypeOffset));
  view.has_body_checksum_ = (LoadLe32(data + kFlagsOffset) & kTokenShardFlagBodyChecksum) != 0;
  view.body_xxh64_ = LoadLe64(data + kBodyChecksumOffset);
  view.vocab_size_ = LoadLe64(data + kVocabSizeOffset);
  view.num_tokens_ = LoadLe64(data + kNumTokensOffset);
  view.num_documents_ = LoadLe64(data + kNumDocumentsOffset);
  MEGATRAIN_ASSIGN_OR_RETURN(
      const uint64_t tokens_offset,
      CheckSizes(file_size, view.num_documents_, view.num_tokens_, view.token_bytes(), source));
  view.doc_offsets_ = data + kTokenShardHeaderBytes;
  view.tokens_ = data + tokens_offset;
  MEGATRAIN_RETURN_IF_ERROR(
      CheckDocOffsets(view.doc_offsets_, view.num_documents_, view.num_tokens_, source));
  if (options.verify_body) {
    MEGATRAIN_RETURN_IF_ERROR(VerifyBody(view, data, file_size, tokens_offset, source));
  }
  return view;
}

// ---------------------------------------------------------------------------
// TokenShardReader

absl::StatusOr<TokenShardReader> TokenShardReader::Open(const std::string& path,
                                                        TokenShardParseOptions options) {
  MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  MEGATRAIN_ASSIGN_OR_RETURN(TokenShardView view, ParseTokenShard(file.bytes(), path, options));
  return TokenShardReader(std::move(file), view);
}

// ---------------------------------------------------------------------------
// TokenShardWriter

TokenShardWriter::TokenShardWriter(AtomicFileWriter file, TokenShardWriterOptions options)
    : file_(std::move(file)),
      options_(options),
      token_dtype_(options.vocab_size >= 1 && options.vocab_size <= 65536 ? TokenDtype::kUint16
                                                                          : TokenDtype::kUint32) {}

absl::StatusOr<TokenShardWriter> TokenShardWriter::Create(const std::string& path,
                                                          TokenShardWriterOptions options) {
  if (options.vocab_size > kTokenShardMaxVocabSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: vocab_size %u exceeds the token shard limit 2^31", path, options.vocab_size));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path));
  return TokenShardWriter(std::move(file), options);
}

template <typename T>
absl::Status TokenShardWriter::Append(absl::Span<const T> tokens) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: cannot append a document after Finish()", file_.path()));
  }
  const uint64_t id_limit =
      options_.vocab_size != 0 ? options_.vocab_size : kTokenShardMaxVocabSize;
  // Validate the whole document first, so a refused one leaves no trace.
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    const int64_t id = static_cast<int64_t>(tokens[pos]);
    if (id < 0 || static_cast<uint64_t>(id) >= id_limit) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: document %u, position %u: token id %d is outside [0, %u)%s",
                          file_.path(), num_documents(), pos, id, id_limit,
                          options_.vocab_size != 0 ? " (vocab_size)" : " (int32 range)"));
    }
  }
  const size_t width = static_cast<size_t>(token_dtype_);
  const size_t old_size = token_bytes_.size();
  token_bytes_.resize(old_size + width * tokens.size());
  uint8_t* out = token_bytes_.data() + old_size;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    if (token_dtype_ == TokenDtype::kUint16) {
      const uint16_t id = static_cast<uint16_t>(tokens[pos]);
      std::memcpy(out + 2 * pos, &id, sizeof(id));
    } else {
      const uint32_t id = static_cast<uint32_t>(tokens[pos]);
      std::memcpy(out + 4 * pos, &id, sizeof(id));
    }
  }
  num_tokens_ += tokens.size();
  doc_offsets_.push_back(num_tokens_);
  return absl::OkStatus();
}

absl::Status TokenShardWriter::AppendDocument(absl::Span<const int32_t> tokens) {
  return Append(tokens);
}

absl::Status TokenShardWriter::AppendDocumentU32(absl::Span<const uint32_t> tokens) {
  return Append(tokens);
}

absl::Status TokenShardWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: Finish() called twice", file_.path()));
  }
  finished_ = true;
  const absl::Span<const uint8_t> offsets_bytes(
      reinterpret_cast<const uint8_t*>(doc_offsets_.data()),
      doc_offsets_.size() * sizeof(uint64_t));

  uint8_t header[kTokenShardHeaderBytes] = {};
  std::memcpy(header + kMagicOffset, kTokenShardMagic, sizeof(kTokenShardMagic));
  StoreLe32(header + kVersionOffset, kTokenShardVersion);
  StoreLe32(header + kTokenDtypeOffset, static_cast<uint32_t>(token_dtype_));
  StoreLe64(header + kVocabSizeOffset, options_.vocab_size);
  StoreLe64(header + kNumTokensOffset, num_tokens_);
  StoreLe64(header + kNumDocumentsOffset, num_documents());
  if (options_.write_body_checksum) {
    XXH64_state_t* state = XXH64_createState();
    if (state == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: cannot allocate the XXH64 state", file_.path()));
    }
    XXH64_reset(state, kXxhSeed);
    XXH64_update(state, offsets_bytes.data(), offsets_bytes.size());
    XXH64_update(state, token_bytes_.data(), token_bytes_.size());
    const uint64_t body_xxh64 = XXH64_digest(state);
    XXH64_freeState(state);
    StoreLe64(header + kBodyChecksumOffset, body_xxh64);
    StoreLe32(header + kFlagsOffset, kTokenShardFlagBodyChecksum);
  }
  StoreLe64(header + kHeaderChecksumOffset, XXH64(header, kHeaderChecksumOffset, kXxhSeed));

  MEGATRAIN_RETURN_IF_ERROR(file_.Append(header));
  MEGATRAIN_RETURN_IF_ERROR(file_.Append(offsets_bytes));
  MEGATRAIN_RETURN_IF_ERROR(file_.Append(token_bytes_));
  return file_.Commit();
}

}  // namespace megatrain::engine
