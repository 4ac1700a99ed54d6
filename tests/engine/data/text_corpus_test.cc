// Tests of engine/data/text_corpus.h: plain text, JSONL and SFT JSONL to token
// shards, shard rolling, the held-out split, the loader reading the result,
// and the bad-input cases (JSONL errors name the file and the line).
#include "engine/data/text_corpus.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/data/data_loader.h"
#include "engine/data/token_shard.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/sentencepiece_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::TinyCorpusSentence;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::vector<int32_t>> ReadDocs(const std::string& path) {
  absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(path);
  EXPECT_THAT(shard, IsOk());
  std::vector<std::vector<int32_t>> docs;
  if (!shard.ok()) return docs;
  for (uint64_t doc_idx = 0; doc_idx < shard->num_documents(); ++doc_idx) {
    docs.push_back(shard->DocumentAsInt32(doc_idx));
  }
  return docs;
}

uint64_t FileSize(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 ? info.st_size : 0;
}

// Tests that tokenize text share one tiny SentencePiece model.
class TextCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::StatusOr<std::string>& path = testing::SharedTinySentencePieceModel();
    ASSERT_THAT(path, IsOk());
    model_path_ = *path;
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_path_);
    if (tokenizer.status().code() == absl::StatusCode::kUnimplemented) {
      GTEST_SKIP() << tokenizer.status();  // ASan/TSan build
    }
    ASSERT_THAT(tokenizer, IsOk());
    tokenizer_.emplace(*std::move(tokenizer));
    dir_ = testing::MakeTempDir("text_corpus_test");
  }

  std::vector<int32_t> Encode(const std::string& text) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text);
    EXPECT_THAT(ids, IsOk());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  TokenizeOptions TextOptions(std::vector<std::string> inputs) {
    TokenizeOptions options;
    options.input_paths = std::move(inputs);
    options.tokenizer_model = model_path_;
    options.output_dir = dir_ + "/out";
    return options;
  }

  std::string model_path_;
  std::optional<Tokenizer> tokenizer_;
  std::string dir_;
};

// ---------------------------------------------------------------------------
// Text

TEST_F(TextCorpusTest, PlainTextSplitsDocumentsAtBlankLines) {
  const std::string input = dir_ + "/corpus.txt";
  // Two blank lines, a whitespace-only line and CRLF endings all separate.
  WriteFile(input, absl::StrCat(TinyCorpusSentence(0), "\n", TinyCorpusSentence(1), "\r\n\n\n",
                                TinyCorpusSentence(2), "\n \t\n", TinyCorpusSentence(3), "\n"));
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(TextOptions({input}));
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 3u);
  EXPECT_EQ(report->eval_documents, 0u);
  EXPECT_EQ(report->vocab_size, 100);
  EXPECT_EQ(report->eos_id, 2);
  const std::string shard = dir_ + "/out/train-00000.mtt";
  ASSERT_THAT(report->shards, ElementsAre(shard));
  EXPECT_EQ(report->bytes_written, FileSize(shard));
  const auto docs = ReadDocs(shard);
  ASSERT_EQ(docs.size(), 3u);
  // A document's lines are joined with '\n'.
  EXPECT_EQ(docs[0], Encode(TinyCorpusSentence(0) + "\n" + TinyCorpusSentence(1)));
  EXPECT_EQ(docs[1], Encode(TinyCorpusSentence(2)));
  EXPECT_EQ(docs[2], Encode(TinyCorpusSentence(3)));
  uint64_t tokens = 0;
  for (const auto& doc : docs) tokens += doc.size();
  EXPECT_EQ(report->tokens, tokens);
  // uint16 ids, as the vocabulary is 100.
  absl::StatusOr<TokenShardReader> reader = TokenShardReader::Open(shard);
  ASSERT_THAT(reader, IsOk());
  EXPECT_EQ(reader->token_dtype(), TokenDtype::kUint16);
  EXPECT_EQ(reader->vocab_size(), 100u);
}

TEST_F(TextCorpusTest, JsonlWithBosSkipsEmptyTexts) {
  const std::string input = dir_ + "/corpus.jsonl";
  WriteFile(input, absl::StrCat(R"({"text": ")", TinyCorpusSentence(4), R"(", "id": 1})", "\n",
                                "\n",  // blank lines are skipped
                                R"({"text": ""})", "\n", R"({"text": ")", TinyCorpusSentence(5),
                                R"("})", "\n"));
  TokenizeOptions options = TextOptions({input});
  options.add_bos = true;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 2u);
  EXPECT_EQ(report->skipped_documents, 1u);
  const auto docs = ReadDocs(report->shards.at(0));
  ASSERT_EQ(docs.size(), 2u);
  std::vector<int32_t> expected = {tokenizer_->bos_id()};
  for (int32_t id : Encode(TinyCorpusSentence(4))) expected.push_back(id);
  EXPECT_EQ(docs[0], expected);
  EXPECT_EQ(docs[1].front(), tokenizer_->bos_id());
}

