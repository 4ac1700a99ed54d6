// Tests of engine/data/data_loader.h: the packing rule (EOS placement, shifted
// labels, SFT masks), the deterministic shuffle and its golden values,
// epochs, exact resume through the cursor, the eval split, and one test per
// kind of bad input (specific code and message).
#include "engine/data/data_loader.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "engine/data/token_shard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using Docs = std::vector<std::vector<int32_t>>;

constexpr int32_t kEos = 99;
constexpr int64_t kVocab = 100;

void WriteShard(const std::string& path, const Docs& docs, uint64_t vocab_size = kVocab) {
  absl::StatusOr<TokenShardWriter> writer =
      TokenShardWriter::Create(path, {.vocab_size = vocab_size});
  ASSERT_THAT(writer, IsOk());
  for (const auto& doc : docs) ASSERT_THAT(writer->AppendDocument(doc), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
}

// `count` documents; document d holds `length` copies of id d (so every
// token tells which document it came from). Ids stay below kEos.
Docs NumberedDocs(int count, int length) {
  Docs docs(count);
  for (int doc_idx = 0; doc_idx < count; ++doc_idx) {
    docs[doc_idx].assign(length, doc_idx % kEos);
  }
  return docs;
}

DataLoaderOptions Options(const std::string& tokens, int64_t seq_len) {
  DataLoaderOptions options;
  options.tokens = tokens;
  options.seq_len = seq_len;
  options.vocab_size = kVocab;
  options.eos_id = kEos;
  return options;
}

// The first T inputs of every row: consecutive windows overlap by one token,
// so these are the stream, back to back.
std::vector<int32_t> StreamOf(const std::vector<MicroBatch>& batches) {
  std::vector<int32_t> stream;
  for (const MicroBatch& batch : batches) {
    stream.insert(stream.end(), batch.input_ids.begin(), batch.input_ids.end());
  }
  return stream;
}

std::vector<MicroBatch> TakeBatches(DataLoader& loader, int count, int64_t micro_batch) {
  std::vector<MicroBatch> batches;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<MicroBatch> batch = loader.NextTrainBatch(micro_batch);
    EXPECT_THAT(batch, IsOk());
    if (batch.ok()) batches.push_back(*std::move(batch));
  }
  return batches;
}

MATCHER_P(SameBatch, expected, "") {
  return arg.input_ids == expected.input_ids && arg.labels == expected.labels;
}

// ---------------------------------------------------------------------------
// Randomness

TEST(Mix64Test, MatchesSplitMix64Reference) {
  // The first output of SplitMix64 seeded with 0 (Vigna's splitmix64.c):
  // the finaliser applied to the golden gamma.
  EXPECT_EQ(Mix64(0x9E3779B97F4A7C15ull), 0xE220A8397B1DCDAFull);
}

TEST(ShuffledOrderTest, MatchesGoldenValues) {
  // From an independent Python implementation of the documented algorithm
  // (SplitMix64 seeded with Mix64(seed ^ Mix64(epoch)), Fisher-Yates from
  // the end, rejection below 2^64 mod n). Pins the order across platforms
  // and releases: a change here breaks resuming old checkpoints.
  EXPECT_THAT(ShuffledOrder(10, 1234, 0), ElementsAre(3, 0, 8, 6, 5, 7, 9, 4, 2, 1));
  EXPECT_THAT(ShuffledOrder(10, 1234, 1), ElementsAre(5, 6, 0, 2, 7, 4, 8, 1, 3, 9));
  EXPECT_THAT(ShuffledOrder(10, 99, 0), ElementsAre(6, 5, 9, 7, 2, 1, 4, 0, 8, 3));
}

TEST(ShuffledOrderTest, IsAPermutationAndDependsOnSeedAndEpoch) {
  const std::vector<uint64_t> order = ShuffledOrder(1000, 7, 3);
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(ShuffledOrder(1000, 7, 3), order);
  EXPECT_NE(ShuffledOrder(1000, 8, 3), order);
  EXPECT_NE(ShuffledOrder(1000, 7, 4), order);
  EXPECT_TRUE(ShuffledOrder(0, 7, 0).empty());
  EXPECT_THAT(ShuffledOrder(1, 7, 0), ElementsAre(0));
}

