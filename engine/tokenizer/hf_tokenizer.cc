// HfTokenizer: tokenizer.json read into plain tables, then the `tokenizers`
// pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE ->
// post-processor) rule for rule.
//
// Note [Regexes: PCRE2]
// tokenizers matches Split patterns with Oniguruma. We use Debian's PCRE2
// (libpcre2-8) in UTF + UCP mode, JIT-compiled: it reads UTF-8 directly
// (offsets are byte offsets, like Rust's), and has the constructs the
// families' patterns use: \p{L} \p{N} \p{Lu}... Unicode properties,
// (?i:...) groups and (?!\S) look-ahead; with UCP, \s is Unicode white space
// as in Oniguruma. ICU's regex works on UTF-16 and would need offset maps.
//
// Note [Normalization: ICU]
// The NF* normalizers use ICU's unorm2 (libicu); ASCII text is invariant
// under all four forms and skips the conversion.
#include "engine/tokenizer/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/escape.h"
#include "engine/fs/dir_fd.h"
#include "engine/runtime/status_macros.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A tokenizer.json above this is refused (the largest released ones, with
// 200k-token vocabularies, are ~30 MB).
constexpr uintmax_t kMaxTokenizerFileBytes = uintmax_t{1} << 30;

// ---------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------

// Length of the UTF-8 sequence starting with byte `b` (1 for a stray
// continuation byte; callers have validated the text).
size_t Utf8Length(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b >> 5) == 0x6) return 2;
  if ((b >> 4) == 0xE) return 3;
  if ((b >> 3) == 0x1E) return 4;
  return 1;
}

// Byte offset of the first invalid sequence in `s`, or npos (RFC 3629: no
// overlongs, no surrogates, nothing above U+10FFFF).
size_t FindInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0;
    if ((b >> 5) == 0x6) {
      n = 2;
      cp = b & 0x1F;
    } else if ((b >> 4) == 0xE) {
      n = 3;
      cp = b & 0x0F;
    } else if ((b >> 3) == 0x1E) {
      n = 4;
      cp = b & 0x07;
    } else
      return i;
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char c = s[i + k];
      if ((c >> 6) != 0x2) return i;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min_cp = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return absl::string_view::npos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes
// U+FFFD (Unicode "substitution of maximal subparts").
std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b == 0xE0) {
      n = 3;
      lo = 0xA0;
    } else if (b >= 0xE1 && b <= 0xEC) {
      n = 3;
    } else if (b == 0xED) {
      n = 3;
      hi = 0x9F;
    } else if (b >= 0xEE && b <= 0xEF) {
      n = 3;
    } else if (b == 0xF0) {
      n = 4;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      n = 4;
    } else if (b == 0xF4) {
      n = 4;
      hi = 0x8F;
    }
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < n && i + k < s.size(); ++k) {
      const unsigned char c = s[i + k];
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (c < l || c > h) break;
    }
    if (k == n) {
      out.append(s.data() + i, n);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

// GPT-2's byte <-> char table (tokenizers pre_tokenizers/byte_level.rs
// bytes_char): printable bytes map to themselves, the others to U+0100 + n
// in byte order.
struct ByteLevelTable {
  std::string byte_to_utf8[256];
  absl::flat_hash_map<uint32_t, uint8_t> char_to_byte;
  ByteLevelTable() {
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? b : 256 + n++;
      AppendUtf8(cp, &byte_to_utf8[b]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable* table = new ByteLevelTable();
  return *table;
}

// Decodes the code point at s[i] (valid UTF-8) and its length.
uint32_t DecodeUtf8At(absl::string_view s, size_t i, size_t* len) {
  const unsigned char b = s[i];
  *len = Utf8Length(b);
  if (*len == 1) return b;
  uint32_t cp = b & (0x7F >> *len);
  for (size_t k = 1; k < *len && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  return cp;
}

// ---------------------------------------------------------------------------
// Regex (Note [Regexes: PCRE2])
// ---------------------------------------------------------------------------

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// A compiled pattern. Immutable; matching is thread-safe (match data is per
// call).
class Regex {
 public:
  // `literal`: the pattern is a plain string (tokenizers' {"String": ...}).
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern,
                                                              bool literal,
                                                              const std::string& field) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    // PCRE2_LITERAL admits no UCP (nothing to classify in a plain string).
    const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &error, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(field, ": regex does not compile at offset ",
                                                     error_offset, ": ",
                                                     reinterpret_cast<char*>(message)));
    }
    // JIT is an optimisation: without it (no JIT on this CPU) the
    // interpreter gives the same matches.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    auto regex = std::shared_ptr<Regex>(new Regex());
    regex->code_.reset(code);
    return regex;
  }

  // Appends the [start, end) byte ranges of the non-empty matches in `s`
  // (valid UTF-8), left to right, as Oniguruma's find_iter does.
  absl::Status FindAll(absl::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t offset = 0;
    uint32_t options = 0;
    while (offset <= s.size()) {
      // The text was validated once by Encode(); NO_UTF_CHECK avoids
      // re-scanning it at every start offset.
      int rc = pcre2_match(code_.get(), subject, s.size(), offset, options | PCRE2_NO_UTF_CHECK,
                           md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // A very long run outgrew the JIT's stack: the interpreter keeps its
        // backtracking state on the heap.
        options |= PCRE2_NO_JIT;
        continue;
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
          rc == PCRE2_ERROR_HEAPLIMIT) {
        // A pathological pattern from tokenizer.json (catastrophic
        // backtracking): PCRE2's default limits (10^7 match steps) bound
        // the time, and the file is at fault, not the program.
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer regex exceeded PCRE2's backtracking limit at byte ", offset,
                         " (a pathological pattern in tokenizer.json)"));
      }
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        return absl::InternalError(
            absl::StrCat("regex match failed: ", reinterpret_cast<char*>(message)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
      const size_t start = ovector[0], end = ovector[1];
      if (end > start) {
        out->emplace_back(start, end);
        offset = end;
      } else {
        // An empty match yields no piece; step one character on.
        if (start >= s.size()) break;
        offset = start + Utf8Length(static_cast<unsigned char>(s[start]));
      }
    }
    return absl::OkStatus();
  }

 private:
  Regex() = default;
  std::unique_ptr<pcre2_code, Pcre2CodeDeleter> code_;
};

// ---------------------------------------------------------------------------
// Pipeline tables
// ---------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kPrepend, kReplace } kind;
  std::string text;                    // kPrepend: the prefix; kReplace: content
  std::shared_ptr<const Regex> regex;  // kReplace: the pattern
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<const Regex> regex;  // kSplit; kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace (one character, UTF-8)
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = false;  // kMetaspace
};