TEST_F(TextCorpusTest, JsonlErrorsNameFileAndLine) {
  const std::string ok_line = R"({"text": "the model"})";
  struct Case {
    std::string bad_line;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"text": "unterminated)", "invalid JSON"},
      {R"(["text"])", "expected a JSON object, got array"},
      {R"({"body": "x"})", "field \"text\" is missing"},
      {R"({"text": 5})", "field \"text\" must be a string, got number"},
  };
  for (const Case& c : cases) {
    const std::string input = dir_ + "/bad.jsonl";
    WriteFile(input, ok_line + "\n" + ok_line + "\n" + c.bad_line + "\n");
    TokenizeOptions options = TextOptions({input});
    options.overwrite = true;
    EXPECT_THAT(TokenizeToShards(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(input + ":3: "), HasSubstr(c.message))))
        << c.bad_line;
  }
}

TEST_F(TextCorpusTest, RollsShardsWithoutSplittingDocuments) {
  const std::string input = dir_ + "/corpus.txt";
  std::string text;
  for (int index = 0; index < 10; ++index) {
    absl::StrAppend(&text, TinyCorpusSentence(index), "\n\n");
  }
  WriteFile(input, text);
  TokenizeOptions options = TextOptions({input});
  options.max_shard_tokens = 30;
  options.shard_prefix = "web";
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  ASSERT_GE(report->shards.size(), 2u);
  EXPECT_EQ(report->shards[0], dir_ + "/out/web-00000.mtt");
  EXPECT_EQ(report->shards[1], dir_ + "/out/web-00001.mtt");
  std::vector<std::vector<int32_t>> all;
  uint64_t bytes = 0;
  for (const std::string& shard : report->shards) {
    const auto docs = ReadDocs(shard);
    uint64_t tokens = 0;
    for (const auto& doc : docs) tokens += doc.size();
    // A shard closes at the document that reaches the limit.
    EXPECT_LT(tokens - docs.back().size(), 30u) << shard;
    all.insert(all.end(), docs.begin(), docs.end());
    bytes += FileSize(shard);
  }
  ASSERT_EQ(all.size(), 10u);
  for (int index = 0; index < 10; ++index) {
    EXPECT_EQ(all[index], Encode(TinyCorpusSentence(index)));
  }
  EXPECT_EQ(report->bytes_written, bytes);
}

TEST_F(TextCorpusTest, HeldOutSplitGoesToEvalShardsTheLoaderReads) {
  const std::string input = dir_ + "/corpus.jsonl";
  std::string text;
  for (int index = 0; index < 200; ++index) {
    absl::StrAppend(&text, R"({"text": ")", TinyCorpusSentence(index), "\"}\n");
  }
  WriteFile(input, text);
  TokenizeOptions options = TextOptions({input});
  options.eval_fraction = 0.2;
  options.split_seed = 5;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents + report->eval_documents, 200u);
  ASSERT_THAT(report->eval_shards, ElementsAre(dir_ + "/out/eval/train-00000.mtt"));
  // The held-out documents are exactly those the documented hash picks.
  std::vector<std::vector<int32_t>> expected_eval;
  for (int index = 0; index < 200; ++index) {
    if (IsHeldOutDocument(index, 5, 0.2)) {
      expected_eval.push_back(Encode(TinyCorpusSentence(index)));
    }
  }
  EXPECT_EQ(ReadDocs(report->eval_shards[0]), expected_eval);

  // A loader given output_dir trains on the training shards only and
  // evaluates on the eval directory.
  DataLoaderOptions loader_options;
  loader_options.tokens = options.output_dir;
  loader_options.eval_tokens = options.output_dir + "/eval";
  loader_options.seq_len = 16;
  loader_options.vocab_size = report->vocab_size;
  loader_options.eos_id = report->eos_id;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(loader_options);
  ASSERT_THAT(loader, IsOk());
  EXPECT_THAT(loader->shard_paths(), ElementsAre(report->shards[0]));
  EXPECT_EQ(loader->num_train_tokens(), report->tokens);
  EXPECT_EQ(loader->num_eval_tokens(), report->eval_tokens);
  EXPECT_THAT(loader->NextTrainBatch(2), IsOk());
  EXPECT_THAT(loader->EvalBatches(2, 2), IsOk());
}