TEST(IsHeldOutDocumentTest, MatchesGoldenValuesAndFraction) {
  // Golden values from the same Python implementation.
  std::vector<uint64_t> held_out;
  for (uint64_t doc_idx = 0; doc_idx < 40; ++doc_idx) {
    if (IsHeldOutDocument(doc_idx, 1234, 0.25)) held_out.push_back(doc_idx);
  }
  EXPECT_THAT(held_out, ElementsAre(3, 5, 12, 18, 19, 20, 23, 25, 30, 36));
  // About the fraction over many documents: 10000 draws of p = 0.1 have a
  // standard deviation of 30, so [850, 1150] is a 5-sigma band.
  int count = 0;
  for (uint64_t doc_idx = 0; doc_idx < 10000; ++doc_idx) {
    count += IsHeldOutDocument(doc_idx, 42, 0.1);
  }
  EXPECT_GT(count, 850);
  EXPECT_LT(count, 1150);
  EXPECT_FALSE(IsHeldOutDocument(5, 42, 0.0));
}

// ---------------------------------------------------------------------------
// Packing

TEST(DataLoaderTest, PacksDocumentsWithEosAndShiftedLabels) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{10, 11, 12}, {20, 21}, {30, 31, 32, 33}});
  DataLoaderOptions options = Options(path, 4);
  options.shuffle = false;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  // Stream: 10 11 12 E 20 21 E 30 31 32 33 E | 10 11 12 E ... (epoch 1)
  // Window k = stream[4k, 4k + 5).
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(2);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(10, 11, 12, kEos,  //
                                            20, 21, kEos, 30));
  EXPECT_THAT(batch->labels, ElementsAre(11, 12, kEos, 20,  //
                                         21, kEos, 30, 31));
  // The third window runs across the epoch boundary.
  batch = loader->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(31, 32, 33, kEos));
  EXPECT_THAT(batch->labels, ElementsAre(32, 33, kEos, 10));
  // The cursor now sits exactly at the start of epoch 1; a fresh loader
  // resumes from there.
  const DataCursor cursor = loader->cursor();
  EXPECT_EQ(cursor.epoch, 1u);
  EXPECT_EQ(cursor.document_position, 0u);
  EXPECT_EQ(cursor.token_offset, 0u);
  EXPECT_EQ(cursor.windows, 3u);
  absl::StatusOr<DataLoader> resumed = DataLoader::Create(options);
  ASSERT_THAT(resumed, IsOk());
  ASSERT_THAT(resumed->RestoreCursor(cursor), IsOk());
  batch = resumed->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(10, 11, 12, kEos));
}

TEST(DataLoaderTest, SkipsEmptyDocuments) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{1, 2}, {}, {}, {3, 4}});
  DataLoaderOptions options = Options(path, 5);
  options.shuffle = false;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->train_documents(), ElementsAre(0, 3));
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  // One EOS per non-empty document, never two in a row.
  EXPECT_THAT(batch->input_ids, ElementsAre(1, 2, kEos, 3, 4));
  EXPECT_THAT(batch->labels, ElementsAre(2, kEos, 3, 4, kEos));
}

TEST(DataLoaderTest, ReadsDirectoryShardsInNameOrder) {
  const std::string dir = testing::MakeTempDir("data_loader_test");
  WriteShard(dir + "/b.mtt", {{3, 4}});
  WriteShard(dir + "/a.mtt", {{1, 2}});
  // Not shards: other suffixes are ignored.
  std::ofstream(dir + "/notes.txt") << "not a shard";
  WriteShard(dir + "/c.tok", {{50, 50}});
  DataLoaderOptions options = Options(dir, 5);
  options.shuffle = false;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->shard_paths(), ElementsAre(dir + "/a.mtt", dir + "/b.mtt"));
  absl::StatusOr<std::vector<int32_t>> doc = loader->Document(0);
  ASSERT_THAT(doc, IsOk());
  EXPECT_THAT(*doc, ElementsAre(1, 2));
  doc = loader->Document(1);
  ASSERT_THAT(doc, IsOk());
  EXPECT_THAT(*doc, ElementsAre(3, 4));
  EXPECT_THAT(loader->Document(2),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("document 2")));
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(1, 2, kEos, 3, 4));
}