struct DecoderStep {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string pattern, content;  // kReplace; kMetaspace: replacement in pattern
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  uint32_t strip_char = 0;  // kStrip
  size_t strip_start = 0, strip_stop = 0;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
};

// A piece of text on its way through the pipeline. `at_start`: it begins at
// offset 0 of the original input (Metaspace's "first" scheme).
// `offsets[i]`: the byte of the original input that text[i] comes from
// (inserted bytes take the offset of the byte they stand before), so that
// every token knows its span of the input (Note [Offsets]).
struct Piece {
  std::string text;
  bool at_start = false;
  std::vector<uint32_t> offsets;

  Piece Sub(size_t start, size_t length) const {
    length = std::min(length, text.size() - start);
    Piece p{text.substr(start, length), at_start && start == 0, {}};
    if (!offsets.empty()) {
      p.offsets.assign(offsets.begin() + start, offsets.begin() + start + length);
    }
    return p;
  }
};

// Note [Offsets]
// tokenizers' NormalizedString aligns every normalized char with original
// chars; we keep the same per byte in Piece::offsets. Prepend, Metaspace and
// ByteLevel insert or expand bytes (the new bytes take the source byte's
// offset); an NF* normalization that changes the text maps its unchanged
// prefix and suffix exactly and the changed middle to the middle's first
// original byte. A token's span is [offset of its first byte, offset of its
// last byte + 1). Chat loss masks (text_corpus.cc) use these spans the way
// transformers uses char_to_token. Plain Encode() leaves `offsets` empty
// (tracking them costs about half the throughput); every step then skips
// them.
//
// Inserts `count` bytes of `bytes` at `pos` of `p`, with the offset of the
// byte now after them (or of the last byte at the end).
void InsertBytes(Piece* p, size_t pos, const std::string& bytes) {
  if (p->offsets.empty()) {
    p->text.insert(pos, bytes);
    return;
  }
  const uint32_t offset = p->offsets.empty()        ? 0
                          : pos < p->offsets.size() ? p->offsets[pos]
                                                    : p->offsets.back();
  p->text.insert(pos, bytes);
  p->offsets.insert(p->offsets.begin() + pos, bytes.size(), offset);
}

// One symbol of a word during BPE: a doubly linked list over a vector, so
// that a merge unlinks its right symbol in O(1).
struct BpeSymbol {
  int32_t id;
  int32_t prev, next;  // indices; -1 at the ends
  uint32_t len;        // bytes of the word
  bool removed;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  // BPE model.
  absl::flat_hash_map<std::string, int32_t> vocab;      // model.vocab (what BPE looks up)
  absl::flat_hash_map<std::string, int32_t> added_ids;  // added_tokens content -> id
  std::vector<std::string> id_to_token;                 // "" where no token
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a,b) -> (rank, id)
  int32_t model_unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;
  int32_t byte_fallback_ids[256];
  // Pipeline.
  std::vector<AddedToken> added;  // longest first (leftmost-longest matching)
  // Indices into `added` by the first byte of the content, longest first.
  std::vector<std::vector<uint32_t>> added_by_first_byte = std::vector<std::vector<uint32_t>>(256);
  uint64_t cache_key = 0;  // unique per loaded tokenizer (Note [Word cache])
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<std::pair<bool, std::vector<int32_t>>> template_single;  // (is_sequence, ids)
  bool has_template = false;
  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  absl::flat_hash_map<int32_t, bool> special_ids;
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;

  // (piece, -1) for text, (piece of the token's bytes, id) for a token.
  void SplitAddedTokens(const Piece& piece, bool normalized,
                        std::vector<std::pair<Piece, int32_t>>* out) const;
  absl::Status Normalize(Piece* piece) const;
  absl::Status PreTokenize(Piece piece, std::vector<Piece>* words) const;
  // Appends (id, bytes of `word` it covers) per token.
  void Bpe(absl::string_view word, std::vector<std::pair<int32_t, uint32_t>>* tokens) const;
  void BpeUncached(absl::string_view word, std::vector<std::pair<int32_t, uint32_t>>* tokens) const;
  // BpeUncached's two phases: the word's characters as symbols (with
  // continuing_subword_prefix / end_of_word_suffix, byte fallback and
  // <unk>), then the merges, lowest rank and leftmost first.
  std::vector<BpeSymbol> InitialSymbols(absl::string_view word) const;
  void ApplyMerges(std::vector<BpeSymbol>* symbols) const;
  // `spans` null: no offsets are tracked (Note [Offsets]).
  absl::Status EncodeSegment(Piece piece, std::vector<int32_t>* ids,
                             std::vector<std::pair<size_t, size_t>>* spans) const;
  absl::Status EncodeAll(absl::string_view text, bool add_special_tokens, std::vector<int32_t>* ids,
                         std::vector<std::pair<size_t, size_t>>* spans) const;
};

namespace {

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

absl::Status Unsupported(const std::string& field, const std::string& type, const char* supported) {
  return absl::UnimplementedError(
      absl::StrCat(field, ": '", type, "' is not supported (supported: ", supported, ")"));
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  // Note [Confined reads] in engine/fs/dir_fd.h: below the job's roots, never
  // a FIFO or device.
  absl::StatusOr<std::string> text =
      ReadInputFile(path.string(), static_cast<int64_t>(kMaxTokenizerFileBytes));
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": no such file"));
  }
  return text;
}

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& s, const std::string& field) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(field, ": unknown behavior '", s, "'"));
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const json& j, const std::string& field) {
  if (j.contains("prepend_scheme")) {
    const std::string s = j.at("prepend_scheme").get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return absl::InvalidArgumentError(absl::StrCat(field, ".prepend_scheme: unknown '", s, "'"));
  }
  // tokenizers before 0.14: add_prefix_space (default true).
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

// {"String": s} or {"Regex": r}.
absl::StatusOr<std::shared_ptr<const Regex>> ParsePattern(const json& j, const std::string& field) {
  if (j.contains("String")) return Regex::Compile(j.at("String").get<std::string>(), true, field);
  if (j.contains("Regex")) return Regex::Compile(j.at("Regex").get<std::string>(), false, field);
  return absl::InvalidArgumentError(absl::StrCat(field, ": neither String nor Regex"));
}

absl::Status ParseNormalizer(const json& j, const std::string& field,
                             std::vector<NormalizerStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.at("type").get<std::string>();
  using K = NormalizerStep::Kind;
  if (type == "Sequence") {
    const json& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      MEGATRAIN_RETURN_IF_ERROR(
          ParseNormalizer(list[i], absl::StrCat(field, ".normalizers[", i, "]"), out));
    }
  } else if (type == "NFC") {
    out->push_back({K::kNfc, "", nullptr});
  } else if (type == "NFD") {
    out->push_back({K::kNfd, "", nullptr});
  } else if (type == "NFKC") {
    out->push_back({K::kNfkc, "", nullptr});
  } else if (type == "NFKD") {
    out->push_back({K::kNfkd, "", nullptr});
  } else if (type == "Prepend") {
    out->push_back({K::kPrepend, j.at("prepend").get<std::string>(), nullptr});
  } else if (type == "Replace") {
    MEGATRAIN_ASSIGN_OR_RETURN(auto regex,
                               ParsePattern(j.at("pattern"), absl::StrCat(field, ".pattern")));
    out->push_back({K::kReplace, j.at("content").get<std::string>(), std::move(regex)});
  } else {
    return Unsupported(field + ".type", type, "Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace");
  }
  return absl::OkStatus();
}