TEST_F(TextCorpusTest, RefusesExistingShardsUnlessOverwrite) {
  const std::string input = dir_ + "/corpus.txt";
  std::string text;
  for (int index = 0; index < 6; ++index) {
    absl::StrAppend(&text, TinyCorpusSentence(index), "\n\n");
  }
  WriteFile(input, text);
  TokenizeOptions options = TextOptions({input});
  options.max_shard_tokens = 1;  // one document per shard
  absl::StatusOr<TokenizeReport> first = TokenizeToShards(options);
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->shards.size(), 6u);

  options.max_shard_tokens = 1000;
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       AllOf(HasSubstr("output_dir: " + options.output_dir),
                             HasSubstr("train-00000.mtt"))));
  options.overwrite = true;
  absl::StatusOr<TokenizeReport> second = TokenizeToShards(options);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->shards.size(), 1u);
  // The five stale shards of the first run are gone.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.output_dir)) {
    files += entry.path().extension() == ".mtt";
  }
  EXPECT_EQ(files, 1);
}

TEST_F(TextCorpusTest, BadInputsAndOptions) {
  const std::string missing = dir_ + "/missing.txt";
  EXPECT_THAT(TokenizeToShards(TextOptions({missing})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("input_paths: " + missing)));
  EXPECT_THAT(TokenizeToShards(TextOptions({dir_})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  const std::string input = dir_ + "/corpus.txt";
  WriteFile(input, "hello\n");
  TokenizeOptions options = TextOptions({input});
  options.tokenizer_model = dir_ + "/missing.model";
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("tokenizer_model: " + dir_ + "/missing.model")));
  options.tokenizer_model = "";
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer_model: required")));
  options = TextOptions({input});
  options.eval_fraction = 0.6;
  EXPECT_THAT(TokenizeToShards(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("eval_fraction: must be in [0, 0.5]")));
  EXPECT_THAT(TokenizeToShards(TextOptions({})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input_paths: is empty")));
  const std::string empty = dir_ + "/empty.jsonl";
  WriteFile(empty, "{\"text\": \"\"}\n\n");
  EXPECT_THAT(TokenizeToShards(TextOptions({empty})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no document with tokens")));
}

// ---------------------------------------------------------------------------
// SFT (no tokenizer needed)

TokenizeOptions SftOptions(const std::string& input, const std::string& out) {
  TokenizeOptions options;
  options.input_paths = {input};
  options.format = CorpusFormat::kSftJsonl;
  options.vocab_size = 50;
  options.output_dir = out;
  return options;
}

TEST(TextCorpusSftTest, WritesMaskThatTheLoaderApplies) {
  const std::string dir = testing::MakeTempDir("text_corpus_test");
  const std::string input = dir + "/sft.jsonl";
  WriteFile(input,
            "{\"input_ids\": [5, 6, 7, 8], \"labels\": [-100, -100, 7, 8]}\n"
            "{\"input_ids\": [9, 10], \"loss_mask\": [0, true]}\n"
            "{\"input_ids\": [11, 12]}\n");
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(SftOptions(input, dir + "/out"));
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 3u);
  EXPECT_EQ(report->tokens, 8u);
  EXPECT_EQ(report->masked_tokens, 3u);
  EXPECT_EQ(report->vocab_size, 50);
  EXPECT_EQ(report->eos_id, -1);
  const std::string shard = dir + "/out/train-00000.mtt";
  ASSERT_THAT(report->shards, ElementsAre(shard));
  EXPECT_EQ(report->bytes_written, FileSize(shard) + FileSize(shard + kLossMaskSuffix));
  EXPECT_THAT(ReadDocs(shard),
              ElementsAre(ElementsAre(5, 6, 7, 8), ElementsAre(9, 10), ElementsAre(11, 12)));
  EXPECT_THAT(ReadDocs(shard + kLossMaskSuffix),
              ElementsAre(ElementsAre(0, 0, 1, 1), ElementsAre(0, 1), ElementsAre(1, 1)));

  DataLoaderOptions loader_options;
  loader_options.tokens = shard;
  loader_options.seq_len = 10;
  loader_options.vocab_size = 50;
  loader_options.eos_id = 49;
  loader_options.shuffle = false;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(loader_options);
  ASSERT_THAT(loader, IsOk());
  absl::StatusOr<MicroBatch> batch = loader->NextTrainBatch(1);
  ASSERT_THAT(batch, IsOk());
  // Stream: 5 6 7 8 E 9 10 E 11 12 E.
  EXPECT_THAT(batch->input_ids, ElementsAre(5, 6, 7, 8, 49, 9, 10, 49, 11, 12));
  EXPECT_THAT(batch->labels, ElementsAre(-100, 7, 8, 49, -100, 10, 49, 11, 12, 49));
}

// Note [Tokenize report]: the rule and its counts are left beside the shards.
TEST(TextCorpusSftTest, ReportFileRecordsTheLongDocumentRule) {
  const std::string dir = testing::MakeTempDir("text_corpus_test");
  const std::string input = dir + "/sft.jsonl";
  WriteFile(input,
            "{\"input_ids\": [5, 6, 7, 8, 9, 10]}\n"
            "{\"input_ids\": [9, 10]}\n"
            "{\"input_ids\": [11, 12, 13, 14]}\n");
  TokenizeOptions options = SftOptions(input, dir + "/out");
  options.max_document_tokens = 3;
  options.long_documents = LongDocumentRule::kDrop;
  ASSERT_THAT(TokenizeToShards(options), IsOk());

  absl::StatusOr<TokenizeReport> read = ReadTokenizeReport(dir + "/out");
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->documents, 1u);
  EXPECT_EQ(read->dropped_documents, 2u);
  EXPECT_EQ(read->truncated_documents, 0u);
  EXPECT_EQ(read->max_document_tokens, 3u);
  EXPECT_EQ(read->long_documents, LongDocumentRule::kDrop);
  EXPECT_TRUE(read->masked);
  EXPECT_THAT(ReadTokenizeReport(dir),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tokenize.json")));
  WriteFile(dir + "/out/tokenize.json", "{\"format\": \"other\"}");
  EXPECT_THAT(ReadTokenizeReport(dir + "/out"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("megatrain-tokenize-report")));
}

// Issue 14: with a root (a job's output_dir), the shard directories are
// reached from it through descriptors: a link swapped in at any component
// fails the run and nothing is written through it.
TEST(TextCorpusSftTest, ShardsBelowARootNeverGoThroughASymbolicLink) {
  const std::string root = testing::MakeTempDir("text_corpus_test");
  const std::string outside = testing::MakeTempDir("text_corpus_test");
  const std::string input = root + "/sft.jsonl";
  WriteFile(input, "{\"input_ids\": [5, 6, 7]}\n{\"input_ids\": [8, 9]}\n");
  std::filesystem::create_directory_symlink(outside, root + "/data");
  TokenizeOptions options = SftOptions(input, root + "/data/train");
  options.root = root;

  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("output_dir"), HasSubstr("symbolic link"))));
  EXPECT_THAT(testing::ListDir(outside), ::testing::IsEmpty());
  // A link at the shard directory itself, and at the held-out one.
  std::filesystem::remove(root + "/data");
  std::filesystem::create_directories(root + "/data");
  std::filesystem::create_directory_symlink(outside, root + "/data/train");
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  std::filesystem::remove(root + "/data/train");
  std::filesystem::create_directory_symlink(outside, root + "/data/eval");
  options.eval_fraction = 0.5;
  options.eval_output_dir = root + "/data/eval";
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("eval_output_dir"), HasSubstr("symbolic link"))));
  EXPECT_THAT(testing::ListDir(outside), ::testing::IsEmpty());
  // Outside the root: refused before anything is made.
  options.eval_fraction = 0;
  options.output_dir = outside + "/train";
  EXPECT_THAT(TokenizeToShards(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not lie below")));
  EXPECT_THAT(testing::ListDir(outside), ::testing::IsEmpty());
  // Without links the same run writes below the root.
  std::filesystem::remove(root + "/data/eval");
  options.output_dir = root + "/data/train";
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_THAT(report->shards, ElementsAre(root + "/data/train/train-00000.mtt"));
  EXPECT_THAT(testing::ListDir(root + "/data/train"),
              ElementsAre("tokenize.json", "train-00000.mtt", "train-00000.mtt.mask"));
}

TEST(TextCorpusSftTest, BadExamplesNameFileLineAndField) {
  const std::string dir = testing::MakeTempDir("text_corpus_test");
  struct Case {
    std::string line;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"labels": [1]})", "field \"input_ids\" is missing"},
      {R"({"input_ids": "1 2"})", "must be an array of token ids, got string"},
      {R"({"input_ids": [1, 50]})", "input_ids[1] = 50 is not an integer in [0, 50) (vocab_size)"},
      {R"({"input_ids": [1, -2]})", "input_ids[1] = -2"},
      {R"({"input_ids": [1, 2.5]})", "input_ids[1] = 2.5"},
      {R"({"input_ids": [1, 2], "labels": [1]})",
       "field \"labels\" must be an array of 2 values (one per input id), got "
       "1 values"},
      {R"({"input_ids": [1, 2], "labels": [1, 3]})",
       "labels[1] = 3 must be -100 or input_ids[1] = 2"},
      {R"({"input_ids": [1, 2], "loss_mask": [1, 2]})", "loss_mask[1] = 2 must be 0, 1 or a bool"},
      {R"({"input_ids": [1], "labels": [1], "loss_mask": [1]})",
       "has both \"labels\" and \"loss_mask\""},
  };
  for (const Case& c : cases) {
    const std::string input = dir + "/bad.jsonl";
    WriteFile(input, "{\"input_ids\": [1, 2]}\n" + c.line + "\n");
    TokenizeOptions options = SftOptions(input, dir + "/out");
    options.overwrite = true;
    EXPECT_THAT(TokenizeToShards(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(input + ":2: "), HasSubstr(c.message))))
        << c.line;
  }
  TokenizeOptions options = SftOptions(dir + "/bad.jsonl", dir + "/out");
  options.add_bos = true;
  EXPECT_THAT(TokenizeToShards(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("add_bos: applies to text only")));
}

}  // namespace
}  // namespace megatrain::engine

