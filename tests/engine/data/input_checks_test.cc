// engine/data/input_checks.h: the header-only checks behind Note [Submit
// checks] (server/core/submit_checks.h), on shards written by
// TokenShardWriter and on transformers' tiny Llama (tests/testdata/hf/llama).
#include "engine/data/input_checks.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/formats/hf_model.h"
#include "engine/data/token_shard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// Writes a shard of `documents` to `path` with `vocab_size` in its header.
void WriteShard(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                uint64_t vocab_size) {
  absl::StatusOr<TokenShardWriter> writer =
      TokenShardWriter::Create(path, {.vocab_size = vocab_size});
  ASSERT_THAT(writer.status(), IsOk());
  for (const auto& document : documents) ASSERT_THAT(writer->AppendDocument(document), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
}

TEST(InputChecksTest, ReadsTheHeadersOfAFileAndOfADirectory) {
  const std::string dir = megatrain::testing::MakeTempDir("input-checks");
  WriteShard(dir + "/a-00000.mtt", {{1, 2, 3}, {4, 5}}, 32000);
  WriteShard(dir + "/a-00001.mtt", {{6}}, 32000);
  std::ofstream(dir + "/README") << "not a shard\n";
  absl::StatusOr<std::vector<TokenShardHeaderFacts>> all = ReadTokenShardHeaders(dir);
  ASSERT_THAT(all.status(), IsOk());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].path, dir + "/a-00000.mtt");
  EXPECT_EQ((*all)[0].vocab_size, 32000u);
  EXPECT_EQ((*all)[0].num_tokens, 5u);
  EXPECT_EQ((*all)[0].num_documents, 2u);
  EXPECT_EQ((*all)[1].num_tokens, 1u);
  absl::StatusOr<std::vector<TokenShardHeaderFacts>> one =
      ReadTokenShardHeaders(dir + "/a-00001.mtt");
  ASSERT_THAT(one.status(), IsOk());
  EXPECT_EQ(one->size(), 1u);
}

