// Token shards: MegaTrain's binary format for pre-tokenized training data,
// one file per shard, memory-mapped by the data loader.
//
// Format, version 1 (also in docs/data-format.md). All integers
// little-endian; offsets in bytes from the start of the file.
//
//   offset  size  field
//   0       8     magic "MTTOKSH1" (ASCII, no terminator)
//   8       4     version, u32 = 1
//   12      4     token_dtype, u32: bytes per token id, 2 (uint16) or 4
//                 (uint32)
//   16      8     vocab_size, u64: token ids are < vocab_size; 0 = unknown.
//                 At most 2^31 (ids fit int32). uint16 needs vocab_size in
//                 [1, 65536].
//   24      8     num_tokens, u64
//   32      8     num_documents, u64
//   40      8     body_xxh64, u64: XXH64 (seed 0) of bytes [64, EOF) when
//                 flags bit 0 is set, else 0
//   48      4     flags, u32: bit 0 = body_xxh64 present; other bits 0
//   52      4     reserved, u32 = 0
//   56      8     header_xxh64, u64: XXH64 (seed 0) of bytes [0, 56)
//   64      8 x (num_documents + 1)
//                 doc_offsets, u64: cumulative token offsets; document d is
//                 tokens [doc_offsets[d], doc_offsets[d + 1]).
//                 doc_offsets[0] = 0, non-decreasing (empty documents are
//                 allowed), doc_offsets[num_documents] = num_tokens.
//   64 + 8 x (num_documents + 1)
//           token_dtype x num_tokens
//                 the token ids, documents back to back.
//   The file ends right after the last token: its size is exactly
//   64 + 8 x (num_documents + 1) + token_dtype x num_tokens.
//
// Why this shape: the fixed 64-byte header and 8-byte offsets keep the token
// array 8-byte aligned in a mapping; the header checksum catches a corrupt
// count before it is trusted (always checked: it covers 56 bytes); the body
// checksum catches silent corruption of the data but costs one pass over the
// file (XXH64, ~10 GB/s), so readers may skip it for huge shards. Magic and
// version first, as llm.c's data files do.
//
// Pure C++ (no LibTorch): ParseTokenShard is fuzzed by
// tests/fuzz/token_shard_fuzz.cc.
#ifndef MEGATRAIN_ENGINE_TOKEN_SHARD_H_
#define MEGATRAIN_ENGINE_TOKEN_SHARD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/fs/mapped_file.h"

namespace megatrain::engine {

// The 8 magic bytes at offset 0.
inline constexpr char kTokenShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'S', 'H', '1'};
// The format version this build reads and writes.
inline constexpr uint32_t kTokenShardVersion = 1;
// Size of the fixed header, in bytes.
inline constexpr uint64_t kTokenShardHeaderBytes = 64;
// Largest vocab_size the format allows: ids must fit in int32.
inline constexpr uint64_t kTokenShardMaxVocabSize = uint64_t{1} << 31;
// flags bit 0: body_xxh64 holds the checksum of bytes [64, EOF).
inline constexpr uint32_t kTokenShardFlagBodyChecksum = 1u;

// Storage type of the token ids; the value is the size in bytes.
enum class TokenDtype : uint32_t {
  kUint16 = 2,
  kUint32 = 4,
};

// How much of a shard ParseTokenShard() checks.
struct TokenShardParseOptions {
  // Verify body_xxh64 (when the file has one) and that every token id is
  // below vocab_size: one pass over the whole file. The header (magic,
  // version, header checksum, counts vs file size) and the document
  // boundaries are always checked. Turn off for huge shards that were
  // verified once already; then ids are not checked against vocab_size and
  // consumers must bounds-check them.
  bool verify_body = true;
};

// A validated view of a token shard held in memory (e.g. a mapping).
//
// Ownership and lifetime: does not own the bytes; they must outlive the
// view. Cheap to copy.
//
// Thread-safety: immutable; all methods are safe to call concurrently.
class TokenShardView {
 public:
  // An empty shard (no documents); ParseTokenShard() makes real ones.
  TokenShardView() = default;

  // Format version of the file (1).
  uint32_t version() const { return version_; }
  // Storage type of the ids in the file.
  TokenDtype token_dtype() const { return token_dtype_; }
  // Bytes per token id: 2 or 4.
  size_t token_bytes() const { return static_cast<size_t>(token_dtype_); }
  // Exclusive upper bound of the token ids; 0 when unknown.
  uint64_t vocab_size() const { return vocab_size_; }
  // Number of tokens over all documents.
  uint64_t num_tokens() const { return num_tokens_; }
  // Number of documents.
  uint64_t num_documents() const { return num_documents_; }
  // Whether the file carries a body checksum.
  bool has_body_checksum() const { return has_body_checksum_; }
  // The body checksum (XXH64 of bytes [64, EOF)); 0 when absent.
  uint64_t body_xxh64() const { return body_xxh64_; }