namespace megatrain::engine {
namespace {

// A model directory's tokenizer.json (a fixture made by the `tokenizers`
// library): documents become exactly the ids tokenizers gives (the fixture's
// expected.json), BOS / EOS come from tokenizer_config.json, and the report
// records the input size and time (throughput).
TEST(TextCorpusHfTest, ModelDirectoryTokenizerGivesTokenizersIds) {
  const std::string fixture = "tests/testdata/tokenizers/llama3-bpe";
  std::ifstream in(fixture + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const std::string dir = testing::MakeTempDir("text_corpus_hf");
  // Two single-line documents from the fixture's hard cases.
  const nlohmann::json& a = expected.at("cases").at(11);  // "don't I'll we've ..."
  const nlohmann::json& b = expected.at("cases").at(16);  // emoji
  WriteFile(dir + "/in.jsonl", nlohmann::json{{"text", a.at("text")}}.dump() + "\n" +
                                   nlohmann::json{{"text", b.at("text")}}.dump() + "\n");
  TokenizeOptions options;
  options.input_paths = {dir + "/in.jsonl"};
  options.tokenizer_model = fixture;  // the directory
  options.output_dir = dir + "/out";
  options.add_bos = true;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  std::vector<int32_t> want_a = a.at("ids").get<std::vector<int32_t>>();
  std::vector<int32_t> want_b = b.at("ids").get<std::vector<int32_t>>();
  want_a.insert(want_a.begin(), 0);  // <|begin_of_text|>
  want_b.insert(want_b.begin(), 0);
  EXPECT_THAT(ReadDocs(report->shards.at(0)), ElementsAre(want_a, want_b));
  EXPECT_EQ(report->eos_id, 4);  // <|eot_id|> in tokenizer_config.json
  EXPECT_EQ(report->vocab_size, 2000);
  EXPECT_EQ(report->input_bytes, FileSize(dir + "/in.jsonl"));
  EXPECT_GT(report->seconds, 0);
}

TEST(TextCorpusHfTest, DirectoryWithoutTokenizerJsonIsNotFound) {
  const std::string dir = testing::MakeTempDir("text_corpus_hf_missing");
  WriteFile(dir + "/in.txt", "some text\n");
  TokenizeOptions options;
  options.input_paths = {dir + "/in.txt"};
  options.tokenizer_model = dir;
  options.output_dir = dir + "/out";
  EXPECT_THAT(TokenizeToShards(options).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("tokenizer_model"), HasSubstr("tokenizer.json"))));
}

}  // namespace
}  // namespace megatrain::engine

