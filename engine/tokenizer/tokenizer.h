// The engine's tokenizer: a Hugging Face tokenizer.json (a model directory
// or the file; engine/tokenizer/hf_tokenizer.h, exact to the `tokenizers` library) or
// a SentencePiece model (Debian's libsentencepiece): load, encode text to
// token ids, decode ids back.
//
// Why a wrapper: SentencePiece cannot be linked into a program that also
// loads libprotobuf (LibTorch, gRPC), so it lives in a module opened with
// dlopen (Note [SentencePiece module] in tokenizer.cc); the rest of the
// engine sees absl::Status and no SentencePiece type.
#ifndef MEGATRAIN_ENGINE_TOKENIZER_H_
#define MEGATRAIN_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace megatrain::engine {

class HfTokenizer;  // engine/tokenizer/hf_tokenizer.h

// A loaded HF tokenizer.json or SentencePiece model.
//
// Ownership and lifetime: move-only; owns the model in memory (the file is
// read once by Load() and may then change or vanish). The SentencePiece
// module, once loaded, stays loaded for the life of the process.
//
// Thread-safety: immutable after Load(); Encode() and Decode() are const
// and may run concurrently (SentencePieceProcessor's encoding is const and
// keeps no per-call state).
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(Tokenizer tokenizer,
//                              Tokenizer::Load("models/Llama-3.2-1B"));
//   MEGATRAIN_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
//                              tokenizer.Encode("Hello world."));
class Tokenizer {
 public:
  // A directory or a file named *.json is a Hugging Face tokenizer: the
  // directory's tokenizer.json (and tokenizer_config.json for BOS / EOS /
  // PAD / UNK), with HfTokenizer::Load()'s errors (NOT_FOUND without
  // tokenizer.json; UNIMPLEMENTED for a type it does not have, naming the
  // field). Encode() adds no special tokens (the text corpus adds BOS /
  // EOS itself).
  // Anything else is a SentencePiece model file (loading the SentencePiece
  // module on first use; see ModuleSearchPath()).
  // Errors: NOT_FOUND when the file does not exist; INVALID_ARGUMENT when it
  // is not a regular file or not a SentencePiece model; others from the file
  // system. Messages start with `model_path`. FAILED_PRECONDITION when the
  // module libmegatrain_sentencepiece.so is not installed or fails to load;
  // UNIMPLEMENTED in ASan/TSan builds, whose runtimes refuse the
  // RTLD_DEEPBIND the module needs.
  static absl::StatusOr<Tokenizer> Load(const std::string& model_path);

  // Where Load() looks for libmegatrain_sentencepiece.so, in order: the
  // environment variable MEGATRAIN_SENTENCEPIECE_MODULE (alone, when set);
  // else next to the running executable, in `<executable dir>/../lib`, and
  // in the build tree that compiled the engine.
  static std::vector<std::string> ModuleSearchPath();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text` (UTF-8), each in [0, vocab_size()); no BOS or EOS is
  // added. Text the model cannot represent maps to unk_id().
  // Errors: INTERNAL if SentencePiece fails (it does not for a loaded
  // model).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // Encode() with the byte span of `text` each id comes from (HF
  // tokenizers only: Note [Offsets] in hf_tokenizer.cc). Errors:
  // UNIMPLEMENTED for a SentencePiece model; else Encode()'s.
  absl::Status EncodeWithSpans(absl::string_view text, std::vector<int32_t>* ids,
                               std::vector<std::pair<size_t, size_t>>* spans) const;

  // The text of `ids`. Errors: OUT_OF_RANGE for an id outside
  // [0, vocab_size()); INTERNAL if SentencePiece fails.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // Number of pieces: ids are in [0, vocab_size()).
  int64_t vocab_size() const { return vocab_size_; }
  // Id of the end-of-sentence piece; -1 when the model has none.
  int32_t eos_id() const { return eos_id_; }
  // Id of the beginning-of-sentence piece; -1 when the model has none.
  int32_t bos_id() const { return bos_id_; }
  // Id of the unknown piece; -1 when the model has none.
  int32_t unk_id() const { return unk_id_; }
  // Id of the padding piece; -1 when the model has none (SentencePiece's
  // default).
  int32_t pad_id() const { return pad_id_; }
  // The path given to Load().
  const std::string& path() const { return path_; }

 private:
  // Frees a processor of the module.
  struct ProcessorDeleter {
    void operator()(void* processor) const;
  };

  Tokenizer() = default;

  std::string path_;
  std::unique_ptr<void, ProcessorDeleter> processor_;  // module-owned type
  // Set for a HF tokenizer (then no processor_); immutable, so shared by
  // moves. A pointer keeps hf_tokenizer.h out of this header.
  std::shared_ptr<const HfTokenizer> hf_;
  int64_t vocab_size_ = 0;
  int32_t unk_id_ = -1;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TOKENIZER_H_
