// Tests of engine/data/token_shard.h: writer -> reader round trips in both token
// dtypes, the byte layout documented in docs/data-format.md, writer input
// checks, and one test per kind of corrupt shard (DATA_LOSS naming the file
// and the byte offset).
#include "engine/data/token_shard.h"

#include <dirent.h>
#include <stdlib.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::WriteFileBytes;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

uint32_t Load32(const std::vector<uint8_t>& b, size_t offset) {
  uint32_t v;
  std::memcpy(&v, b.data() + offset, 4);
  return v;
}
uint64_t Load64(const std::vector<uint8_t>& b, size_t offset) {
  uint64_t v;
  std::memcpy(&v, b.data() + offset, 8);
  return v;
}
void Store32(std::vector<uint8_t>& b, size_t offset, uint32_t v) {
  std::memcpy(b.data() + offset, &v, 4);
}
void Store64(std::vector<uint8_t>& b, size_t offset, uint64_t v) {
  std::memcpy(b.data() + offset, &v, 8);
}

// Recomputes the header checksum after a test edits a header field, so the
// parser gets past it to the check under test.
void FixHeaderChecksum(std::vector<uint8_t>& b) { Store64(b, 56, XXH64(b.data(), 56, 0)); }
void FixBodyChecksum(std::vector<uint8_t>& b) {
  Store64(b, 40, XXH64(b.data() + 64, b.size() - 64, 0));
  FixHeaderChecksum(b);
}

absl::StatusOr<TokenShardView> Parse(const std::vector<uint8_t>& b,
                                     TokenShardParseOptions options = {}) {
  return ParseTokenShard(b, "shard.tok", options);
}

// The shard used by most tests: 3 documents (one empty), vocab 1000, uint16.
const std::vector<std::vector<int32_t>>& SmallDocs() {
  static const auto* docs = new std::vector<std::vector<int32_t>>{{1, 2, 3}, {}, {999, 0, 7, 42}};
  return *docs;
}

std::vector<uint8_t> WriteSmallShard(const std::string& path, uint64_t vocab_size = 1000) {
  absl::StatusOr<TokenShardWriter> writer =
      TokenShardWriter::Create(path, {.vocab_size = vocab_size});
  EXPECT_THAT(writer, IsOk());
  for (const std::vector<int32_t>& doc : SmallDocs()) {
    EXPECT_THAT(writer->AppendDocument(doc), IsOk());
  }
  EXPECT_THAT(writer->Finish(), IsOk());
  return ReadFileBytes(path);
}

// ---------------------------------------------------------------------------
// Round trips and layout

TEST(TokenShardTest, RoundTripUint16) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  WriteSmallShard(path);
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  EXPECT_EQ(shard->token_dtype(), TokenDtype::kUint16);
  EXPECT_EQ(shard->vocab_size(), 1000u);
  EXPECT_EQ(shard->num_documents(), 3u);
  EXPECT_EQ(shard->num_tokens(), 7u);
  EXPECT_TRUE(shard->view().has_body_checksum());
  EXPECT_THAT(shard->DocumentAsInt32(0), ElementsAre(1, 2, 3));
  EXPECT_THAT(shard->DocumentAsInt32(1), ::testing::IsEmpty());
  EXPECT_THAT(shard->DocumentAsUint32(2), ElementsAre(999u, 0u, 7u, 42u));
  EXPECT_EQ(shard->document_begin(2), 3u);
  EXPECT_EQ(shard->document_size(2), 4u);
  EXPECT_EQ(shard->token(3), 999u);
  EXPECT_EQ(shard->view().DocumentBytes(2).size(), 8u);
  // A window across the document boundary, as the data loader reads it.
  std::vector<int32_t> window(3);
  ASSERT_THAT(shard->CopyTokens(2, absl::MakeSpan(window)), IsOk());
  EXPECT_THAT(window, ElementsAre(3, 999, 0));
}

