// A Hugging Face `tokenizer.json` tokenizer, reimplemented in C++ so that the
// engine tokenizes a model directory's text exactly as the `tokenizers`
// library does (same ids, bit for bit), without Python.
//
// Supported (docs/data-format.md, "Hugging Face tokenizers"): the BPE model
// (byte-level as in Llama 3, Qwen2/3, GPT-OSS; SentencePiece-style with
// byte fallback and <unk> as in Llama 2 and Mistral), added and special
// tokens, the normalizers NFC / NFD / NFKC / NFKD / Prepend / Replace /
// Sequence, the pre-tokenizers Split (PCRE2 regexes with Unicode
// properties) / ByteLevel / Metaspace / Sequence, the post-processors
// TemplateProcessing / ByteLevel / Sequence, and the decoders ByteLevel /
// Metaspace / Replace / ByteFallback / Fuse / Strip / Sequence. Anything
// else is refused at Load() naming the field. BOS, EOS, PAD and UNK come from
// `tokenizer_config.json` beside the file when present.
//
// The reference for every rule is tokenizers 0.23 (src/tokenizer/
// added_vocabulary.rs, normalizers/, pre_tokenizers/, models/bpe/,
// processors/template.rs, decoders/); tests/engine/tokenizer/hf_tokenizer_test.cc
// checks every fixture in tests/testdata/tokenizers/.
#ifndef MEGATRAIN_ENGINE_HF_TOKENIZER_H_
#define MEGATRAIN_ENGINE_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// A loaded tokenizer.json (and tokenizer_config.json).
//
// Ownership and lifetime: copies share one immutable state (the files are
// read once by Load() and may then change or vanish).
//
// Thread-safety: immutable after Load(); Encode() and Decode() are const and
// may run concurrently (each call owns its regex match state).
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(HfTokenizer tokenizer,
//                              HfTokenizer::Load("models/Llama-3.2-1B"));
//   MEGATRAIN_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
//                              tokenizer.Encode("Hello world."));
class HfTokenizer {
 public:
  // Loads `path`: a directory holding tokenizer.json (and optionally
  // tokenizer_config.json), or a tokenizer.json file (tokenizer_config.json
  // is then read from the same directory when present).
  // Errors: NOT_FOUND when there is no tokenizer.json; INVALID_ARGUMENT for
  // a file over 1 GiB, invalid JSON, or a field of the wrong type or value
  // (named: "model.merges[12]", "tokenizer_config.json: eos_token"...);
  // UNIMPLEMENTED for a model, normalizer, pre-tokenizer, post-processor or
  // decoder type this reimplementation does not have, naming the field and
  // the type ("model.type: 'Unigram' is not supported"). Messages start with
  // the file's path.
  static absl::StatusOr<HfTokenizer> Load(const std::string& path);

  // Same as Load() from the files' contents; `config_json` may be empty (no
  // tokenizer_config.json). `source` names the files in messages.
  static absl::StatusOr<HfTokenizer> FromJson(absl::string_view tokenizer_json,
                                              absl::string_view config_json,
                                              const std::string& source);

  // True when `path` names something Load() takes: a directory with a
  // tokenizer.json, or a file whose name ends in ".json".
  static bool LooksLikeHfTokenizer(const std::string& path);

  // Token ids of `text` (UTF-8), as tokenizers' `Tokenizer.encode(text,
  // add_special_tokens)`: added tokens in the text (e.g. "<|eot_id|>") map
  // to their ids; add_special_tokens applies the post-processor's template
  // (e.g. a leading BOS). Every id is in [0, vocab_size()).
  // Errors: INVALID_ARGUMENT when `text` is not valid UTF-8 (with the byte
  // offset); INTERNAL if the regex engine fails (a bug).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = false) const;

  // Ids with the byte span of `text` each comes from (Note [Offsets] in
  // hf_tokenizer.cc; as tokenizers' offsets, in bytes): spans[i] = [first,
  // end) for ids[i]; (0, 0) for the post-processor's special tokens.
  struct Encoding {
    std::vector<int32_t> ids;
    std::vector<std::pair<size_t, size_t>> spans;
  };
  // Encode() with spans; same errors.
  absl::StatusOr<Encoding> EncodeWithOffsets(absl::string_view text,
                                             bool add_special_tokens = false) const;

  // The text of `ids`, as tokenizers' `Tokenizer.decode(ids,
  // skip_special_tokens)`. Errors: OUT_OF_RANGE for an id without a token.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // The id of `token` (model vocabulary or added token), if any.
  std::optional<int32_t> TokenToId(absl::string_view token) const;

  // One more than the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  // From tokenizer_config.json (bos_token, eos_token, pad_token,
  // unk_token); -1 when absent or null. unk falls back to model.unk_token.
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  // The path given to Load() (or `source`).
  const std::string& path() const;

  struct Impl;  // defined in hf_tokenizer.cc

 private:
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_HF_TOKENIZER_H_
