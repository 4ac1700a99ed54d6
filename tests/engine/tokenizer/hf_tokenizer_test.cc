// HfTokenizer against the `tokenizers` library itself: every case of
// tests/testdata/tokenizers/*/expected.json (hard cases and corpus
// excerpts, written by tests/testdata/make_hf_fixtures.py with tokenizers
// 0.23) must give the same ids bit for bit, with and without the
// post-processor's special tokens, and decode to the same text.
#include "engine/tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// Tests run in the source tree (megatrain_cc_test's WORKING_DIRECTORY).
constexpr char kFixtures[] = "tests/testdata/tokenizers";

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class HfTokenizerFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return std::string(kFixtures) + "/" + GetParam(); }
  nlohmann::json Expected() const {
    return nlohmann::json::parse(ReadText(dir() + "/expected.json"));
  }
};

TEST_P(HfTokenizerFixtureTest, EncodeEqualsTokenizersOnEveryCase) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(dir());
  ASSERT_THAT(tokenizer.status(), IsOk());
  const nlohmann::json expected = Expected();
  ASSERT_GE(expected.at("cases").size(), 30u);
  for (const auto& c : expected.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
    ASSERT_THAT(ids.status(), IsOk()) << text;
    EXPECT_EQ(*ids, c.at("ids").get<std::vector<int32_t>>()) << "text: " << text;
    absl::StatusOr<std::vector<int32_t>> with_special =
        tokenizer->Encode(text, /*add_special_tokens=*/true);
    ASSERT_THAT(with_special.status(), IsOk());
    EXPECT_EQ(*with_special, c.at("ids_with_special").get<std::vector<int32_t>>())
        << "text: " << text;
  }
}

TEST_P(HfTokenizerFixtureTest, DecodeEqualsTokenizersOnEveryCase) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(dir());
  ASSERT_THAT(tokenizer.status(), IsOk());
  // A named copy: the range of a range-for over Expected().at(...) would
  // refer into a destroyed temporary (found by ASan).
  const nlohmann::json expected = Expected();
  for (const auto& c : expected.at("cases")) {
    absl::StatusOr<std::string> text = tokenizer->Decode(c.at("ids").get<std::vector<int32_t>>());
    ASSERT_THAT(text.status(), IsOk());
    EXPECT_EQ(*text, c.at("decoded").get<std::string>()) << "text: " << c.at("text");
  }
}

TEST_P(HfTokenizerFixtureTest, SpecialIdsComeFromTokenizerConfig) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(dir() + "/tokenizer.json");
  ASSERT_THAT(tokenizer.status(), IsOk());
  const nlohmann::json config = nlohmann::json::parse(ReadText(dir() + "/tokenizer_config.json"));
  const auto id_of = [&](const char* key) -> int32_t {
    if (!config.contains(key) || config.at(key).is_null()) return -1;
    return tokenizer->TokenToId(config.at(key).get<std::string>()).value_or(-2);
  };
  EXPECT_EQ(tokenizer->bos_id(), id_of("bos_token"));
  EXPECT_EQ(tokenizer->eos_id(), id_of("eos_token"));
  EXPECT_GE(tokenizer->eos_id(), 0);
  const nlohmann::json j = nlohmann::json::parse(ReadText(dir() + "/tokenizer.json"));
  EXPECT_EQ(tokenizer->vocab_size(), static_cast<int64_t>(j.at("model").at("vocab").size()));
}