// GPT-2's pattern, used by ByteLevel with use_regex (tokenizers
// pre_tokenizers/byte_level.rs).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status ParsePreTokenizer(const json& j, const std::string& field,
                               std::vector<PreTokenizerStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.at("type").get<std::string>();
  using K = PreTokenizerStep::Kind;
  PreTokenizerStep step;
  if (type == "Sequence") {
    const json& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      MEGATRAIN_RETURN_IF_ERROR(
          ParsePreTokenizer(list[i], absl::StrCat(field, ".pretokenizers[", i, "]"), out));
    }
    return absl::OkStatus();
  } else if (type == "Split") {
    step.kind = K::kSplit;
    MEGATRAIN_ASSIGN_OR_RETURN(step.regex,
                               ParsePattern(j.at("pattern"), absl::StrCat(field, ".pattern")));
    MEGATRAIN_ASSIGN_OR_RETURN(
        step.behavior, ParseBehavior(j.at("behavior").get<std::string>(), field + ".behavior"));
    step.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) {
      MEGATRAIN_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern, false, field));
    }
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.replacement = j.at("replacement").get<std::string>();
    size_t len = 0;
    if (step.replacement.empty() || FindInvalidUtf8(step.replacement) != std::string::npos ||
        (DecodeUtf8At(step.replacement, 0, &len), len != step.replacement.size())) {
      return absl::InvalidArgumentError(field + ".replacement: must be one character");
    }
    MEGATRAIN_ASSIGN_OR_RETURN(step.prepend_scheme, ParsePrependScheme(j, field));
    step.split = j.value("split", true);
  } else {
    return Unsupported(field + ".type", type, "Sequence, Split, ByteLevel, Metaspace");
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const json& j, const std::string& field, std::vector<DecoderStep>* out) {
  const std::string type = j.at("type").get<std::string>();
  using K = DecoderStep::Kind;
  DecoderStep step;
  if (type == "Sequence") {
    const json& list = j.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      MEGATRAIN_RETURN_IF_ERROR(
          ParseDecoder(list[i], absl::StrCat(field, ".decoders[", i, "]"), out));
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.pattern = j.at("replacement").get<std::string>();
    MEGATRAIN_ASSIGN_OR_RETURN(step.prepend_scheme, ParsePrependScheme(j, field));
  } else if (type == "Replace") {
    step.kind = K::kReplace;
    const json& pattern = j.at("pattern");
    if (!pattern.contains("String")) {
      return Unsupported(field + ".pattern", "Regex", "String");
    }
    step.pattern = pattern.at("String").get<std::string>();
    step.content = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = K::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = K::kFuse;
  } else if (type == "Strip") {
    step.kind = K::kStrip;
    const std::string content = j.at("content").get<std::string>();
    size_t len = 0;
    if (content.empty() || FindInvalidUtf8(content) != std::string::npos) {
      return absl::InvalidArgumentError(field + ".content: must be one character");
    }
    step.strip_char = DecodeUtf8At(content, 0, &len);
    step.strip_start = j.at("start").get<size_t>();
    step.strip_stop = j.at("stop").get<size_t>();
  } else {
    return Unsupported(field + ".type", type,
                       "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip");
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// TemplateProcessing's "single" template; ByteLevel only changes offsets.
absl::Status ParsePostProcessor(const json& j, const std::string& field, HfTokenizer::Impl* t) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    const json& list = j.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      MEGATRAIN_RETURN_IF_ERROR(
          ParsePostProcessor(list[i], absl::StrCat(field, ".processors[", i, "]"), t));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();
  if (type != "TemplateProcessing") {
    return Unsupported(field + ".type", type, "Sequence, ByteLevel, TemplateProcessing");
  }
  if (t->has_template) {
    return absl::InvalidArgumentError(field + ": a second TemplateProcessing");
  }
  t->has_template = true;
  const json& special_tokens = j.at("special_tokens");
  const json& single = j.at("single");
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item = absl::StrCat(field, ".single[", i, "]");
    if (single[i].contains("Sequence")) {
      t->template_single.push_back({true, {}});
      continue;
    }
    const std::string name = single[i].at("SpecialToken").at("id").get<std::string>();
    if (!special_tokens.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(item, ": '", name, "' is not in ", field, ".special_tokens"));
    }
    std::vector<int32_t> ids = special_tokens.at(name).at("ids").get<std::vector<int32_t>>();
    t->template_single.push_back({false, std::move(ids)});
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const json& m, HfTokenizer::Impl* t) {
  const std::string type = m.value("type", "BPE");
  if (type != "BPE") return Unsupported("model.type", type, "BPE");
  if (m.contains("dropout") && !m.at("dropout").is_null() && m.at("dropout").get<double>() > 0) {
    return absl::UnimplementedError("model.dropout: BPE dropout is not supported");
  }
  for (const auto& [token, id_json] : m.at("vocab").items()) {
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab['", token, "']: id ", id, " outside [0, 2^30]"));
    }
    t->vocab[token] = static_cast<int32_t>(id);
  }
  if (m.contains("continuing_subword_prefix") && !m.at("continuing_subword_prefix").is_null()) {
    t->continuing_subword_prefix = m.at("continuing_subword_prefix").get<std::string>();
  }
  if (m.contains("end_of_word_suffix") && !m.at("end_of_word_suffix").is_null()) {
    t->end_of_word_suffix = m.at("end_of_word_suffix").get<std::string>();
  }
  t->fuse_unk = m.value("fuse_unk", false);
  t->byte_fallback = m.value("byte_fallback", false);
  t->ignore_merges = m.value("ignore_merges", false);
  if (m.contains("unk_token") && !m.at("unk_token").is_null()) {
    const std::string unk = m.at("unk_token").get<std::string>();
    auto it = t->vocab.find(unk);
    if (it == t->vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token: '", unk, "' is not in model.vocab"));
    }
    t->model_unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab.find(absl::StrFormat("<0x%02X>", b));
    t->byte_fallback_ids[b] = it == t->vocab.end() ? -1 : it->second;
  }
  // Merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs. The
  // merged token is a + b without b's continuing_subword_prefix
  // (models/bpe/model.rs, BpeBuilder::build).
  const json& merges = m.at("merges");
  const size_t prefix_len = t->continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string field = absl::StrCat("model.merges[", rank, "]");
    std::string a, b;
    if (merges[rank].is_string()) {
      const std::string s = merges[rank].get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return absl::InvalidArgumentError(field + ": '" + s + "' is not 'a b'");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      a = merges[rank].at(0).get<std::string>();
      b = merges[rank].at(1).get<std::string>();
    }
    auto ia = t->vocab.find(a), ib = t->vocab.find(b);
    std::string merged = a + (prefix_len > 0 && absl::string_view(b).substr(0, prefix_len) ==
                                                    t->continuing_subword_prefix
                                  ? b.substr(prefix_len)
                                  : b);
    auto im = t->vocab.find(merged);
    if (ia == t->vocab.end() || ib == t->vocab.end() || im == t->vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", a, "' + '", b, "' or their merge is not in model.vocab"));
    }
    const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    t->merges.try_emplace(key, static_cast<int32_t>(rank), im->second);
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const json& list, HfTokenizer::Impl* t) {
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    AddedToken token;
    token.content = a.at("content").get<std::string>();
    token.id = a.at("id").get<int32_t>();
    token.special = a.value("special", false);
    token.normalized = a.value("normalized", !token.special);
    token.lstrip = a.value("lstrip", false);
    token.rstrip = a.value("rstrip", false);
    if (a.value("single_word", false)) {
      return absl::UnimplementedError(
          absl::StrCat("added_tokens[", i, "].single_word: true is not supported"));
    }
    if (token.id < 0 || token.id > (1 << 30) || token.content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("added_tokens[", i, "]: bad id or empty content"));
    }
    t->added_ids[token.content] = token.id;
    if (token.special) t->special_ids[token.id] = true;
    t->added.push_back(std::move(token));
  }
  std::stable_sort(t->added.begin(), t->added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < t->added.size(); ++i) {
    t->added_by_first_byte[static_cast<unsigned char>(t->added[i].content[0])].push_back(
        static_cast<uint32_t>(i));
  }
  return absl::OkStatus();
}