TEST(DataLoaderTest, AppliesSftLossMask) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/sft.mtt";
  WriteShard(path, {{5, 6, 7, 8}, {9, 10}});
  // 1 = the token is a training target. Example 0: prompt 5 6, answer 7 8;
  // example 1: prompt 9, answer 10.
  WriteShard(path + kLossMaskSuffix, {{0, 0, 1, 1}, {0, 1}}, 2);
  DataLoaderOptions options = Options(path, 7);
  options.shuffle = false;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(2);
  ASSERT_THAT(batch, IsOk());
  // Stream: 5 6 7 8 E 9 10 E | 5 6 7 8 E ...; an EOS takes its document's
  // last token's mask (1 here), so the model learns to stop after an answer.
  EXPECT_THAT(batch->input_ids, ElementsAre(5, 6, 7, 8, kEos, 9, 10,  //
                                            kEos, 5, 6, 7, 8, kEos, 9));
  EXPECT_THAT(batch->labels, ElementsAre(kIgnoreLabel, 7, 8, kEos, kIgnoreLabel, 10, kEos,
                                         kIgnoreLabel, kIgnoreLabel, 7, 8, kEos, kIgnoreLabel, 10));
}

// Note [Packing rule], isolated documents: positions restart at 0 where a
// document begins (and at each row's start), and no label crosses into the
// next document.
TEST(DataLoaderTest, IsolatedPackingRestartsPositionsPerDocument) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{10, 11, 12}, {20, 21}, {30, 31, 32, 33}});
  DataLoaderOptions options = Options(path, 4);
  options.shuffle = false;
  options.document_attention = DocumentAttention::kIsolated;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_EQ(loader->document_attention(), DocumentAttention::kIsolated);
  // Stream: 10 11 12 E 20 21 E 30 31 32 33 E | 10 ...; the same windows as
  // shared packing (PacksDocumentsWithEosAndShiftedLabels).
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(2);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(10, 11, 12, kEos,  //
                                            20, 21, kEos, 30));
  EXPECT_THAT(batch->position_ids, ElementsAre(0, 1, 2, 3,  //
                                               0, 1, 2, 0));
  // E -> 20 and E -> 30 would predict a document from another one.
  EXPECT_THAT(batch->labels, ElementsAre(11, 12, kEos, kIgnoreLabel,  //
                                         21, kEos, kIgnoreLabel, 31));
  // A row that starts inside a document starts at position 0 too.
  batch = loader->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(batch->input_ids, ElementsAre(31, 32, 33, kEos));
  EXPECT_THAT(batch->position_ids, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(batch->labels, ElementsAre(32, 33, kEos, kIgnoreLabel));
}

// shared, and auto on shards without loss masks, pack exactly as the
// loader always did: no position ids, the same batches as a loader built
// without the option.
TEST(DataLoaderTest, SharedPackingIsUnchangedAndCarriesNoPositionIds) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, NumberedDocs(9, 5));
  const DataLoaderOptions plain = Options(path, 8);
  absl::StatusOr<DataLoader> reference = DataLoader::Create(plain);
  ASSERT_THAT(reference, IsOk());
  const std::vector<MicroBatch> expected = TakeBatches(*reference, 4, 3);
  for (const DocumentAttention mode : {DocumentAttention::kShared, DocumentAttention::kAuto}) {
    SCOPED_TRACE(DocumentAttentionName(mode));
    DataLoaderOptions options = plain;
    options.document_attention = mode;
    absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
    ASSERT_THAT(loader, IsOk());
    EXPECT_EQ(loader->document_attention(), DocumentAttention::kShared);
    const std::vector<MicroBatch> batches = TakeBatches(*loader, 4, 3);
    ASSERT_EQ(batches.size(), expected.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_EQ(batches[i].input_ids, expected[i].input_ids);
      EXPECT_EQ(batches[i].labels, expected[i].labels);
      EXPECT_TRUE(batches[i].position_ids.empty());
    }
  }
}

// auto isolates the documents of masked (SFT, chat) shards; their labels
// at a boundary were masked prompt tokens anyway.
TEST(DataLoaderTest, AutoIsolatesDocumentsOfMaskedShards) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/sft.mtt";
  WriteShard(path, {{5, 6, 7, 8}, {9, 10}});
  WriteShard(path + kLossMaskSuffix, {{0, 0, 1, 1}, {0, 1}}, 2);
  DataLoaderOptions options = Options(path, 7);
  options.shuffle = false;
  options.document_attention = DocumentAttention::kAuto;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_EQ(loader->document_attention(), DocumentAttention::kIsolated);
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(2);
  ASSERT_THAT(batch, IsOk());
  // The labels of AppliesSftLossMask; positions restart at 5 and 9.
  EXPECT_THAT(batch->labels, ElementsAre(kIgnoreLabel, 7, 8, kEos, kIgnoreLabel, 10, kEos,
                                         kIgnoreLabel, kIgnoreLabel, 7, 8, kEos, kIgnoreLabel, 10));
  EXPECT_THAT(batch->position_ids, ElementsAre(0, 1, 2, 3, 4, 0, 1,  //
                                               0, 0, 1, 2, 3, 4, 0));
}