  // Index of the first token of document `doc_idx`; doc_idx may equal
  // num_documents() (then it returns num_tokens()).
  // Precondition: doc_idx <= num_documents() (ABSL_HARDENING_ASSERT: checked
  // in debug and hardened builds only, like every precondition here).
  uint64_t document_begin(uint64_t doc_idx) const;
  // Number of tokens of document `doc_idx`. Precondition: doc_idx <
  // num_documents().
  uint64_t document_size(uint64_t doc_idx) const {
    return document_begin(doc_idx + 1) - document_begin(doc_idx);
  }

  // Token id at `token_idx` over the whole shard. Precondition: token_idx <
  // num_tokens().
  uint32_t token(uint64_t token_idx) const;

  // The raw little-endian bytes of document `doc_idx`
  // (document_size x token_bytes bytes). Precondition: doc_idx <
  // num_documents().
  absl::Span<const uint8_t> DocumentBytes(uint64_t doc_idx) const;

  // Copies tokens [token_begin, token_begin + dst.size()) to `dst`, widening
  // uint16 ids. Ids above INT32_MAX cannot occur in a shard verified with
  // verify_body (vocab_size <= 2^31); unverified they would wrap.
  // Errors: OUT_OF_RANGE when the range runs past num_tokens().
  absl::Status CopyTokens(uint64_t token_begin, absl::Span<int32_t> dst) const;
  absl::Status CopyTokens(uint64_t token_begin, absl::Span<uint32_t> dst) const;

  // Document `doc_idx` as a vector of ids. Precondition: doc_idx <
  // num_documents().
  std::vector<int32_t> DocumentAsInt32(uint64_t doc_idx) const;
  std::vector<uint32_t> DocumentAsUint32(uint64_t doc_idx) const;

 private:
  friend absl::StatusOr<TokenShardView> ParseTokenShard(absl::Span<const uint8_t>, std::string_view,
                                                        TokenShardParseOptions);

  template <typename T>
  void CopyTokensUnchecked(uint64_t token_begin, T* dst, size_t count) const;

  uint32_t version_ = kTokenShardVersion;
  TokenDtype token_dtype_ = TokenDtype::kUint32;
  uint64_t vocab_size_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t num_documents_ = 0;
  bool has_body_checksum_ = false;
  uint64_t body_xxh64_ = 0;
  const uint8_t* doc_offsets_ = nullptr;  // u64 x (num_documents_ + 1)
  const uint8_t* tokens_ = nullptr;       // token_bytes() x num_tokens_
};

// Parses and validates a whole token shard held in `bytes`; `source` names
// the file in error messages. Pure: no I/O; safe on any input (the fuzzed
// entry point). The view points into `bytes`.
//
// Errors (messages name `source` and the byte offset of the bad field):
//   DATA_LOSS: file shorter than the header; bad magic; version 0; header
//     checksum mismatch; token_dtype not 2 or 4; unknown flag bits; non-zero
//     reserved field; vocab_size above 2^31 or beyond uint16 for a uint16
//     shard; file size != header + offsets + tokens (truncated or trailing
//     bytes); doc_offsets[0] != 0, decreasing, or the last != num_tokens;
//     and with verify_body: body checksum mismatch, a token id >= vocab_size.
//   UNIMPLEMENTED: version newer than kTokenShardVersion.
absl::StatusOr<TokenShardView> ParseTokenShard(absl::Span<const uint8_t> bytes,
                                               std::string_view source,
                                               TokenShardParseOptions options = {});

