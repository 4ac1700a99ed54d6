// Test helper: trains a tiny SentencePiece model on generated English-like
// text, so tokenizer tests need no model file in the repository.
#ifndef MEGATRAIN_TESTS_TESTING_SENTENCEPIECE_MODEL_H_
#define MEGATRAIN_TESTS_TESTING_SENTENCEPIECE_MODEL_H_

#include <string>

#include "absl/status/statusor.h"

namespace megatrain::testing {

// Writes a small corpus (2000 sentences from a fixed word list, fixed
// sequence) to `dir`/spm_corpus.txt and trains a BPE model of `vocab_size`
// pieces on it with Debian's `spm_train` (package `sentencepiece`; run as a
// child process, because libsentencepiece cannot share a process with
// LibTorch's libprotobuf: Note [SentencePiece module] in
// engine/tokenizer/tokenizer.cc). One thread, so the model is the same on every run.
// Ids: unk 0, bos 1, eos 2, no pad. Returns the `.model` path. Takes well
// under a second.
// Errors: NOT_FOUND when spm_train is not on PATH; INTERNAL when it fails.
absl::StatusOr<std::string> TrainTinySentencePieceModel(const std::string& dir,
                                                        int vocab_size = 100);

// The path of one vocab-100 model trained (as above) in a temporary
// directory on the first call and shared by every later call of the
// process, so test suites need not train their own. Thread-safe.
const absl::StatusOr<std::string>& SharedTinySentencePieceModel();

// Sentence `index` of that corpus (for round-trip tests).
std::string TinyCorpusSentence(int index);

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_SENTENCEPIECE_MODEL_H_