// Eval batches carry position ids too; padding continues the last
// document's (nothing before it attends to it), an empty row is all 0.
TEST(DataLoaderTest, IsolatedEvalBatchesCarryPositionIds) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11}});
  const std::string eval_path = testing::MakeTempDir("data_loader_test") + "/eval.mtt";
  WriteShard(eval_path, {{20, 21, 22}, {30, 31}});
  DataLoaderOptions options = Options(path, 4);
  options.eval_tokens = eval_path;
  options.document_attention = DocumentAttention::kIsolated;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  absl::StatusOr<std::vector<MicroBatch>> batches = loader->EvalBatches(3, 5);
  ASSERT_THAT(batches, IsOk());
  ASSERT_EQ(batches->size(), 1u);
  EXPECT_THAT((*batches)[0].position_ids, ElementsAre(0, 1, 2, 3,  //
                                                      0, 1, 2, 3,  //
                                                      0, 0, 0, 0));
  EXPECT_THAT((*batches)[0].labels,
              ElementsAre(21, 22, kEos, kIgnoreLabel,            //
                          31, kEos, kIgnoreLabel, kIgnoreLabel,  //
                          kIgnoreLabel, kIgnoreLabel, kIgnoreLabel, kIgnoreLabel));
}

// ---------------------------------------------------------------------------
// Shuffle, epochs, resume

TEST(DataLoaderTest, SameSeedSameBatchesDifferentSeedDifferent) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, NumberedDocs(40, 3));
  DataLoaderOptions options = Options(path, 8);
  options.shuffle_seed = 7;
  absl::StatusOr<DataLoader> first = DataLoader::Create(options);
  absl::StatusOr<DataLoader> second = DataLoader::Create(options);
  options.shuffle_seed = 8;
  absl::StatusOr<DataLoader> other = DataLoader::Create(options);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  ASSERT_THAT(other, IsOk());
  const std::vector<MicroBatch> a = TakeBatches(*first, 6, 4);
  const std::vector<MicroBatch> b = TakeBatches(*second, 6, 4);
  const std::vector<MicroBatch> c = TakeBatches(*other, 6, 4);
  ASSERT_EQ(a.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_THAT(b[i], SameBatch(a[i])) << "batch " << i;
  }
  EXPECT_NE(StreamOf(a), StreamOf(c));
}

TEST(DataLoaderTest, EpochsWrapAndReshuffle) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  constexpr int kDocs = 20;
  constexpr int kLength = 3;
  WriteShard(path, NumberedDocs(kDocs, kLength));
  DataLoaderOptions options = Options(path, 10);
  options.shuffle_seed = 3;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  // Two and a half epochs of 20 x (3 + EOS) = 80 tokens.
  const std::vector<int32_t> stream = StreamOf(TakeBatches(*loader, 5, 4));
  ASSERT_EQ(stream.size(), 200u);
  std::vector<int32_t> expected;
  for (uint64_t epoch = 0; expected.size() < stream.size(); ++epoch) {
    for (uint64_t position : ShuffledOrder(kDocs, 3, epoch)) {
      expected.insert(expected.end(), kLength, static_cast<int32_t>(position));
      expected.push_back(kEos);
    }
  }
  expected.resize(stream.size());
  EXPECT_EQ(stream, expected);
  EXPECT_NE(ShuffledOrder(kDocs, 3, 0), ShuffledOrder(kDocs, 3, 1));
  EXPECT_EQ(loader->cursor().epoch, 2u);
}