TEST(TokenShardTest, RoundTripUint32WithRandomDocuments) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  constexpr uint64_t kVocab = 128256;  // Llama 3: needs uint32
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
  std::uniform_int_distribution<int> length(0, 300);
  std::vector<std::vector<int32_t>> docs(50);
  for (auto& doc : docs) {
    doc.resize(length(rng));
    for (int32_t& t : doc) t = id(rng);
  }
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path, {.vocab_size = kVocab});
  ASSERT_THAT(writer, IsOk());
  EXPECT_EQ(writer->token_dtype(), TokenDtype::kUint32);
  for (const auto& doc : docs) ASSERT_THAT(writer->AppendDocument(doc), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());

  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  EXPECT_EQ(shard->token_dtype(), TokenDtype::kUint32);
  ASSERT_EQ(shard->num_documents(), docs.size());
  std::vector<int32_t> all;
  for (size_t doc_idx = 0; doc_idx < docs.size(); ++doc_idx) {
    EXPECT_THAT(shard->DocumentAsInt32(doc_idx), ElementsAreArray(docs[doc_idx]))
        << "document " << doc_idx;
    all.insert(all.end(), docs[doc_idx].begin(), docs[doc_idx].end());
  }
  std::vector<uint32_t> copied(all.size());
  ASSERT_THAT(shard->CopyTokens(0, absl::MakeSpan(copied)), IsOk());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(copied[i], static_cast<uint32_t>(all[i])) << i;
  }
}

TEST(TokenShardTest, UnknownVocabUsesUint32) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  const std::vector<uint32_t> doc = {0, 2147483647u};
  ASSERT_THAT(writer->AppendDocumentU32(doc), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  EXPECT_EQ(shard->token_dtype(), TokenDtype::kUint32);
  EXPECT_EQ(shard->vocab_size(), 0u);
  EXPECT_THAT(shard->DocumentAsUint32(0), ElementsAre(0u, 2147483647u));
}

TEST(TokenShardTest, EmptyShardRoundTrips) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path, {.vocab_size = 10});
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  EXPECT_EQ(shard->num_documents(), 0u);
  EXPECT_EQ(shard->num_tokens(), 0u);
}

TEST(TokenShardTest, LayoutMatchesTheDocumentedFormat) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  const std::vector<uint8_t> b = WriteSmallShard(path);
  // 64-byte header + 4 offsets x 8 + 7 tokens x 2.
  ASSERT_EQ(b.size(), 64u + 32u + 14u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "MTTOKSH1");
  EXPECT_EQ(Load32(b, 8), 1u);      // version
  EXPECT_EQ(Load32(b, 12), 2u);     // token_dtype: uint16
  EXPECT_EQ(Load64(b, 16), 1000u);  // vocab_size
  EXPECT_EQ(Load64(b, 24), 7u);     // num_tokens
  EXPECT_EQ(Load64(b, 32), 3u);     // num_documents
  EXPECT_EQ(Load64(b, 40), XXH64(b.data() + 64, b.size() - 64, 0));
  EXPECT_EQ(Load32(b, 48), 1u);  // flags: body checksum present
  EXPECT_EQ(Load32(b, 52), 0u);  // reserved
  EXPECT_EQ(Load64(b, 56), XXH64(b.data(), 56, 0));
  EXPECT_EQ(Load64(b, 64), 0u);  // doc_offsets
  EXPECT_EQ(Load64(b, 72), 3u);
  EXPECT_EQ(Load64(b, 80), 3u);
  EXPECT_EQ(Load64(b, 88), 7u);
  uint16_t fourth_token;
  std::memcpy(&fourth_token, b.data() + 96 + 2 * 3, 2);
  EXPECT_EQ(fourth_token, 999);
}