INSTANTIATE_TEST_SUITE_P(Families, HfTokenizerFixtureTest,
                         ::testing::Values("llama3-bpe", "qwen2-bpe", "o200k-bpe",
                                           "llama2-spm-legacy", "mistral-spm-metaspace"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// Writes `tokenizer_json` as <dir>/tokenizer.json and loads the directory.
absl::Status LoadJson(const std::string& tokenizer_json) {
  const std::string dir = testing::MakeTempDir("hf_tokenizer");
  testing::WriteFileBytes(dir + "/tokenizer.json", tokenizer_json);
  return HfTokenizer::Load(dir).status();
}

std::string Llama3JsonWith(const std::string& key, const nlohmann::json& value) {
  nlohmann::json j =
      nlohmann::json::parse(ReadText(std::string(kFixtures) + "/llama3-bpe/tokenizer.json"));
  if (key == "model.type")
    j["model"]["type"] = value;
  else
    j[key] = value;
  return j.dump();
}

// Issue 36, Note [Tokenizer id bound]: a ~1 KB tokenizer.json with an id of
// 2^30 is refused naming the token, not a 32 GB id table (std::bad_alloc).
TEST(HfTokenizerTest, IdFarBeyondTheTokenCountIsInvalidArgumentBeforeAllocation) {
  const std::string vocab_id = R"({"model": {"type": "BPE", "merges": [],
      "vocab": {"a": 0, "b": 1, "huge": 1073741824}}})";
  EXPECT_THAT(HfTokenizer::FromJson(vocab_id, "", "tokenizer.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.vocab['huge']: id 1073741824 is beyond the file's 3 "
                                 "tokens (ids must be below 1027")));
  const std::string added_id = R"({"model": {"type": "BPE", "merges": [],
      "vocab": {"a": 0}}, "added_tokens": [{"id": 1073741824, "content": "<x>"}]})";
  EXPECT_THAT(HfTokenizer::FromJson(added_id, "", "tokenizer.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("added_tokens: id 1073741824 of '<x>' is beyond")));
}

TEST(HfTokenizerTest, LoadRefusesOtherModelTypesNamingTheField) {
  EXPECT_THAT(LoadJson(Llama3JsonWith("model.type", "Unigram")),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("model.type: 'Unigram'")));
}

TEST(HfTokenizerTest, LoadRefusesOtherPreTokenizersNamingTheField) {
  EXPECT_THAT(LoadJson(Llama3JsonWith(
                  "pre_tokenizer",
                  {{"type", "Sequence"}, {"pretokenizers", {{{"type", "BertPreTokenizer"}}}}})),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("pre_tokenizer.pretokenizers[0].type: 'BertPreTokenizer'")));
}

TEST(HfTokenizerTest, LoadRefusesOtherNormalizersAndDecoders) {
  EXPECT_THAT(LoadJson(Llama3JsonWith("normalizer", {{"type", "BertNormalizer"}})),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("normalizer.type")));
  EXPECT_THAT(LoadJson(Llama3JsonWith("decoder", {{"type", "WordPiece"}})),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("decoder.type: 'WordPiece'")));
  EXPECT_THAT(LoadJson(Llama3JsonWith("post_processor", {{"type", "RobertaProcessing"}})),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("post_processor.type")));
}

TEST(HfTokenizerTest, LoadRefusesABadRegexNamingTheField) {
  EXPECT_THAT(LoadJson(Llama3JsonWith("pre_tokenizer", {{"type", "Split"},
                                                        {"pattern", {{"Regex", "(unclosed"}}},
                                                        {"behavior", "Isolated"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pre_tokenizer.pattern: regex does not compile")));
}

TEST(HfTokenizerTest, LoadReportsMalformedJsonAndMissingFiles) {
  EXPECT_THAT(LoadJson("{not json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(LoadJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  EXPECT_THAT(HfTokenizer::Load(testing::MakeTempDir("hf_empty")).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tokenizer.json")));
}

TEST(HfTokenizerTest, LoadRefusesAConfigTokenNotInTheVocabulary) {
  const std::string dir = testing::MakeTempDir("hf_config");
  testing::WriteFileBytes(dir + "/tokenizer.json",
                          ReadText(std::string(kFixtures) + "/llama3-bpe/tokenizer.json"));
  testing::WriteFileBytes(dir + "/tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  EXPECT_THAT(HfTokenizer::Load(dir).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer_config.json: eos_token: '<|nope|>'")));
}

// A hostile tokenizer.json cannot stall a job: catastrophic backtracking
// stops at PCRE2's match limit with INVALID_ARGUMENT.
TEST(HfTokenizerTest, CatastrophicRegexIsBoundedAndRefused) {
  const std::string dir = testing::MakeTempDir("hf_redos");
  testing::WriteFileBytes(
      dir + "/tokenizer.json",
      Llama3JsonWith("pre_tokenizer", {{"type", "Split"},
                                       {"pattern", {{"Regex", R"((\p{L}|\p{Ll})+\d)"}}},
                                       {"behavior", "Isolated"}}));
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(dir);
  ASSERT_THAT(tokenizer.status(), IsOk());
  EXPECT_THAT(tokenizer->Encode(std::string(40, 'a')).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("backtracking limit")));
}

TEST(HfTokenizerTest, EncodeRefusesInvalidUtf8AndDecodeUnknownIds) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(std::string(kFixtures) + "/llama3-bpe");
  ASSERT_THAT(tokenizer.status(), IsOk());
  EXPECT_THAT(tokenizer->Encode("ok \xC3\x28").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8 at byte 3")));
  EXPECT_THAT(tokenizer->Decode({1, 1 << 20}).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("id 1048576")));
}