// A memory-mapped, validated token shard.
//
// Ownership and lifetime: move-only; owns the mapping. Spans it returns are
// valid while it (or the reader it was moved into) lives.
//
// Thread-safety: immutable after Open(); const methods are safe to call
// concurrently (e.g. from several data-loader threads).
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(TokenShardReader shard,
//                              TokenShardReader::Open("train-00000.tok"));
//   std::vector<int32_t> window(seq_len + 1);
//   MEGATRAIN_RETURN_IF_ERROR(shard.CopyTokens(start, absl::MakeSpan(window)));
class TokenShardReader {
 public:
  // Maps `path` and validates it (ParseTokenShard with `options`).
  // Errors: those of MappedFile::Open (NOT_FOUND for a missing file) and of
  // ParseTokenShard (DATA_LOSS, UNIMPLEMENTED), messages starting with
  // `path`.
  static absl::StatusOr<TokenShardReader> Open(const std::string& path,
                                               TokenShardParseOptions options = {});

  TokenShardReader(TokenShardReader&&) noexcept = default;
  TokenShardReader& operator=(TokenShardReader&&) noexcept = default;
  TokenShardReader(const TokenShardReader&) = delete;
  TokenShardReader& operator=(const TokenShardReader&) = delete;

  // The path given to Open().
  const std::string& path() const { return file_.path(); }
  // The parsed shard; valid while this reader lives.
  const TokenShardView& view() const { return view_; }

  // Shortcuts to view(); see TokenShardView for the contracts.
  TokenDtype token_dtype() const { return view_.token_dtype(); }
  uint64_t vocab_size() const { return view_.vocab_size(); }
  uint64_t num_tokens() const { return view_.num_tokens(); }
  uint64_t num_documents() const { return view_.num_documents(); }
  uint64_t document_begin(uint64_t doc_idx) const { return view_.document_begin(doc_idx); }
  uint64_t document_size(uint64_t doc_idx) const { return view_.document_size(doc_idx); }
  uint32_t token(uint64_t token_idx) const { return view_.token(token_idx); }
  std::vector<int32_t> DocumentAsInt32(uint64_t doc_idx) const {
    return view_.DocumentAsInt32(doc_idx);
  }
  std::vector<uint32_t> DocumentAsUint32(uint64_t doc_idx) const {
    return view_.DocumentAsUint32(doc_idx);
  }
  absl::Status CopyTokens(uint64_t token_begin, absl::Span<int32_t> dst) const {
    return view_.CopyTokens(token_begin, dst);
  }
  absl::Status CopyTokens(uint64_t token_begin, absl::Span<uint32_t> dst) const {
    return view_.CopyTokens(token_begin, dst);
  }

 private:
  TokenShardReader(MappedFile file, TokenShardView view) : file_(std::move(file)), view_(view) {}

  MappedFile file_;
  TokenShardView view_;  // points into file_'s mapping
};

// Options of TokenShardWriter.
struct TokenShardWriterOptions {
  // Exclusive upper bound of the ids; 0 = unknown (ids up to INT32_MAX are
  // accepted). Picks the dtype: uint16 when in [1, 65536], else uint32.
  uint64_t vocab_size = 0;
  // Store body_xxh64. Costs one pass over the data at Finish().
  bool write_body_checksum = true;
};

// Builds one token shard: documents are appended in memory (token_bytes per
// id; the format needs the document count before the tokens), and Finish()
// writes the file atomically (AtomicFileWriter: temporary file, fsync,
// rename). Keep shards to a size that fits in memory comfortably (e.g.
// 1e8 tokens = 200 MB as uint16).
//
// Ownership and lifetime: move-only. Destroying an unfinished writer deletes
// the temporary file; nothing appears at `path`.
//
// Thread-safety: not thread-safe.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(
//       TokenShardWriter writer,
//       TokenShardWriter::Create(path, {.vocab_size = 32000}));
//   for (const auto& doc : docs) {
//     MEGATRAIN_RETURN_IF_ERROR(writer.AppendDocument(doc));
//   }
//   MEGATRAIN_RETURN_IF_ERROR(writer.Finish());
class TokenShardWriter {
 public:
  // Creates the temporary file next to `path`.
  // Errors: INVALID_ARGUMENT when vocab_size > 2^31; those of
  // AtomicFileWriter::Create (NOT_FOUND for a missing directory, ...).
  static absl::StatusOr<TokenShardWriter> Create(const std::string& path,
                                                 TokenShardWriterOptions options = {});

  TokenShardWriter(TokenShardWriter&&) noexcept = default;
  TokenShardWriter& operator=(TokenShardWriter&&) noexcept = default;
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends one document (may be empty). All or nothing: on error the
  // writer is unchanged.
  // Errors: INVALID_ARGUMENT for a negative id or an id >= vocab_size (the
  // message names the document, the position and the id);
  // FAILED_PRECONDITION after Finish().
  absl::Status AppendDocument(absl::Span<const int32_t> tokens);
  // As AppendDocument, for uint32 ids; ids above INT32_MAX are refused.
  absl::Status AppendDocumentU32(absl::Span<const uint32_t> tokens);

  // Writes header, offsets and tokens, fsyncs and renames onto `path`.
  // Errors: RESOURCE_EXHAUSTED when the disk is full; others from the file
  // system naming the path; FAILED_PRECONDITION when called twice.
  absl::Status Finish();

  // Storage type picked from vocab_size (uint16 when in [1, 65536]).
  TokenDtype token_dtype() const { return token_dtype_; }
  // Tokens appended so far, over all documents.
  uint64_t num_tokens() const { return num_tokens_; }
  // Documents appended so far.
  uint64_t num_documents() const { return doc_offsets_.size() - 1; }

 private:
  TokenShardWriter(AtomicFileWriter file, TokenShardWriterOptions options);
  template <typename T>
  absl::Status Append(absl::Span<const T> tokens);

  AtomicFileWriter file_;
  TokenShardWriterOptions options_;
  TokenDtype token_dtype_;
  std::vector<uint64_t> doc_offsets_ = {0};  // cumulative, starts at 0
  std::vector<uint8_t> token_bytes_;         // encoded ids
  uint64_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TOKEN_SHARD_H_