namespace megatrain::engine {
namespace {

// Chat-format SFT against transformers: the conversations of the fixtures
// (rendered by apply_chat_template, with assistant masks from the
// templates' {% generation %} blocks), as megatrain_client.chat_template
// renders them (tests/python/chat_template_test.py checks the text and
// wrote chat_spans.json), must give transformers' ids and assistant masks.
TEST(TextCorpusChatTest, ChatFormatGivesTransformersIdsAndMasks) {
  std::ifstream spans_in("tests/testdata/tokenizers/chat_spans.json");
  const nlohmann::json all_spans = nlohmann::json::parse(spans_in);
  int checked = 0;
  for (const std::string name :
       {"llama3-bpe", "qwen2-bpe", "llama2-spm-legacy", "mistral-spm-metaspace"}) {
    const std::string fixture = "tests/testdata/tokenizers/" + name;
    std::ifstream in(fixture + "/expected.json");
    const nlohmann::json chats = nlohmann::json::parse(in).at("chats");
    const std::string dir = testing::MakeTempDir("text_corpus_chat");
    std::string jsonl;
    for (size_t i = 0; i < chats.size(); ++i) {
      jsonl += nlohmann::json{{"text", chats[i].at("rendered")},
                              {"assistant_spans", all_spans.at(name).at(i)}}
                   .dump() +
               "\n";
    }
    WriteFile(dir + "/chat.jsonl", jsonl);
    TokenizeOptions options;
    options.input_paths = {dir + "/chat.jsonl"};
    options.format = CorpusFormat::kChatJsonl;
    options.tokenizer_model = fixture;
    options.output_dir = dir + "/out";
    absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
    ASSERT_THAT(report, IsOk()) << name;
    const std::vector<std::vector<int32_t>> docs = ReadDocs(report->shards.at(0));
    const std::vector<std::vector<int32_t>> masks = ReadDocs(report->shards.at(0) + ".mask");
    ASSERT_EQ(docs.size(), chats.size());
    ASSERT_EQ(masks.size(), chats.size());
    for (size_t i = 0; i < chats.size(); ++i) {
      EXPECT_EQ(docs[i], chats[i].at("ids").get<std::vector<int32_t>>()) << name << " chat " << i;
      EXPECT_EQ(masks[i], chats[i].at("assistant_masks").get<std::vector<int32_t>>())
          << name << " chat " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(TextCorpusChatTest, TrainOnAllTurnsAndBadSpans) {
  const std::string fixture = "tests/testdata/tokenizers/qwen2-bpe";
  const std::string dir = testing::MakeTempDir("text_corpus_chat_bad");
  WriteFile(dir + "/chat.jsonl",
            R"({"text": "<|im_start|>user\nhi<|im_end|>", "assistant_spans": []})"
            "\n");
  TokenizeOptions options;
  options.input_paths = {dir + "/chat.jsonl"};
  options.format = CorpusFormat::kChatJsonl;
  options.tokenizer_model = fixture;
  options.output_dir = dir + "/all";
  options.train_on_all_turns = true;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->masked_tokens, 0u);

  WriteFile(dir + "/bad.jsonl", R"({"text": "abc", "assistant_spans": [[2, 9]]})"
                                "\n");
  options.input_paths = {dir + "/bad.jsonl"};
  options.output_dir = dir + "/bad";
  options.train_on_all_turns = false;
  EXPECT_THAT(TokenizeToShards(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("bad.jsonl:1"), HasSubstr("assistant_spans[0]"))));
}

}  // namespace
}  // namespace megatrain::engine

namespace megatrain::engine {
namespace {

// Reads a JSONL file into one object per line.
std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The released templates (no {% generation %} blocks) of tests/testdata/chat/:
// megatrain_client.chat_template found the answers from prefix renders
// (tests/python/chat_template_test.py wrote <name>.rendered.jsonl); tokenized,
// they must give transformers' ids and assistant masks, which transformers
// computed from the generation-block versions of the same templates.
TEST(TextCorpusChatTest, ReleasedTemplatesGiveTransformersMasks) {
  int checked = 0;
  for (const auto& [name, sibling] : std::vector<std::pair<std::string, std::string>>{
           {"llama3-released", "llama3-bpe"}, {"qwen2-chatml-released", "qwen2-bpe"}}) {
    const std::string fixture = "tests/testdata/tokenizers/" + sibling;
    std::ifstream in(fixture + "/expected.json");
    const nlohmann::json chats = nlohmann::json::parse(in).at("chats");
    const std::string dir = testing::MakeTempDir("text_corpus_released");
    TokenizeOptions options;
    options.input_paths = {"tests/testdata/chat/" + name + ".rendered.jsonl"};
    options.format = CorpusFormat::kChatJsonl;
    options.tokenizer_model = fixture;
    options.output_dir = dir + "/out";
    absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
    ASSERT_THAT(report, IsOk()) << name;
    const auto docs = ReadDocs(report->shards.at(0));
    const auto masks = ReadDocs(report->shards.at(0) + kLossMaskSuffix);
    ASSERT_EQ(docs.size(), chats.size()) << name;
    uint64_t trained = 0;
    for (size_t i = 0; i < chats.size(); ++i) {
      EXPECT_EQ(docs[i], chats[i].at("ids").get<std::vector<int32_t>>()) << name << " " << i;
      EXPECT_EQ(masks[i], chats[i].at("assistant_masks").get<std::vector<int32_t>>())
          << name << " " << i;
      for (int32_t m : masks[i]) trained += m;
      ++checked;
    }
    EXPECT_GT(trained, 0u);
    EXPECT_EQ(report->trained_tokens, trained);
    EXPECT_EQ(report->untrained_documents, 0u);
    absl::StatusOr<TokenizeReport> read = ReadTokenizeReport(dir + "/out");
    ASSERT_THAT(read, IsOk());
    EXPECT_TRUE(read->masked);
    EXPECT_TRUE(read->trained_counts_known);
    EXPECT_EQ(read->trained_tokens, trained);
  }
  EXPECT_EQ(checked, 6);
}

// Note [Chat truncation]: over max_document_tokens a conversation loses its
// oldest turns after the system prompt, and is then exactly what the
// template renders for the shorter conversation (tests/python/
// chat_template_test.py wrote <name>.shortened.jsonl: conversation 1 without
// its first user/assistant exchange). One without a turn to spare is dropped.
TEST(TextCorpusChatTest, LongConversationsDropTheirOldestTurnsOrAreDropped) {
  const std::string fixture = "tests/testdata/tokenizers/qwen2-bpe";
  const std::string chat = "tests/testdata/chat/qwen2-chatml-released";
  const std::string dir = testing::MakeTempDir("text_corpus_chat_long");
  TokenizeOptions options;
  options.input_paths = {chat + ".shortened.jsonl"};
  options.format = CorpusFormat::kChatJsonl;
  options.tokenizer_model = fixture;
  options.output_dir = dir + "/shortened";
  absl::StatusOr<TokenizeReport> shortened = TokenizeToShards(options);
  ASSERT_THAT(shortened, IsOk());
  const auto want_ids = ReadDocs(shortened->shards.at(0)).at(0);
  const auto want_mask = ReadDocs(shortened->shards.at(0) + kLossMaskSuffix).at(0);
  // The three conversations have 48, 83 and 81 tokens; the shortened one
  // has fewer than 64.
  ASSERT_LE(want_ids.size(), 64u);

  options.input_paths = {chat + ".rendered.jsonl"};
  options.max_document_tokens = 64;
  options.output_dir = dir + "/truncate";
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 2u);
  EXPECT_EQ(report->truncated_documents, 1u);
  EXPECT_EQ(report->dropped_documents, 1u);  // conversation 2: one exchange only
  const auto docs = ReadDocs(report->shards.at(0));
  const auto masks = ReadDocs(report->shards.at(0) + kLossMaskSuffix);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1], want_ids);
  EXPECT_EQ(masks[1], want_mask);