TEST(InputChecksTest, TruncatedCorruptMissingAndEmptyAreRefused) {
  const std::string dir = megatrain::testing::MakeTempDir("input-checks");
  const std::string shard = dir + "/x.mtt";
  WriteShard(shard, {{1, 2, 3, 4, 5, 6}}, 100);
  fs::resize_file(shard, fs::file_size(shard) - 2);
  EXPECT_THAT(ReadTokenShardHeaders(shard),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated copy?")));
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(20);
    file.put('\x7f');  // inside vocab_size: the header checksum no longer matches
  }
  EXPECT_THAT(ReadTokenShardHeaders(shard),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header checksum mismatch")));
  std::ofstream(dir + "/y.mtt") << "MTTOKSH";
  EXPECT_THAT(ReadTokenShardHeaders(dir + "/y.mtt"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shorter than the 64-byte header")));
  EXPECT_THAT(ReadTokenShardHeaders(dir + "/missing"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file or directory")));
  const std::string empty = megatrain::testing::MakeTempDir("input-checks-empty");
  EXPECT_THAT(ReadTokenShardHeaders(empty),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no *.mtt")));
}

TEST(InputChecksTest, SafetensorsHeadersAndTheEmbeddingShapeAgainstConfig) {
  const std::string source = std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/llama";
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_THAT(CheckHfWeightHeaders(source, *config), IsOk());

  ModelConfig other = *config;
  other.vocab_size += 1;
  EXPECT_THAT(CheckHfWeightHeaders(source, other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'model.embed_tokens.weight' has shape")));

  const std::string copy = megatrain::testing::MakeTempDir("input-checks-hf");
  fs::copy_file(source + "/config.json", copy + "/config.json");
  fs::copy_file(source + "/model.safetensors", copy + "/model.safetensors");
  fs::resize_file(copy + "/model.safetensors", fs::file_size(copy + "/model.safetensors") - 100);
  EXPECT_THAT(CheckHfWeightHeaders(copy, *config),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  fs::remove(copy + "/model.safetensors");
  EXPECT_THAT(CheckHfWeightHeaders(copy, *config),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

// Note [Data checks at submit]: every problem of a job's data at once, each
// naming its field.
TEST(DataInputsCheckTest, EveryProblemIsReportedAtOnceNamingItsField) {
  const std::string dir = megatrain::testing::MakeTempDir("data-checks");
  std::ofstream(dir + "/empty.txt").flush();
  fs::create_directories(dir + "/model");  // no tokenizer.json
  // data.tokens: a shard whose loss mask is all 0 (no tokenize.json).
  fs::create_directories(dir + "/tokens");
  WriteShard(dir + "/tokens/train-00000.mtt", {{5, 6, 7}}, 100);
  WriteShard(dir + "/tokens/train-00000.mtt.mask", {{0, 0, 0}}, 2);
  // data.eval_tokens: a tokenize.json that counts no trained token.
  fs::create_directories(dir + "/eval");
  WriteShard(dir + "/eval/train-00000.mtt", {{5, 6}}, 100);
  std::ofstream(dir + "/eval/tokenize.json")
      << R"({"format": "megatrain-tokenize-report", "version": 2, "documents": 1, "tokens": 2,
            "trained_tokens": 0, "eval_documents": 0, "eval_tokens": 0,
            "eval_trained_tokens": 0, "untrained_documents": 0, "eos_id": 1, "masked": true,
            "max_document_tokens": 0, "long_documents": "truncate",
            "truncated_documents": 0, "dropped_documents": 0})";
  DataInputsToCheck inputs;
  inputs.text = dir + "/empty.txt";
  inputs.tokenizer = dir + "/model";
  inputs.tokenizer_field = "model.hf_dir";
  inputs.tokens = dir + "/tokens";
  inputs.eval_tokens = dir + "/eval";
  inputs.model_vocab_size = 100;
  const absl::Status status = CheckDataInputs(inputs);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               HasSubstr("data.text: " + dir + "/empty.txt: is empty")));
  EXPECT_THAT(status.message(), HasSubstr("model.hf_dir: "));
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.json"));
  EXPECT_THAT(status.message(), HasSubstr("set data.tokenizer"));
  EXPECT_THAT(status.message(),
              HasSubstr("data.tokens: " + dir + "/tokens: no trained token (every loss-mask"));
  EXPECT_THAT(status.message(),
              HasSubstr("data.eval_tokens: " + dir + "/eval/tokenize.json: no trained token"));
}

TEST(DataInputsCheckTest, TokenizerWithMoreIdsThanTheModelIsRefused) {
  const std::string dir = megatrain::testing::MakeTempDir("data-checks-vocab");
  std::ofstream(dir + "/in.txt") << "some text\n";
  DataInputsToCheck inputs;
  inputs.text = dir + "/in.txt";
  // A model directory's tokenizer.json (the fixture has 2000 ids).
  inputs.tokenizer = std::string(MEGATRAIN_TESTDATA_DIR) + "/tokenizers/llama3-bpe";
  inputs.tokenizer_field = "data.tokenizer";
  inputs.model_vocab_size = 100;
  EXPECT_THAT(CheckDataInputs(inputs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokenizer: " + inputs.tokenizer +
                                 " has 2000 ids, more than the model's vocab_size 100")));
  inputs.model_vocab_size = 2048;
  EXPECT_THAT(CheckDataInputs(inputs), IsOk());
}

TEST(DataInputsCheckTest, MasksWithATrainedTokenAndUnmaskedShardsPass) {
  const std::string dir = megatrain::testing::MakeTempDir("data-checks-ok");
  WriteShard(dir + "/a-00000.mtt", {{5, 6, 7}}, 100);
  WriteShard(dir + "/a-00000.mtt.mask", {{0, 0, 0}}, 2);
  WriteShard(dir + "/a-00001.mtt", {{5, 6}}, 100);
  WriteShard(dir + "/a-00001.mtt.mask", {{0, 1}}, 2);
  const std::string plain = megatrain::testing::MakeTempDir("data-checks-plain");
  WriteShard(plain + "/a-00000.mtt", {{5, 6, 7}}, 100);
  DataInputsToCheck inputs;
  inputs.tokens = dir;
  inputs.eval_tokens = plain;
  EXPECT_THAT(CheckDataInputs(inputs), IsOk());
  // A single shard file with an all-zero mask beside it.
  inputs.tokens = dir + "/a-00000.mtt";
  EXPECT_THAT(CheckDataInputs(inputs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.tokens: ")));
}

}  // namespace
}  // namespace megatrain::engine