TEST(DataLoaderTest, ResumeFromCursorGivesIdenticalBatches) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  Docs docs;
  for (int doc_idx = 0; doc_idx < 13; ++doc_idx) {
    // Lengths 1..13 so windows start mid-document and at EOS positions.
    std::vector<int32_t> doc;
    for (int pos = 0; pos <= doc_idx; ++pos) doc.push_back((doc_idx * 7 + pos) % kEos);
    docs.push_back(doc);
  }
  WriteShard(path, docs);
  DataLoaderOptions options = Options(path, 7);
  options.eval_fraction = 0.2;
  options.shuffle_seed = 11;
  constexpr int kBefore = 5;
  constexpr int kAfter = 9;  // 5 + 9 batches of 3 x 7 tokens pass 2 epochs

  absl::StatusOr<DataLoader> uninterrupted = DataLoader::Create(options);
  ASSERT_THAT(uninterrupted, IsOk());
  const std::vector<MicroBatch> all = TakeBatches(*uninterrupted, kBefore + kAfter, 3);

  std::string saved;
  {
    absl::StatusOr<DataLoader> first = DataLoader::Create(options);
    ASSERT_THAT(first, IsOk());
    TakeBatches(*first, kBefore, 3);
    saved = first->cursor().ToJson();
  }
  absl::StatusOr<DataCursor> cursor = DataCursor::FromJson(saved);
  ASSERT_THAT(cursor, IsOk());
  EXPECT_EQ(cursor->windows, kBefore * 3u);
  absl::StatusOr<DataLoader> resumed = DataLoader::Create(options);
  ASSERT_THAT(resumed, IsOk());
  ASSERT_THAT(resumed->RestoreCursor(*cursor), IsOk());
  EXPECT_EQ(resumed->cursor(), *cursor);
  const std::vector<MicroBatch> after = TakeBatches(*resumed, kAfter, 3);
  ASSERT_EQ(after.size(), static_cast<size_t>(kAfter));
  for (int i = 0; i < kAfter; ++i) {
    EXPECT_THAT(after[i], SameBatch(all[kBefore + i])) << "batch " << i;
  }
  EXPECT_GE(resumed->cursor().epoch, 2u);
  EXPECT_EQ(resumed->cursor(), uninterrupted->cursor());
}

TEST(DataCursorTest, JsonRoundTripKeepsEveryField) {
  const DataCursor cursor{.epoch = 3,
                          .document_position = 17,
                          .token_offset = 5,
                          .windows = 1234567,
                          .shuffle_seed = 0xFFFFFFFFFFFFFFF0ull,
                          .num_train_documents = 99,
                          .num_train_tokens = 123456789012ull};
  absl::StatusOr<DataCursor> parsed = DataCursor::FromJson(cursor.ToJson());
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(*parsed, cursor);
}

TEST(DataCursorTest, FromJsonRejectsBadInput) {
  EXPECT_THAT(DataCursor::FromJson("not json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  DataCursor cursor;
  std::string json = cursor.ToJson();
  json.replace(json.find("\"epoch\":0"), 9, "\"epoch\":-1");
  EXPECT_THAT(DataCursor::FromJson(json),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 'epoch' must be a non-negative")));
  EXPECT_THAT(DataCursor::FromJson(R"({"version":1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field 'epoch' is missing")));
  EXPECT_THAT(DataCursor::FromJson(R"({"version":2})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'version' is 2")));
}

TEST(DataLoaderTest, RestoreCursorRejectsOtherSeedOrData) {
  const std::string dir = testing::MakeTempDir("data_loader_test");
  WriteShard(dir + "/a.mtt", NumberedDocs(10, 4));
  WriteShard(dir + "/b.mtt", NumberedDocs(11, 4));
  absl::StatusOr<DataLoader> loader = DataLoader::Create(Options(dir + "/a.mtt", 4));
  ASSERT_THAT(loader, IsOk());
  ASSERT_THAT(loader->NextTrainBatch(2), IsOk());
  const DataCursor cursor = loader->cursor();

  DataLoaderOptions other_seed = Options(dir + "/a.mtt", 4);
  other_seed.shuffle_seed = 1;
  absl::StatusOr<DataLoader> reseeded = DataLoader::Create(other_seed);
  ASSERT_THAT(reseeded, IsOk());
  EXPECT_THAT(reseeded->RestoreCursor(cursor),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shuffle_seed 1234 differs")));

  absl::StatusOr<DataLoader> other_data = DataLoader::Create(Options(dir + "/b.mtt", 4));
  ASSERT_THAT(other_data, IsOk());
  EXPECT_THAT(
      other_data->RestoreCursor(cursor),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("saved for 10 training documents")));

  DataCursor past_end = cursor;
  past_end.document_position = 10;
  EXPECT_THAT(loader->RestoreCursor(past_end),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("document_position 10")));
  // A failed restore leaves the loader where it was.
  EXPECT_EQ(loader->cursor(), cursor);
}