  options.long_documents = LongDocumentRule::kDrop;
  options.output_dir = dir + "/drop";
  report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->dropped_documents, 2u);
  EXPECT_EQ(report->documents, 1u);

  // Without "turns" a conversation cannot be cut between turns: dropped.
  std::string no_turns;
  for (nlohmann::json line : ReadJsonl(chat + ".rendered.jsonl")) {
    line.erase("turns");
    no_turns += line.dump() + "\n";
  }
  WriteFile(dir + "/no_turns.jsonl", no_turns);
  options.input_paths = {dir + "/no_turns.jsonl"};
  options.long_documents = LongDocumentRule::kTruncate;
  options.output_dir = dir + "/no_turns";
  report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 1u);
  EXPECT_EQ(report->truncated_documents, 0u);
  EXPECT_EQ(report->dropped_documents, 2u);
}

// A conversation with no answer trains on nothing: left out and counted,
// and a file of only such conversations is refused (it used to write an
// all-zero mask under "masked": true).
TEST(TextCorpusChatTest, ConversationsWithoutAnswersAreLeftOutAndCounted) {
  const std::string fixture = "tests/testdata/tokenizers/qwen2-bpe";
  const std::string dir = testing::MakeTempDir("text_corpus_chat_untrained");
  WriteFile(dir + "/chat.jsonl",
            R"({"text": "<|im_start|>user\nhi<|im_end|>\n", "assistant_spans": []})"
            "\n"
            R"({"text": "<|im_start|>assistant\nhello<|im_end|>\n", "assistant_spans": [[22, 37]]})"
            "\n");
  TokenizeOptions options;
  options.input_paths = {dir + "/chat.jsonl"};
  options.format = CorpusFormat::kChatJsonl;
  options.tokenizer_model = fixture;
  options.output_dir = dir + "/out";
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->documents, 1u);
  EXPECT_EQ(report->untrained_documents, 1u);
  const auto masks = ReadDocs(report->shards.at(0) + kLossMaskSuffix);
  ASSERT_EQ(masks.size(), 1u);
  uint64_t trained = 0;
  for (int32_t m : masks[0]) trained += m;
  EXPECT_GT(trained, 0u);
  EXPECT_EQ(report->trained_tokens, trained);
  absl::StatusOr<TokenizeReport> read = ReadTokenizeReport(dir + "/out");
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->untrained_documents, 1u);
  EXPECT_EQ(read->trained_tokens, trained);

  WriteFile(dir + "/none.jsonl",
            R"({"text": "<|im_start|>user\nhi<|im_end|>\n", "assistant_spans": []})"
            "\n");
  options.input_paths = {dir + "/none.jsonl"};
  options.output_dir = dir + "/none";
  EXPECT_THAT(TokenizeToShards(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no document with trained tokens"),
                             HasSubstr("1 with no trained token"))));
}

