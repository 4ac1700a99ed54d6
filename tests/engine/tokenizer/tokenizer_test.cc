// Tests of engine/tokenizer/tokenizer.h against a tiny SentencePiece model trained in
// the test's temp dir: round trips, special ids, and the load errors. The
// test binary links LibTorch, hence libprotobuf: passing at all shows the
// SentencePiece module keeps the two protobuf copies apart.
#include "engine/tokenizer/tokenizer.h"

#include <stdlib.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

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
using ::testing::Each;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Lt;

class TokenizerTest : public ::testing::Test {
 protected:
  // One model for the process (testing::SharedTinySentencePieceModel).
  void SetUp() override {
    const absl::StatusOr<std::string>& path = testing::SharedTinySentencePieceModel();
    ASSERT_THAT(path, IsOk());
    model_path_ = *path;
    const absl::Status status = Tokenizer::Load(model_path_).status();
    if (status.code() == absl::StatusCode::kUnimplemented) {
      GTEST_SKIP() << status;  // ASan/TSan build: no RTLD_DEEPBIND
    }
  }

  std::string model_path_;
};

TEST_F(TokenizerTest, EncodeDecodeRoundTrips) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_path_);
  ASSERT_THAT(tokenizer, IsOk());
  EXPECT_EQ(tokenizer->vocab_size(), 100);
  EXPECT_EQ(tokenizer->path(), model_path_);
  for (int index = 0; index < 20; ++index) {
    const std::string text = TinyCorpusSentence(index);
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
    ASSERT_THAT(ids, IsOk());
    ASSERT_FALSE(ids->empty()) << text;
    EXPECT_THAT(*ids, Each(::testing::AllOf(Ge(0), Lt(100))));
    // Every character of the corpus is covered (character_coverage 1.0),
    // so no id is unk and decoding restores the text exactly.
    EXPECT_THAT(*ids, Each(::testing::Ne(tokenizer->unk_id())));
    absl::StatusOr<std::string> decoded = tokenizer->Decode(*ids);
    ASSERT_THAT(decoded, IsOk());
    EXPECT_EQ(*decoded, text);
  }
  // The same text gives the same ids.
  EXPECT_EQ(*tokenizer->Encode("the model learns"), *tokenizer->Encode("the model learns"));
}

TEST_F(TokenizerTest, ReportsSentencePieceDefaultSpecialIds) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_path_);
  ASSERT_THAT(tokenizer, IsOk());
  EXPECT_EQ(tokenizer->unk_id(), 0);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->pad_id(), -1);
}

TEST_F(TokenizerTest, EncodeIsSafeFromSeveralThreads) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_path_);
  ASSERT_THAT(tokenizer, IsOk());
  const std::string text = TinyCorpusSentence(3);
  const std::vector<int32_t> expected = *tokenizer->Encode(text);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (size_t thread_idx = 0; thread_idx < results.size(); ++thread_idx) {
    threads.emplace_back([&, thread_idx] {
      for (int rep = 0; rep < 200; ++rep) {
        results[thread_idx] = *tokenizer->Encode(text);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST_F(TokenizerTest, DecodeRejectsOutOfRangeIds) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_path_);
  ASSERT_THAT(tokenizer, IsOk());
  const std::vector<int32_t> ids = {5, 100};
  EXPECT_THAT(tokenizer->Decode(ids),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("id 100 at position 1 is outside [0, 100)")));
}

TEST(TokenizerLoadTest, MissingFileIsNotFound) {
  const std::string path = testing::MakeTempDir("tokenizer_test") + "/missing.model";
  EXPECT_THAT(Tokenizer::Load(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(TokenizerLoadTest, NotAModelIsInvalidArgument) {
  const std::string path = testing::MakeTempDir("tokenizer_test") + "/garbage.model";
  std::ofstream(path) << "this is not a protobuf";
  if (Tokenizer::Load(path).status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "ASan/TSan build: no SentencePiece module";
  }
  EXPECT_THAT(Tokenizer::Load(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr(path), HasSubstr("not a valid SentencePiece "
                                                                   "model"))));
}

// A directory is a HF model directory: without tokenizer.json it is
// NOT_FOUND, naming the file.
TEST(TokenizerLoadTest, DirectoryWithoutTokenizerJsonIsNotFound) {
  const std::string dir = testing::MakeTempDir("tokenizer_test");
  EXPECT_THAT(Tokenizer::Load(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr(dir), HasSubstr("tokenizer.json"))));
}

// A HF directory or its tokenizer.json loads the HF tokenizer (no
// SentencePiece module needed, so this runs in sanitizer builds too): the
// ids are those of the `tokenizers` library (fixture), from several threads
// at once (each thread has its own word cache).
TEST(TokenizerLoadTest, HfDirectoryAndFileGiveTokenizersIds) {
  const std::string fixture = "tests/testdata/tokenizers/qwen2-bpe";
  std::ifstream in(fixture + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  for (const std::string& path : {fixture, fixture + "/tokenizer.json"}) {
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path);
    ASSERT_THAT(tokenizer, IsOk());
    EXPECT_EQ(tokenizer->vocab_size(), 2000);
    EXPECT_EQ(tokenizer->eos_id(), 2);   // <|im_end|>
    EXPECT_EQ(tokenizer->pad_id(), 0);   // <|endoftext|>
    EXPECT_EQ(tokenizer->bos_id(), -1);  // null in tokenizer_config.json
    std::vector<std::thread> threads;
    std::vector<int> mismatches(4, 0);
    for (size_t thread_idx = 0; thread_idx < mismatches.size(); ++thread_idx) {
      threads.emplace_back([&, thread_idx] {
        for (const auto& c : expected.at("cases")) {
          absl::StatusOr<std::vector<int32_t>> ids =
              tokenizer->Encode(c.at("text").get<std::string>());
          if (!ids.ok() || *ids != c.at("ids").get<std::vector<int32_t>>()) {
            ++mismatches[thread_idx];
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_THAT(mismatches, ::testing::Each(0)) << path;
  }
}

}  // namespace
}  // namespace megatrain::engine