// ---------------------------------------------------------------------------
// Eval split

TEST(DataLoaderTest, EvalSplitIsDisjointDeterministicAndNeverTrained) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  constexpr int kDocs = 90;  // ids 0..89 name the documents; EOS is 99
  WriteShard(path, NumberedDocs(kDocs, 5));
  DataLoaderOptions options = Options(path, 16);
  options.eval_fraction = 0.2;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  absl::StatusOr<DataLoader> again = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  ASSERT_THAT(again, IsOk());

  const std::vector<uint64_t>& train = loader->train_documents();
  const std::vector<uint64_t>& eval = loader->eval_documents();
  EXPECT_EQ(train.size() + eval.size(), static_cast<size_t>(kDocs));
  // 90 draws of p = 0.2: mean 18, standard deviation 3.8.
  EXPECT_GE(eval.size(), 6u);
  EXPECT_LE(eval.size(), 30u);
  std::vector<uint64_t> both;
  std::set_intersection(train.begin(), train.end(), eval.begin(), eval.end(),
                        std::back_inserter(both));
  EXPECT_TRUE(both.empty());
  EXPECT_EQ(again->eval_documents(), eval);
  for (uint64_t doc_idx : eval) {
    EXPECT_TRUE(IsHeldOutDocument(doc_idx, options.shuffle_seed, 0.2));
  }
  EXPECT_EQ(loader->num_eval_tokens(), eval.size() * 5);

  // Two epochs of training never show a held-out document's token.
  const std::set<int32_t> eval_ids(eval.begin(), eval.end());
  const int64_t windows = 2 * (loader->num_train_tokens() + train.size()) / 16;
  for (const MicroBatch& batch : TakeBatches(*loader, windows / 4 + 1, 4)) {
    for (int32_t id : batch.input_ids) {
      ASSERT_EQ(eval_ids.count(id), 0u) << "held-out document " << id;
    }
  }

  // The eval batches: only held-out documents, in index order, the same
  // list on every call and from every loader.
  absl::StatusOr<std::vector<MicroBatch>> eval_batches = loader->EvalBatches(2, 100);
  ASSERT_THAT(eval_batches, IsOk());
  absl::StatusOr<std::vector<MicroBatch>> eval_again = again->EvalBatches(2, 100);
  ASSERT_THAT(eval_again, IsOk());
  ASSERT_EQ(eval_batches->size(), eval_again->size());
  for (size_t i = 0; i < eval_batches->size(); ++i) {
    EXPECT_THAT((*eval_again)[i], SameBatch((*eval_batches)[i]));
  }
  std::vector<int32_t> expected;
  for (uint64_t doc_idx : eval) {
    expected.insert(expected.end(), 5, static_cast<int32_t>(doc_idx));
    expected.push_back(kEos);
  }
  // Eval stream: every held-out token once; padding after it is EOS input
  // with ignored labels.
  const std::vector<int32_t> stream = StreamOf(*eval_batches);
  // (Every stream token but the last is some window's input.)
  ASSERT_GE(stream.size(), expected.size() - 1);
  EXPECT_EQ(std::vector<int32_t>(stream.begin(), stream.begin() + expected.size() - 1),
            std::vector<int32_t>(expected.begin(), expected.end() - 1));
  int64_t counted_labels = 0;
  for (const MicroBatch& batch : *eval_batches) {
    for (int32_t label : batch.labels) counted_labels += label != kIgnoreLabel;
  }
  EXPECT_EQ(counted_labels, static_cast<int64_t>(expected.size()) - 1);
}