TEST(TokenShardTest, WriterWithoutChecksumLeavesFieldZero) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer =
      TokenShardWriter::Create(path, {.vocab_size = 100, .write_body_checksum = false});
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AppendDocument(std::vector<int32_t>{5, 6}), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  const std::vector<uint8_t> b = ReadFileBytes(path);
  EXPECT_EQ(Load64(b, 40), 0u);
  EXPECT_EQ(Load32(b, 48), 0u);
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  EXPECT_FALSE(shard->view().has_body_checksum());
}

// ---------------------------------------------------------------------------
// Writer input checks

TEST(TokenShardWriterTest, RefusesTokenIdAtOrAboveVocab) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path, {.vocab_size = 50257});
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AppendDocument(std::vector<int32_t>{1, 2}), IsOk());
  EXPECT_THAT(writer->AppendDocument(std::vector<int32_t>{3, 50257}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("document 1, position 1: token id 50257 is "
                                 "outside [0, 50257)")));
  EXPECT_THAT(writer->AppendDocument(std::vector<int32_t>{-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id -1")));
  // Refused documents leave no trace.
  EXPECT_EQ(writer->num_documents(), 1u);
  EXPECT_EQ(writer->num_tokens(), 2u);
}

TEST(TokenShardWriterTest, RefusesUint32IdsBeyondInt32) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  EXPECT_THAT(writer->AppendDocumentU32(std::vector<uint32_t>{2147483648u}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 2147483648")));
}

TEST(TokenShardWriterTest, RefusesVocabAbove2To31) {
  EXPECT_THAT(TokenShardWriter::Create(testing::MakeTempDir("token_shard_test") + "/shard.tok",
                                       {.vocab_size = (uint64_t{1} << 31) + 1})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_size 2147483649")));
}

TEST(TokenShardWriterTest, AppendAfterFinishIsFailedPrecondition) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  EXPECT_THAT(writer->AppendDocument(std::vector<int32_t>{1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("after Finish")));
}

TEST(TokenShardWriterTest, UnfinishedWriterLeavesNoFile) {
  const std::string dir = testing::MakeTempDir("token_shard_test");
  {
    absl::StatusOr<TokenShardWriter> writer = TokenShardWriter::Create(dir + "/shard.tok");
    ASSERT_THAT(writer, IsOk());
    ASSERT_THAT(writer->AppendDocument(std::vector<int32_t>{1}), IsOk());
  }
  EXPECT_THAT(ListDir(dir), ::testing::IsEmpty());
}

// ---------------------------------------------------------------------------
// Corrupt shards

TEST(TokenShardReaderTest, OpenMissingFileIsNotFound) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/nope.tok";
  EXPECT_THAT(TokenShardReader::Open(path).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(TokenShardReaderTest, BadMagicIsDataLossNamingFile) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  b[0] = 'X';
  WriteFileBytes(path, b);
  EXPECT_THAT(
      TokenShardReader::Open(path).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + ": byte 0: bad magic 'XTTOKSH1'")));
}

TEST(TokenShardReaderTest, FileShorterThanHeaderIsDataLoss) {
  const std::vector<uint8_t> b(10, 0);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("shard.tok: file is 10 bytes, shorter than "
                                                    "the 64-byte")));
}

TEST(TokenShardReaderTest, TruncatedTokenBodyIsDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  b.erase(b.end() - 2, b.end());
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("file is 108 bytes, but the header (3 "
                                                    "documents, 7 tokens of 2 bytes) needs 110: "
                                                    "truncated token body")));
}

TEST(TokenShardReaderTest, TrailingBytesAreDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  b.push_back(0);
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing bytes after the tokens")));
}

TEST(TokenShardReaderTest, HeaderChecksumMismatchIsDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  Store64(b, 24, 6);  // num_tokens, without fixing the checksum
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 56: header checksum")));
}

TEST(TokenShardReaderTest, BoundariesNotMonotoneAreDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  Store64(b, 80, 2);  // doc_offsets[2] = 2 < doc_offsets[1] = 3
  FixBodyChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 80: doc_offsets[2] = 2 is below "
                                                    "doc_offsets[1] = 3")));
}