// SFT examples whose head (kept by truncation) has no trained token are left
// out and counted too.
TEST(TextCorpusSftTest, TruncationThatLeavesNoTrainedTokenIsCounted) {
  const std::string dir = testing::MakeTempDir("text_corpus_test");
  const std::string input = dir + "/sft.jsonl";
  WriteFile(input,
            "{\"input_ids\": [5, 6, 7, 8], \"labels\": [-100, -100, 7, 8]}\n"
            "{\"input_ids\": [9, 10], \"loss_mask\": [0, 1]}\n");
  TokenizeOptions options = SftOptions(input, dir + "/out");
  options.max_document_tokens = 2;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->truncated_documents, 1u);
  EXPECT_EQ(report->untrained_documents, 1u);
  EXPECT_EQ(report->documents, 1u);
  EXPECT_EQ(report->trained_tokens, 1u);
}

// --vocab_size is the model's: written into the headers, and a tokenizer
// with more ids is refused (it used to be ignored for text).
TEST(TextCorpusHfTest, VocabSizeIsWrittenAndCheckedAgainstTheTokenizer) {
  const std::string fixture = "tests/testdata/tokenizers/llama3-bpe";
  const std::string dir = testing::MakeTempDir("text_corpus_vocab");
  WriteFile(dir + "/in.txt", "some text\n");
  TokenizeOptions options;
  options.input_paths = {dir + "/in.txt"};
  options.tokenizer_model = fixture;
  options.output_dir = dir + "/small";
  options.vocab_size = 512;
  EXPECT_THAT(TokenizeToShards(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("vocab_size: 512 but the tokenizer"), HasSubstr(fixture))));
  options.vocab_size = 70000;
  options.output_dir = dir + "/large";
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(options);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->vocab_size, 70000);
  absl::StatusOr<TokenShardReader> reader = TokenShardReader::Open(report->shards.at(0));
  ASSERT_THAT(reader, IsOk());
  EXPECT_EQ(reader->vocab_size(), 70000u);
}