TEST(DataLoaderTest, EvalBatchesPadsTheLastWindowAndHonoursMaxBatches) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11}});
  const std::string eval_path = testing::MakeTempDir("data_loader_test") + "/eval.mtt";
  WriteShard(eval_path, {{20, 21, 22}, {30, 31}});
  DataLoaderOptions options = Options(path, 4);
  options.eval_tokens = eval_path;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->eval_documents(), ElementsAre(0, 1));
  EXPECT_THAT(loader->train_documents(), ElementsAre(0, 1));
  // Eval stream: 20 21 22 E 30 31 E (7 tokens): windows [0, 5) and [4, 7).
  absl::StatusOr<std::vector<MicroBatch>> batches = loader->EvalBatches(3, 5);
  ASSERT_THAT(batches, IsOk());
  ASSERT_EQ(batches->size(), 1u);
  EXPECT_THAT((*batches)[0].input_ids, ElementsAre(20, 21, 22, kEos,    //
                                                   30, 31, kEos, kEos,  //
                                                   kEos, kEos, kEos, kEos));
  EXPECT_THAT((*batches)[0].labels,
              ElementsAre(21, 22, kEos, 30,                      //
                          31, kEos, kIgnoreLabel, kIgnoreLabel,  //
                          kIgnoreLabel, kIgnoreLabel, kIgnoreLabel, kIgnoreLabel));
  batches = loader->EvalBatches(1, 1);
  ASSERT_THAT(batches, IsOk());
  EXPECT_EQ(batches->size(), 1u);
  EXPECT_THAT(loader->EvalBatches(1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eval.batches")));
}

// An eval set whose loss masks are all 0 has no target: its loss would be
// 0/0 (it used to be reported as 0.0), so it is refused naming the field.
TEST(DataLoaderTest, EvalBatchesWithoutATargetAreRefused) {
  const std::string dir = testing::MakeTempDir("data_loader_test");
  WriteShard(dir + "/data.mtt", {{1, 2, 3, 4, 5, 6}});
  WriteShard(dir + "/eval.mtt", {{20, 21, 22}, {30, 31}});
  WriteShard(dir + "/eval.mtt" + kLossMaskSuffix, {{0, 0, 0}, {0, 0}}, 2);
  DataLoaderOptions options = Options(dir + "/data.mtt", 4);
  options.eval_tokens = dir + "/eval.mtt";
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->EvalBatches(2, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.eval_tokens: the eval set has no trained token")));
  // One trained token is enough.
  WriteShard(dir + "/eval2.mtt", {{20, 21, 22}});
  WriteShard(dir + "/eval2.mtt" + kLossMaskSuffix, {{0, 1, 0}}, 2);
  options.eval_tokens = dir + "/eval2.mtt";
  loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->EvalBatches(2, 4), IsOk());
}

TEST(DataLoaderTest, EvalFractionHoldsOutAtLeastOneDocument) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, NumberedDocs(3, 4));
  DataLoaderOptions options = Options(path, 4);
  options.eval_fraction = 1e-9;  // the hash picks none of 3 documents
  absl::StatusOr<DataLoader> loader = DataLoader::Create(options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_EQ(loader->eval_documents().size(), 1u);
  EXPECT_EQ(loader->train_documents().size(), 2u);
}

TEST(DataLoaderTest, EvalBatchesWithoutEvalSetIsFailedPrecondition) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, NumberedDocs(3, 4));
  absl::StatusOr<DataLoader> loader = DataLoader::Create(Options(path, 4));
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->EvalBatches(1, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no eval set")));
}

// ---------------------------------------------------------------------------
// Bad input

