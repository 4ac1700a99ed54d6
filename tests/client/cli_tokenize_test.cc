// client/cli.h TokenizeArguments: `megatrain [global flags] tokenize ...`
// hands every word after `tokenize` to megatrain-tokenize, unparsed, with
// or without global flags before it; other commands are not taken.
#include <optional>
#include <string>
#include <vector>

#include "client/cli.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

std::optional<std::vector<std::string>> Parse(std::vector<const char*> words) {
  words.insert(words.begin(), "megatrain");
  return TokenizeArguments(static_cast<int>(words.size()), words.data());
}

using Words = std::vector<std::string>;

TEST(TokenizeArgumentsTest, TakesEveryWordAfterTokenize) {
  EXPECT_EQ(Parse({"tokenize", "a.jsonl", "--tokenizer", "t", "--out", "o"}),
            (Words{"a.jsonl", "--tokenizer", "t", "--out", "o"}));
  EXPECT_EQ(Parse({"tokenize"}), Words{});
}

TEST(TokenizeArgumentsTest, AcceptsGlobalFlagsBeforeTheWord) {
  EXPECT_EQ(Parse({"--server", "h:1", "--json", "tokenize", "a.jsonl", "--out", "o"}),
            (Words{"a.jsonl", "--out", "o"}));
  EXPECT_EQ(Parse({"--server=h:1", "--timeout", "5", "tokenize", "--help"}), Words{"--help"});
}

TEST(TokenizeArgumentsTest, LeavesFlagsAfterTheWordToTheTool) {
  // --json and --server after the word are megatrain-tokenize's to accept
  // or refuse, not the client's.
  EXPECT_EQ(Parse({"tokenize", "--json", "--server", "x", "a.txt"}),
            (Words{"--json", "--server", "x", "a.txt"}));
}

TEST(TokenizeArgumentsTest, OtherCommandsAndBadFlagsAreNotTaken) {
  EXPECT_EQ(Parse({"list"}), std::nullopt);
  EXPECT_EQ(Parse({"--server", "h:1", "submit", "tokenize"}), std::nullopt);
  EXPECT_EQ(Parse({"tokenizex", "a"}), std::nullopt);
  EXPECT_EQ(Parse({"--bogus", "tokenize"}), std::nullopt);
  EXPECT_EQ(Parse({"--help"}), std::nullopt);
  EXPECT_EQ(Parse({}), std::nullopt);
}

}  // namespace
}  // namespace megatrain::client