// Chat or SFT data given as text: the message names what it is and the fix,
// in TokenizeToShards and in the submit-time look at the file's head.
TEST(TextCorpusHfTest, OtherFormatsGivenAsTextNameTheFix) {
  const std::string fixture = "tests/testdata/tokenizers/llama3-bpe";
  const std::string dir = testing::MakeTempDir("text_corpus_formats");
  const std::string chat = dir + "/chat.jsonl";
  WriteFile(chat, "\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  TokenizeOptions options;
  options.input_paths = {chat};
  options.tokenizer_model = fixture;
  options.output_dir = dir + "/out";
  EXPECT_THAT(TokenizeToShards(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("chat.jsonl:2: this is chat data"),
                             HasSubstr("megatrain_client.chat_template"))));
  EXPECT_THAT(
      CheckTextInputHead(chat, "text"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("chat.jsonl:2: this is chat data"), HasSubstr("--format chat"))));
  WriteFile(dir + "/sft.jsonl", "{\"input_ids\": [1, 2]}\n");
  EXPECT_THAT(CheckTextInputHead(dir + "/sft.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--format sft")));
  WriteFile(dir + "/other.jsonl", "{\"body\": \"x\"}\n");
  EXPECT_THAT(
      CheckTextInputHead(dir + "/other.jsonl", "text"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("other.jsonl:1: field \"text\" (the document's text) is missing")));
  WriteFile(dir + "/empty.txt", "");
  EXPECT_THAT(CheckTextInputHead(dir + "/empty.txt", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty.txt: is empty")));
  WriteFile(dir + "/blank.jsonl", "\n  \n");
  EXPECT_THAT(CheckTextInputHead(dir + "/blank.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only blank lines")));
  WriteFile(dir + "/good.jsonl", "{\"text\": \"hello\"}\n");
  EXPECT_THAT(CheckTextInputHead(dir + "/good.jsonl", "text"), IsOk());
  EXPECT_THAT(CheckTextInputHead(dir + "/missing.txt", "text"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

}  // namespace
}  // namespace megatrain::engine