TEST(TokenShardReaderTest, BoundariesNotEndingAtTokenCountAreDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  Store64(b, 88, 6);
  FixBodyChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 88: doc_offsets[3] = 6, must equal "
                                                    "num_tokens 7")));
  Store64(b, 64, 1);  // doc_offsets[0] must be 0
  FixBodyChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 64: doc_offsets[0] = 1, must be 0")));
}

TEST(TokenShardReaderTest, BodyChecksumMismatchIsDataLossUnlessSkipped) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  b[96] ^= 0x01;  // first token: 1 -> 0
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 40: body checksum")));
  absl::StatusOr<TokenShardView> unverified = Parse(b, {.verify_body = false});
  ASSERT_THAT(unverified, IsOk());
  EXPECT_EQ(unverified->token(0), 0u);
}

TEST(TokenShardReaderTest, TokenAtOrAboveVocabIsDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  Store64(b, 16, 999);  // vocab_size now excludes the id 999 at token 3
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 102: token 3 = 999 is not below "
                                                    "vocab_size 999")));
}

TEST(TokenShardReaderTest, BadHeaderFieldsAreDataLoss) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  const std::vector<uint8_t> good = WriteSmallShard(path);

  std::vector<uint8_t> b = good;
  Store32(b, 12, 3);
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 12: token_dtype 3 is invalid")));

  b = good;
  Store32(b, 48, 0x3);
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 48: unknown flags")));

  b = good;
  Store32(b, 52, 1);
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 52: reserved field")));

  b = good;
  Store64(b, 16, 70000);  // too large for uint16 ids
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kDataLoss,
                                          HasSubstr("byte 16: vocab_size 70000 is invalid")));

  b = good;
  Store64(b, 32, uint64_t{1} << 61);  // documents that cannot fit
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("cannot fit in a 110-byte file")));
}

TEST(TokenShardReaderTest, NewerVersionIsUnimplemented) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  std::vector<uint8_t> b = WriteSmallShard(path);
  Store32(b, 8, 2);
  FixHeaderChecksum(b);
  EXPECT_THAT(Parse(b).status(), StatusIs(absl::StatusCode::kUnimplemented,
                                          HasSubstr("byte 8: token shard version 2 is newer")));
}

TEST(TokenShardReaderTest, CopyTokensPastEndIsOutOfRange) {
  const std::string path = testing::MakeTempDir("token_shard_test") + "/shard.tok";
  WriteSmallShard(path);
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  ASSERT_THAT(shard, IsOk());
  std::vector<int32_t> window(4);
  EXPECT_THAT(shard->CopyTokens(4, absl::MakeSpan(window)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("shard's 7 tokens")));
  EXPECT_THAT(shard->CopyTokens(~uint64_t{0}, absl::MakeSpan(window)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("run past")));
}

// ---------------------------------------------------------------------------
// Seed corpus written by tests/fuzz/make_corpus.py (an independent Python
// writer, with its own XXH64): valid_* must parse, invalid_* must not.

TEST(TokenShardCorpusTest, PythonWrittenFilesParseAsExpected) {
  const std::string dir = std::string(MEGATRAIN_FUZZ_CORPUS_DIR) + "/token_shard_fuzz";
  const std::vector<std::string> names = ListDir(dir);
  ASSERT_FALSE(names.empty()) << dir;
  int valid = 0;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_THAT(shard, IsOk()) << name;
      ++valid;
    } else {
      // invalid_version.tok is from the future (UNIMPLEMENTED); the rest are
      // corrupt.
      EXPECT_THAT(shard.status().code(),
                  ::testing::AnyOf(absl::StatusCode::kDataLoss, absl::StatusCode::kUnimplemented))
          << name << ": " << shard.status();
      EXPECT_THAT(std::string(shard.status().message()), HasSubstr(path));
    }
  }
  EXPECT_GT(valid, 0);
}

}  // namespace
}  // namespace megatrain::engine
