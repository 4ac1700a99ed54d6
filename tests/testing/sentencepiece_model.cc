// Trains the tiny SentencePiece model of sentencepiece_model.h with spm_train.
#include "tests/testing/sentencepiece_model.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace megatrain::testing {

namespace {

constexpr const char* kWords[] = {
    "the",    "a",       "model",  "learns", "from",  "data",    "every",  "step",
    "small",  "large",   "token",  "window", "shard", "batch",   "loss",   "falls",
    "slowly", "quickly", "and",    "then",   "we",    "save",    "it",     "again",
    "on",     "host",    "memory", "while",  "gpu",   "streams", "layers", "in",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

}  // namespace

std::string TinyCorpusSentence(int index) {
  // A linear congruential sequence (Knuth's MMIX constants): the same words
  // for the same index on every platform.
  uint64_t state = 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(index);
  std::string sentence;
  const int length = 4 + index % 9;
  for (int word_idx = 0; word_idx < length; ++word_idx) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    if (word_idx > 0) sentence.push_back(' ');
    sentence += kWords[(state >> 33) % kNumWords];
  }
  sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
  sentence.push_back('.');
  return sentence;
}

absl::StatusOr<std::string> TrainTinySentencePieceModel(const std::string& dir, int vocab_size) {
  const std::string corpus = dir + "/spm_corpus.txt";
  {
    std::ofstream out(corpus, std::ios::trunc);
    for (int index = 0; index < 2000; ++index) {
      out << TinyCorpusSentence(index) << '\n';
    }
    if (!out.good()) {
      return absl::InternalError(absl::StrCat(corpus, ": cannot write"));
    }
  }
  const std::string prefix = dir + "/spm";
  std::vector<std::string> args = {
      "spm_train",
      "--input=" + corpus,
      "--model_prefix=" + prefix,
      absl::StrCat("--vocab_size=", vocab_size),
      "--model_type=bpe",
      "--character_coverage=1.0",
      "--num_threads=1",
      "--minloglevel=2",
  };
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // spm_train logs to stderr; keep it (the test log shows it on failure).
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, "spm_train", nullptr, nullptr, argv.data(), environ);
  if (spawn_error == ENOENT) {
    return absl::NotFoundError(
        "spm_train not found on PATH (Debian package `sentencepiece`, "
        "installed by deploy/install-deps.sh)");
  }
  if (spawn_error != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawnp spm_train: ", std::strerror(spawn_error)));
  }
  int wait_status = 0;
  if (::waitpid(pid, &wait_status, 0) != pid) {
    return absl::InternalError(absl::StrCat("waitpid spm_train: ", std::strerror(errno)));
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(absl::StrCat("spm_train failed (wait status ", wait_status, ")"));
  }
  return prefix + ".model";
}

const absl::StatusOr<std::string>& SharedTinySentencePieceModel() {
  static const absl::StatusOr<std::string>* const model =
      new absl::StatusOr<std::string>(TrainTinySentencePieceModel(MakeTempDir("tiny_spm"), 100));
  return *model;
}

}  // namespace megatrain::testing