// The word cache (Note [Word cache]) on a real corpus: a second pass, served
// from the cache, gives exactly the ids of the first. Throughput is measured
// by `megatrain tokenize` (it prints MB/s), not here.
TEST(HfTokenizerTest, WarmWordCacheEncodesTheExampleCorpusAsTheColdPass) {
  std::string corpus;
  for (const auto& entry : std::filesystem::directory_iterator("examples/data/corpus")) {
    corpus += ReadText(entry.path().string());
  }
  ASSERT_GT(corpus.size(), 100000u);
  for (const char* name : {"llama3-bpe", "llama2-spm-legacy"}) {
    absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(std::string(kFixtures) + "/" + name);
    ASSERT_THAT(tokenizer.status(), IsOk());
    absl::StatusOr<std::vector<int32_t>> cold = tokenizer->Encode(corpus);
    ASSERT_THAT(cold.status(), IsOk());
    absl::StatusOr<std::vector<int32_t>> warm = tokenizer->Encode(corpus);
    ASSERT_THAT(warm.status(), IsOk());
    EXPECT_GT(cold->size(), corpus.size() / 10) << name;
    EXPECT_EQ(*warm, *cold) << name;
  }
}

}  // namespace
}  // namespace megatrain::engine

namespace megatrain::engine {
namespace {

// EncodeWithOffsets gives Encode's ids, and spans that cut the text into the
// tokens' pieces: for byte-level BPE without a normalizer, the spans of
// consecutive tokens tile the text (a character split over several tokens
// shares its bytes' span).
TEST(HfTokenizerOffsetsTest, SpansTileTheTextAndIdsMatchEncode) {
  absl::StatusOr<HfTokenizer> tokenizer = HfTokenizer::Load(std::string(kFixtures) + "/llama3-bpe");
  ASSERT_THAT(tokenizer.status(), IsOk());
  std::ifstream in(std::string(kFixtures) + "/llama3-bpe/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  for (const auto& c : expected.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    absl::StatusOr<HfTokenizer::Encoding> encoding = tokenizer->EncodeWithOffsets(text);
    ASSERT_THAT(encoding.status(), IsOk());
    EXPECT_EQ(encoding->ids, c.at("ids").get<std::vector<int32_t>>()) << text;
    ASSERT_EQ(encoding->spans.size(), encoding->ids.size());
    size_t covered = 0;  // the text's bytes up to here belong to earlier tokens
    for (const auto& [start, end] : encoding->spans) {
      EXPECT_LE(start, covered) << text;
      EXPECT_LE(end, text.size()) << text;
      covered = std::max(covered, end);
    }
    EXPECT_EQ(covered, text.size()) << text;
  }
}

}  // namespace
}  // namespace megatrain::engine