// tokenizer_config.json's bos_token etc: a string, {"content": ...}, or null.
absl::StatusOr<int32_t> ConfigTokenId(const json& config, const char* key,
                                      const HfTokenizer::Impl& t) {
  if (!config.contains(key) || config.at(key).is_null()) return -1;
  const json& v = config.at(key);
  const std::string token =
      v.is_string() ? v.get<std::string>() : v.at("content").get<std::string>();
  auto it = t.added_ids.find(token);
  if (it != t.added_ids.end()) return it->second;
  it = t.vocab.find(token);
  if (it == t.vocab.end()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", key, ": '", token,
                                                   "' is not a token of tokenizer.json"));
  }
  return it->second;
}

// Note [Tokenizer id bound]
// The id -> token table is sized by the largest id, so an id must lie below
// the number of tokens the file defines plus kMaxTokenIdGap (HF vocabularies
// are dense, 0..N-1; the slack allows a few unused reserved ids). Without
// this, one id of 2^30 in a 1 KB file would make a 32 GB table.
constexpr int64_t kMaxTokenIdGap = 1024;

absl::Status CheckIdsWithinTokenCount(const HfTokenizer::Impl& t) {
  const int64_t tokens = static_cast<int64_t>(t.vocab.size() + t.added.size());
  const int64_t limit = tokens + kMaxTokenIdGap;
  for (const auto& [token, id] : t.vocab) {
    if (id >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab['", EscapeControlCharacters(token.substr(0, 64)), "']: id ", id,
                       " is beyond the file's ", tokens, " tokens (ids must be below ", limit,
                       ": the token count + ", kMaxTokenIdGap, ", Note [Tokenizer id bound])"));
    }
  }
  for (const AddedToken& a : t.added) {
    if (a.id >= limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "added_tokens: id ", a.id, " of '", EscapeControlCharacters(a.content.substr(0, 64)),
          "' is beyond the file's ", tokens, " tokens (ids must be below ", limit,
          ", Note [Tokenizer id bound])"));
    }
  }
  return absl::OkStatus();
}

absl::Status Build(const json& j, const json& config, HfTokenizer::Impl* t) {
  MEGATRAIN_RETURN_IF_ERROR(ParseModel(j.at("model"), t));
  if (j.contains("added_tokens")) {
    MEGATRAIN_RETURN_IF_ERROR(ParseAddedTokens(j.at("added_tokens"), t));
  }
  if (j.contains("normalizer")) {
    MEGATRAIN_RETURN_IF_ERROR(ParseNormalizer(j.at("normalizer"), "normalizer", &t->normalizer));
  }
  if (j.contains("pre_tokenizer")) {
    MEGATRAIN_RETURN_IF_ERROR(
        ParsePreTokenizer(j.at("pre_tokenizer"), "pre_tokenizer", &t->pre_tokenizer));
  }
  if (j.contains("post_processor")) {
    MEGATRAIN_RETURN_IF_ERROR(ParsePostProcessor(j.at("post_processor"), "post_processor", t));
  }
  if (j.contains("decoder") && !j.at("decoder").is_null()) {
    t->has_decoder = true;
    MEGATRAIN_RETURN_IF_ERROR(ParseDecoder(j.at("decoder"), "decoder", &t->decoder));
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckIdsWithinTokenCount(*t));
  int32_t max_id = -1;
  for (const auto& [token, id] : t->vocab) max_id = std::max(max_id, id);
  for (const AddedToken& a : t->added) max_id = std::max(max_id, a.id);
  t->id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : t->vocab) t->id_to_token[id] = token;
  for (const AddedToken& a : t->added) t->id_to_token[a.id] = a.content;
  for (const auto& [is_sequence, ids] : t->template_single) {
    for (int32_t id : ids) {
      if (id < 0 || id > max_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("post_processor: special id ", id, " outside the vocabulary"));
      }
    }
  }
  if (config.is_object()) {
    MEGATRAIN_ASSIGN_OR_RETURN(t->bos_id, ConfigTokenId(config, "bos_token", *t));
    MEGATRAIN_ASSIGN_OR_RETURN(t->eos_id, ConfigTokenId(config, "eos_token", *t));
    MEGATRAIN_ASSIGN_OR_RETURN(t->pad_id, ConfigTokenId(config, "pad_token", *t));
    MEGATRAIN_ASSIGN_OR_RETURN(t->unk_id, ConfigTokenId(config, "unk_token", *t));
  }
  if (t->unk_id < 0) t->unk_id = t->model_unk_id;
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