TEST(DataLoaderTest, EmptyDatasetIsInvalidArgument) {
  const std::string dir = testing::MakeTempDir("data_loader_test");
  WriteShard(dir + "/empty.mtt", {{}, {}});
  EXPECT_THAT(DataLoader::Create(Options(dir + "/empty.mtt", 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty dataset")));
  const std::string empty_dir = testing::MakeTempDir("data_loader_test");
  EXPECT_THAT(DataLoader::Create(Options(empty_dir, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no *.mtt token shards")));
}

TEST(DataLoaderTest, FewerTokensThanOneWindowIsInvalidArgument) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, {{1, 2, 3}, {4}});  // 4 tokens + 2 EOS = 6 < 6 + 1
  EXPECT_THAT(DataLoader::Create(Options(path, 6)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fewer than one window of train.seq_len + "
                                 "1 = 7 tokens")));
  EXPECT_THAT(DataLoader::Create(Options(path, 5)), IsOk());
}

TEST(DataLoaderTest, MissingPathIsNotFound) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/missing.mtt";
  EXPECT_THAT(DataLoader::Create(Options(path, 4)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("data.tokens: " + path)));
}

TEST(DataLoaderTest, CorruptShardIsDataLossNamingFileAndOffset) {
  const std::string dir = testing::MakeTempDir("data_loader_test");
  WriteShard(dir + "/a.mtt", NumberedDocs(4, 4));
  WriteShard(dir + "/b.mtt", NumberedDocs(4, 4));
  // Overwrite b's magic.
  {
    std::fstream file(dir + "/b.mtt", std::ios::in | std::ios::out | std::ios::binary);
    file.write("NOTASHRD", 8);
  }
  EXPECT_THAT(
      DataLoader::Create(Options(dir, 4)),
      StatusIs(absl::StatusCode::kDataLoss,
               ::testing::AllOf(HasSubstr(dir + "/b.mtt"), HasSubstr("byte 0: bad magic"))));
  // Truncate a: the body no longer matches the header.
  const std::string path = dir + "/a.mtt";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  EXPECT_THAT(DataLoader::Create(Options(path, 4)),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::AllOf(HasSubstr(path), HasSubstr("truncated token body"))));
}

TEST(DataLoaderTest, TokenIdBeyondModelVocabIsInvalidArgument) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  // Written for a larger vocabulary than the model's (kVocab = 100).
  WriteShard(path, {{1, 2, 3}, {4, 500, 6}}, /*vocab_size=*/1000);
  EXPECT_THAT(
      DataLoader::Create(Options(path, 2)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr(path), HasSubstr("document 1, position 1: token id 500"),
                                HasSubstr("vocab_size 100"))));
  // Same with an unknown shard vocabulary (uint32 ids).
  const std::string unknown = testing::MakeTempDir("data_loader_test") + "/unknown.mtt";
  WriteShard(unknown, {{1, 2, 3, 100}}, /*vocab_size=*/0);
  EXPECT_THAT(DataLoader::Create(Options(unknown, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("position 3: token id 100")));
  // A shard written for a smaller vocabulary is fine.
  const std::string smaller = testing::MakeTempDir("data_loader_test") + "/smaller.mtt";
  WriteShard(smaller, {{1, 2, 3, 4}}, /*vocab_size=*/50);
  EXPECT_THAT(DataLoader::Create(Options(smaller, 2)), IsOk());
}

TEST(DataLoaderTest, MismatchedLossMaskIsDataLoss) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/sft.mtt";
  WriteShard(path, {{5, 6, 7}, {8, 9}});
  WriteShard(path + kLossMaskSuffix, {{0, 1}, {1, 1, 1}}, 2);
  EXPECT_THAT(
      DataLoader::Create(Options(path, 2)),
      StatusIs(absl::StatusCode::kDataLoss,
               ::testing::AllOf(HasSubstr(path + ".mask"), HasSubstr("document 0 has 2 tokens"))));
  WriteShard(path + kLossMaskSuffix, {{0, 1, 1}, {1, 1}}, 10);
  EXPECT_THAT(DataLoader::Create(Options(path, 2)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("loss mask has vocab_size 10")));
}

TEST(DataLoaderTest, BadOptionsAreInvalidArgumentNamingTheField) {
  const std::string path = testing::MakeTempDir("data_loader_test") + "/data.mtt";
  WriteShard(path, NumberedDocs(4, 4));
  DataLoaderOptions options = Options(path, 0);
  EXPECT_THAT(DataLoader::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.seq_len: must be at least 1, got 0")));
  options = Options(path, 4);
  options.eos_id = kVocab;
  EXPECT_THAT(DataLoader::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.eos_id: must be in [0, vocab_size 100)")));
  options = Options(path, 4);
  options.eval_fraction = 0.7;
  EXPECT_THAT(DataLoader::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.eval_fraction: must be in [0, 0.5]")));
  options = Options(path, 4);
  options.eval_tokens = path;
  options.eval_fraction = 0.1;
  EXPECT_THAT(DataLoader::Create(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("must be 0 with data.eval_tokens")));
  options = Options(path, 4);
  options.vocab_size = 0;
  EXPECT_THAT(DataLoader::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_size")));
  absl::StatusOr<DataLoader> loader = DataLoader::Create(Options(path, 4));
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->NextTrainBatch(0), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("train.micro_batch: must be in [1,")));
  const std::string single = testing::MakeTempDir("data_loader_test") + "/single.mtt";
  WriteShard(single, {{1, 2, 3, 4, 5, 6}});
  options = Options(single, 4);
  options.eval_fraction = 0.1;
  EXPECT_THAT(DataLoader::Create(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("at least 2 non-empty documents")));
}

}  // namespace
}  // namespace megatrain::engine