// added_vocabulary.rs: leftmost-longest matches of the added tokens whose
// `normalized` flag equals `normalized`; lstrip / rstrip swallow the white
// space beside a match. Appends (piece, -1) for text and ({}, id) for tokens.
void HfTokenizer::Impl::SplitAddedTokens(const Piece& piece, bool normalized,
                                         std::vector<std::pair<Piece, int32_t>>* out) const {
  const std::string& s = piece.text;
  size_t text_start = 0;  // start of the pending text
  size_t i = 0;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < s.size()) {
    const AddedToken* hit = nullptr;
    for (uint32_t k : added_by_first_byte[static_cast<unsigned char>(s[i])]) {  // longest first
      const AddedToken& a = added[k];
      if (a.normalized == normalized && s.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t match_start = i, match_end = i + hit->content.size();
    if (hit->lstrip) {
      while (match_start > text_start && is_space(s[match_start - 1])) --match_start;
    }
    if (hit->rstrip) {
      while (match_end < s.size() && is_space(s[match_end])) ++match_end;
    }
    if (match_start > text_start) {
      out->push_back({piece.Sub(text_start, match_start - text_start), -1});
    }
    out->push_back({piece.Sub(match_start, match_end - match_start), hit->id});
    i = text_start = match_end;
  }
  if (text_start < s.size()) {
    out->push_back({piece.Sub(text_start, s.size() - text_start), -1});
  }
}

namespace {

absl::StatusOr<std::string> IcuNormalize(const std::string& text, NormalizerStep::Kind kind) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) return text;
  UErrorCode err = U_ZERO_ERROR;
  using K = NormalizerStep::Kind;
  const UNormalizer2* n = kind == K::kNfc    ? unorm2_getNFCInstance(&err)
                          : kind == K::kNfd  ? unorm2_getNFDInstance(&err)
                          : kind == K::kNfkc ? unorm2_getNFKCInstance(&err)
                                             : unorm2_getNFKDInstance(&err);
  std::u16string in(text.size(), u'\0');
  int32_t in_len = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), static_cast<int32_t>(in.size()), &in_len,
                text.data(), static_cast<int32_t>(text.size()), &err);
  in.resize(in_len);
  // NFKC can grow text (up to 18x for one character): size by preflight.
  int32_t out_len =
      unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), in_len, nullptr, 0, &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) err = U_ZERO_ERROR;
  std::u16string norm(out_len, u'\0');
  unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), in_len,
                   reinterpret_cast<UChar*>(norm.data()), out_len, &err);
  std::string out(static_cast<size_t>(out_len) * 3, '\0');
  int32_t utf8_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &utf8_len,
              reinterpret_cast<const UChar*>(norm.data()), out_len, &err);
  if (U_FAILURE(err)) {
    return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(err)));
  }
  out.resize(utf8_len);
  return out;
}

// The pieces of `s` that a split by `matches` (sorted, disjoint) keeps,
// per normalizer.rs NormalizedString::split.
std::vector<std::pair<size_t, size_t>> ApplyBehavior(
    absl::string_view s, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
    SplitBehavior behavior) {
  // (offsets, is_match) covering all of s.
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> all;
  size_t prev = 0;
  for (const auto& m : matches) {
    if (m.first > prev) all.push_back({{prev, m.first}, invert});
    all.push_back({m, !invert});
    prev = m.second;
  }
  if (prev < s.size()) all.push_back({{prev, s.size()}, invert});
  std::vector<std::pair<size_t, size_t>> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [o, is_match] : all) out.push_back(o);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [o, is_match] : all)
        if (!is_match) out.push_back(o);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [o, is_match] : all) {
        if (is_match && !previous_match && !out.empty())
          out.back().second = o.second;
        else
          out.push_back(o);
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [o, is_match] : all) {
        if (is_match == previous_match && !out.empty())
          out.back().second = o.second;
        else
          out.push_back(o);
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        if (it->second && !previous_match && !out.empty())
          out.back().first = it->first.first;
        else
          out.push_back(it->first);
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

// Splits every piece by `regex` and `behavior`; drops empty pieces.
absl::Status SplitPieces(const Regex& regex, bool invert, SplitBehavior behavior,
                         std::vector<Piece>* pieces) {
  std::vector<Piece> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (Piece& p : *pieces) {
    matches.clear();
    MEGATRAIN_RETURN_IF_ERROR(regex.FindAll(p.text, &matches));
    for (const auto& [start, end] : ApplyBehavior(p.text, matches, invert, behavior)) {
      if (end > start) next.push_back(p.Sub(start, end - start));
    }
  }
  *pieces = std::move(next);
  return absl::OkStatus();
}

}  // namespace

absl::Status HfTokenizer::Impl::Normalize(Piece* piece) const {
  using K = NormalizerStep::Kind;
  std::string& text = piece->text;
  std::vector<uint32_t>& offsets = piece->offsets;
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case K::kNfc:
      case K::kNfd:
      case K::kNfkc:
      case K::kNfkd: {
        MEGATRAIN_ASSIGN_OR_RETURN(std::string out, IcuNormalize(text, step.kind));
        if (out == text) break;
        if (offsets.empty()) {
          text = std::move(out);
          break;
        }
        // Note [Offsets]: exact common prefix and suffix, the middle to its
        // first original byte.
        size_t prefix = 0;
        while (prefix < out.size() && prefix < text.size() && out[prefix] == text[prefix]) ++prefix;
        size_t suffix = 0;
        while (suffix < out.size() - prefix && suffix < text.size() - prefix &&
               out[out.size() - 1 - suffix] == text[text.size() - 1 - suffix]) {
          ++suffix;
        }
        std::vector<uint32_t> mapped(out.size());
        for (size_t k = 0; k < prefix; ++k) mapped[k] = offsets[k];
        const uint32_t middle = prefix < offsets.size() ? offsets[prefix] : offsets.back();
        for (size_t k = prefix; k < out.size() - suffix; ++k) mapped[k] = middle;
        for (size_t k = 0; k < suffix; ++k) {
          mapped[out.size() - 1 - k] = offsets[text.size() - 1 - k];
        }
        text = std::move(out);
        offsets = std::move(mapped);
        break;
      }
      case K::kPrepend:
        if (!text.empty()) InsertBytes(piece, 0, step.text);
        break;
      case K::kReplace: {
        std::vector<std::pair<size_t, size_t>> matches;
        MEGATRAIN_RETURN_IF_ERROR(step.regex->FindAll(text, &matches));
        if (matches.empty()) break;
        std::string out;
        std::vector<uint32_t> mapped;
        size_t prev = 0;
        for (const auto& [start, end] : matches) {
          out.append(text, prev, start - prev);
          out += step.text;
          if (!offsets.empty()) {
            mapped.insert(mapped.end(), offsets.begin() + prev, offsets.begin() + start);
            mapped.insert(mapped.end(), step.text.size(), offsets[start]);
          }
          prev = end;
        }
        out.append(text, prev, std::string::npos);
        if (!offsets.empty()) mapped.insert(mapped.end(), offsets.begin() + prev, offsets.end());
        text = std::move(out);
        offsets = std::move(mapped);
        break;
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// ByteLevel: every byte of every piece becomes its printable stand-in
// (GPT-2's bytes_to_unicode), offsets following the bytes.
void MapBytesToUnicode(std::vector<Piece>* pieces_out) {
  std::vector<Piece>& pieces = *pieces_out;
  const ByteLevelTable& table = ByteLevel();
  for (Piece& p : pieces) {
    std::string mapped;
    std::vector<uint32_t> offsets;
    mapped.reserve(p.text.size() * 2);
    offsets.reserve(p.text.size() * 2);
    const bool track = !p.offsets.empty();
    for (size_t k = 0; k < p.text.size(); ++k) {
      const std::string& c = table.byte_to_utf8[static_cast<unsigned char>(p.text[k])];
      mapped += c;
      if (track) offsets.insert(offsets.end(), c.size(), p.offsets[k]);
    }
    p.text = std::move(mapped);
    p.offsets = std::move(offsets);
  }
}

// Metaspace: spaces become step.replacement, which is prepended per
// step.prepend_scheme; with step.split, each piece is split before every
// replacement (MergedWithNext).
void ApplyMetaspace(const PreTokenizerStep& step, std::vector<Piece>* pieces_out) {
  std::vector<Piece>& pieces = *pieces_out;
  for (Piece& p : pieces) {
    if (p.text.find(' ') != std::string::npos) {
      std::string replaced;
      std::vector<uint32_t> offsets;
      const bool track = !p.offsets.empty();
      for (size_t k = 0; k < p.text.size(); ++k) {
        if (p.text[k] == ' ') {
          replaced += step.replacement;
          if (track) offsets.insert(offsets.end(), step.replacement.size(), p.offsets[k]);
        } else {
          replaced.push_back(p.text[k]);
          if (track) offsets.push_back(p.offsets[k]);
        }
      }
      p.text = std::move(replaced);
      p.offsets = std::move(offsets);
    }
    const bool starts =
        absl::string_view(p.text).substr(0, step.replacement.size()) == step.replacement;
    if (!starts && (step.prepend_scheme == PrependScheme::kAlways ||
                    (step.prepend_scheme == PrependScheme::kFirst && p.at_start))) {
      InsertBytes(&p, 0, step.replacement);
    }
  }
  if (step.split) {
    // MergedWithNext on every replacement character.
    std::vector<Piece> next;
    for (Piece& p : pieces) {
      size_t start = 0;
      size_t pos = p.text.find(step.replacement, 1);
      while (pos != std::string::npos) {
        next.push_back(p.Sub(start, pos - start));
        start = pos;
        pos = p.text.find(step.replacement, pos + step.replacement.size());
      }
      next.push_back(p.Sub(start, p.text.size() - start));
    }
    pieces = std::move(next);
  }
}

}  // namespace

absl::Status HfTokenizer::Impl::PreTokenize(Piece piece, std::vector<Piece>* words) const {
  std::vector<Piece> pieces;
  pieces.push_back(std::move(piece));
  using K = PreTokenizerStep::Kind;
  for (const PreTokenizerStep& step : pre_tokenizer) {
    switch (step.kind) {
      case K::kSplit:
        MEGATRAIN_RETURN_IF_ERROR(SplitPieces(*step.regex, step.invert, step.behavior, &pieces));
        break;
      case K::kByteLevel: {
        if (step.add_prefix_space) {
          for (Piece& p : pieces) {
            if (!p.text.empty() && p.text[0] != ' ') InsertBytes(&p, 0, " ");
          }
        }
        if (step.regex != nullptr) {
          MEGATRAIN_RETURN_IF_ERROR(
              SplitPieces(*step.regex, false, SplitBehavior::kIsolated, &pieces));
        }
        MapBytesToUnicode(&pieces);
        break;
      }
      case K::kMetaspace:
        ApplyMetaspace(step, &pieces);
        break;
    }
  }
  for (Piece& p : pieces) {
    if (!p.text.empty()) words->push_back(std::move(p));
  }
  return absl::OkStatus();
}

// Note [Word cache]
// Words repeat (Zipf), so, like tokenizers' BPE cache, Bpe() keeps the ids
// of recent words: in a thread_local map (no lock; Encode stays const and
// concurrent), keyed by the tokenizer's unique cache_key so that a
// tokenizer loaded at a freed one's address never sees its entries. Words
// over kMaxCachedWordBytes are not cached; the map is cleared when it
// reaches kMaxCachedWords (bounded memory per thread).
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCachedWords = size_t{1} << 16;

void HfTokenizer::Impl::Bpe(absl::string_view word,
                            std::vector<std::pair<int32_t, uint32_t>>* ids) const {
  struct Cache {
    uint64_t owner = 0;
    absl::flat_hash_map<std::string, std::vector<std::pair<int32_t, uint32_t>>> words;
  };
  thread_local Cache cache;
  if (word.size() > kMaxCachedWordBytes) return BpeUncached(word, ids);
  if (cache.owner != cache_key || cache.words.size() >= kMaxCachedWords) {
    cache.words.clear();
    cache.owner = cache_key;
  }
  auto it = cache.words.find(word);
  if (it == cache.words.end()) {
    std::vector<std::pair<int32_t, uint32_t>> word_ids;
    BpeUncached(word, &word_ids);
    it = cache.words.emplace(std::string(word), std::move(word_ids)).first;
  }
  ids->insert(ids->end(), it->second.begin(), it->second.end());
}

// models/bpe/model.rs merge_word + word.rs merge_all: characters to ids
// (byte fallback or <unk> for unknown ones), then repeatedly apply the
// lowest-ranked merge present, leftmost first.
std::vector<BpeSymbol> HfTokenizer::Impl::InitialSymbols(absl::string_view word) const {
  std::vector<BpeSymbol> symbols;
  symbols.reserve(word.size());
  int32_t pending_unk = -1;  // a fused <unk> not yet added
  uint32_t pending_unk_len = 0;
  auto add = [&symbols](int32_t id, uint32_t len) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, len, false});
    if (n > 0) symbols[n - 1].next = n;
  };
  std::string key;
  for (size_t i = 0; i < word.size();) {
    const size_t len = Utf8Length(static_cast<unsigned char>(word[i]));
    key.clear();
    if (i > 0) key += continuing_subword_prefix;
    key.append(word.data() + i, len);
    if (i + len >= word.size()) key += end_of_word_suffix;
    auto it = vocab.find(key);
    if (it != vocab.end()) {
      if (pending_unk >= 0) add(pending_unk, pending_unk_len), pending_unk = -1;
      add(it->second, static_cast<uint32_t>(len));
    } else {
      bool done = false;
      if (byte_fallback) {
        done = std::all_of(key.begin(), key.end(), [this](char c) {
          return byte_fallback_ids[static_cast<unsigned char>(c)] >= 0;
        });
        if (done) {
          // Rust's merge_word adds byte tokens without flushing a pending <unk>.
          for (unsigned char c : key) add(byte_fallback_ids[c], 1);
        }
      }
      if (!done && model_unk_id >= 0) {
        if (pending_unk >= 0 && fuse_unk) {
          pending_unk_len += static_cast<uint32_t>(len);
        } else {
          if (pending_unk >= 0) add(pending_unk, pending_unk_len);
          pending_unk = model_unk_id;
          pending_unk_len = static_cast<uint32_t>(len);
        }
      }
    }
    i += len;
  }
  if (pending_unk >= 0) add(pending_unk, pending_unk_len);
  return symbols;
}

void HfTokenizer::Impl::ApplyMerges(std::vector<BpeSymbol>* symbols_out) const {
  std::vector<BpeSymbol>& symbols = *symbols_out;
  struct Merge {
    int32_t rank, pos, new_id;
    bool operator<(const Merge& o) const {  // max-heap: lowest rank, then leftmost, on top
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto find_merge = [this](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    return it == merges.end() ? nullptr : &it->second;
  };
  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      queue.push({m->first, static_cast<int32_t>(k), m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    BpeSymbol& cur = symbols[top.pos];
    if (cur.removed || cur.next < 0) continue;
    const BpeSymbol right = symbols[cur.next];
    const auto* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;  // stale entry
    symbols[cur.next].removed = true;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = find_merge(symbols[cur.prev].id, cur.id)) {
        queue.push({pm->first, cur.prev, pm->second});
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = find_merge(cur.id, symbols[cur.next].id)) {
        queue.push({nm->first, top.pos, nm->second});
      }
    }
  }
}

void HfTokenizer::Impl::BpeUncached(absl::string_view word,
                                    std::vector<std::pair<int32_t, uint32_t>>* ids) const {
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids->push_back({it->second, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  std::vector<BpeSymbol> symbols = InitialSymbols(word);
  ApplyMerges(&symbols);
  for (const BpeSymbol& s : symbols) {
    if (!s.removed) ids->push_back({s.id, s.len});
  }
}

// The span of the input that bytes [start, end) of `p` come from.
std::pair<size_t, size_t> SpanOf(const Piece& p, size_t start, size_t end) {
  if (p.offsets.empty() || end <= start) return {0, 0};
  size_t lo = p.offsets[start], hi = p.offsets[start];
  for (size_t k = start; k < end; ++k) {
    lo = std::min<size_t>(lo, p.offsets[k]);
    hi = std::max<size_t>(hi, p.offsets[k]);
  }
  return {lo, hi + 1};
}

absl::Status HfTokenizer::Impl::EncodeSegment(Piece piece, std::vector<int32_t>* ids,
                                              std::vector<std::pair<size_t, size_t>>* spans) const {
  MEGATRAIN_RETURN_IF_ERROR(Normalize(&piece));
  std::vector<std::pair<Piece, int32_t>> parts;
  SplitAddedTokens(piece, /*normalized=*/true, &parts);
  std::vector<Piece> words;
  std::vector<std::pair<int32_t, uint32_t>> tokens;
  for (auto& [part, id] : parts) {
    if (id >= 0) {
      ids->push_back(id);
      if (spans != nullptr) spans->push_back(SpanOf(part, 0, part.text.size()));
      continue;
    }
    words.clear();
    MEGATRAIN_RETURN_IF_ERROR(PreTokenize(std::move(part), &words));
    for (const Piece& w : words) {
      tokens.clear();
      Bpe(w.text, &tokens);
      size_t pos = 0;
      for (const auto& [token_id, len] : tokens) {
        ids->push_back(token_id);
        if (spans != nullptr) spans->push_back(SpanOf(w, pos, pos + len));
        pos += len;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::EncodeAll(absl::string_view text, bool add_special_tokens,
                                          std::vector<int32_t>* ids,
                                          std::vector<std::pair<size_t, size_t>>* spans) const {
  const size_t bad = FindInvalidUtf8(text);
  if (bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 at byte ", bad));
  }
  if (text.size() >= (size_t{1} << 32)) {
    return absl::InvalidArgumentError("text: 4 GiB or more in one document");
  }
  Piece whole{std::string(text), true, {}};
  if (spans != nullptr) {
    whole.offsets.resize(text.size());
    for (size_t k = 0; k < text.size(); ++k) whole.offsets[k] = static_cast<uint32_t>(k);
  }
  std::vector<std::pair<Piece, int32_t>> parts;
  SplitAddedTokens(whole, /*normalized=*/false, &parts);
  std::vector<int32_t> body;
  std::vector<std::pair<size_t, size_t>> body_spans;
  body.reserve(text.size() / 3 + 4);
  body_spans.reserve(text.size() / 3 + 4);
  for (auto& [piece, id] : parts) {
    if (id >= 0) {
      body.push_back(id);
      if (spans != nullptr) body_spans.push_back(SpanOf(piece, 0, piece.text.size()));
    } else {
      MEGATRAIN_RETURN_IF_ERROR(
          EncodeSegment(std::move(piece), &body, spans != nullptr ? &body_spans : nullptr));
    }
  }
  if (!add_special_tokens || !has_template) {
    *ids = std::move(body);
    if (spans != nullptr) *spans = std::move(body_spans);
    return absl::OkStatus();
  }
  for (const auto& [is_sequence, special] : template_single) {
    if (is_sequence) {
      ids->insert(ids->end(), body.begin(), body.end());
      if (spans != nullptr) spans->insert(spans->end(), body_spans.begin(), body_spans.end());
    } else {
      ids->insert(ids->end(), special.begin(), special.end());
      if (spans != nullptr) {
        spans->insert(spans->end(), special.size(), std::pair<size_t, size_t>(0, 0));
      }
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

namespace {

// ByteLevel decoder: every token to bytes (a token with a char outside the
// table stays as its UTF-8), all joined, then lossy UTF-8.
void DecodeByteLevel(std::vector<std::string>* tokens) {
  const ByteLevelTable& table = ByteLevel();
  std::string bytes;
  for (const std::string& t : *tokens) {
    std::string tb;
    bool ok = true;
    for (size_t i = 0; i < t.size() && ok;) {
      size_t len = 0;
      const uint32_t cp = DecodeUtf8At(t, i, &len);
      auto it = table.char_to_byte.find(cp);
      if (it == table.char_to_byte.end())
        ok = false;
      else
        tb.push_back(static_cast<char>(it->second));
      i += len;
    }
    bytes += ok ? tb : t;
  }
  *tokens = {Utf8Lossy(bytes)};
}

// ByteFallback decoder: runs of <0xXX> tokens become their bytes, or one
// U+FFFD per byte when the run is not valid UTF-8.
void DecodeByteFallback(std::vector<std::string>* tokens) {
  std::vector<std::string> out;
  std::string pending;
  auto flush = [&]() {
    if (pending.empty()) return;
    if (FindInvalidUtf8(pending) == std::string::npos) {
      out.push_back(pending);
    } else {
      for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
    }
    pending.clear();
  };
  for (std::string& t : *tokens) {
    int byte = -1;
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      byte = std::stoi(t.substr(3, 2), nullptr, 16);
    }
    if (byte >= 0) {
      pending.push_back(static_cast<char>(byte));
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  *tokens = std::move(out);
}

// Strip decoder: up to strip_start leading and strip_stop trailing
// strip_char code points off every token.
void DecodeStrip(const DecoderStep& step, std::vector<std::string>* tokens) {
  for (std::string& t : *tokens) {
    std::vector<std::pair<size_t, uint32_t>> chars;  // (byte offset, code point)
    for (size_t i = 0; i < t.size();) {
      size_t len = 0;
      chars.push_back({i, DecodeUtf8At(t, i, &len)});
      i += len;
    }
    size_t start_cut = 0, stop_cut = chars.size();
    for (size_t k = 0; k < std::min(step.strip_start, chars.size()); ++k) {
      if (chars[k].second != step.strip_char) break;
      start_cut = k + 1;
    }
    for (size_t k = 0; k < std::min(step.strip_stop, chars.size()); ++k) {
      if (chars[chars.size() - 1 - k].second != step.strip_char) break;
      stop_cut = chars.size() - 1 - k;
    }
    if (start_cut >= stop_cut) {
      t.clear();
    } else {
      const size_t b0 = chars[start_cut].first;
      const size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b0, b1 - b0);
    }
  }
}

void DecodeStep(const DecoderStep& step, std::vector<std::string>* tokens) {
  using K = DecoderStep::Kind;
  switch (step.kind) {
    case K::kByteLevel:
      DecodeByteLevel(tokens);
      break;
    case K::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        const bool drop = i == 0 && step.prepend_scheme != PrependScheme::kNever;
        (*tokens)[i] = absl::StrReplaceAll((*tokens)[i], {{step.pattern, drop ? "" : " "}});
      }
      break;
    case K::kReplace:
      for (std::string& t : *tokens) t = absl::StrReplaceAll(t, {{step.pattern, step.content}});
      break;
    case K::kByteFallback:
      DecodeByteFallback(tokens);
      break;
    case K::kFuse:
      *tokens = {absl::StrJoin(*tokens, "")};
      break;
    case K::kStrip:
      DecodeStrip(step, tokens);
      break;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// HfTokenizer
// ---------------------------------------------------------------------------

bool HfTokenizer::LooksLikeHfTokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "tokenizer.json", ec);
  return absl::string_view(path).size() >= 5 &&
         absl::string_view(path).substr(path.size() - 5) == ".json";
}

absl::StatusOr<HfTokenizer> HfTokenizer::Load(const std::string& path) {
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  MEGATRAIN_ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(file));
  std::string config_json;
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    MEGATRAIN_ASSIGN_OR_RETURN(config_json, ReadFile(config_path));
  }
  return FromJson(tokenizer_json, config_json, file.string());
}

absl::StatusOr<HfTokenizer> HfTokenizer::FromJson(absl::string_view tokenizer_json,
                                                  absl::string_view config_json,
                                                  const std::string& source) {
  static std::atomic<uint64_t> next_cache_key{1};
  auto impl = std::make_shared<Impl>();
  impl->path = source;
  impl->cache_key = next_cache_key.fetch_add(1);
  const json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  json config;
  if (!config_json.empty()) {
    config = json::parse(config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tokenizer_config.json: not a JSON object"));
    }
  }
  absl::Status status;
  try {
    status = Build(j, config, impl.get());
  } catch (const json::exception& e) {
    // A missing field or one of the wrong type (nlohmann names it).
    status = absl::InvalidArgumentError(absl::StrCat("malformed: ", e.what()));
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(source, ": ", status.message()));
  }
  return HfTokenizer(std::move(impl));
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(absl::string_view text,
                                                         bool add_special_tokens) const {
  std::vector<int32_t> ids;
  MEGATRAIN_RETURN_IF_ERROR(impl_->EncodeAll(text, add_special_tokens, &ids, /*spans=*/nullptr));
  return ids;
}

absl::StatusOr<HfTokenizer::Encoding> HfTokenizer::EncodeWithOffsets(
    absl::string_view text, bool add_special_tokens) const {
  Encoding encoding;
  MEGATRAIN_RETURN_IF_ERROR(
      impl_->EncodeAll(text, add_special_tokens, &encoding.ids, &encoding.spans));
  return encoding;
}

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const int32_t> ids,
                                                bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() ||
        impl_->id_to_token[id].empty()) {
      return absl::OutOfRangeError(absl::StrCat("id ", id, " has no token in ", impl_->path));
    }
    if (skip_special_tokens && impl_->special_ids.contains(id)) continue;
    tokens.push_back(impl_->id_to_token[id]);
  }
  if (!impl_->has_decoder) return absl::StrJoin(tokens, " ");
  for (const DecoderStep& step : impl_->decoder) DecodeStep(step, &tokens);
  return absl::StrJoin(tokens, "");
}

std::optional<int32_t> HfTokenizer::TokenToId(absl::string_view token) const {
  auto it = impl_->added_ids.find(token);
  if (it != impl_->added_ids.end()) return it->second;
  it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }
int32_t HfTokenizer::bos_id() const { return impl_->bos_id; }
int32_t HfTokenizer::eos_id() const { return impl_->eos_id; }
int32_t HfTokenizer::pad_id() const { return impl_->pad_id; }
int32_t HfTokenizer::unk_id() const { return impl_->unk_id; }
const std::string& HfTokenizer::path() const { return impl_->path; }

}  // namespace megatrain::engine
