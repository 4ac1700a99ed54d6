// A keyword field's words: one table of {keyword, value} per enum of the
// job spec (Note [Spec field table] in spec_fields.h), from which its
// name, its parser and the error listing the allowed keywords all come,
// so that a keyword is spelled in one place. Torch-free, header-only.
//
// Example:
//   inline constexpr Keyword<NanPolicy> kNanPolicyKeywords[] = {
//       {"skip", NanPolicy::kSkip}, {"fail", NanPolicy::kFail}};
//   KeywordName(kNanPolicyKeywords, NanPolicy::kFail)   // "fail"
//   ParseKeyword(kNanPolicyKeywords, "retry", "train.nan_policy")
//     // INVALID_ARGUMENT "train.nan_policy: must be skip or fail, got 'retry'"
//
// Thread-safety: constant tables and pure functions.
#ifndef MEGATRAIN_ENGINE_SPEC_KEYWORD_H_
#define MEGATRAIN_ENGINE_SPEC_KEYWORD_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

// One keyword of a field and the value it stands for.
template <typename T>
struct Keyword {
  const char* word;
  T value;
};

// The keyword of `value` in `table`; nullptr for a value the table lacks
// (an enum made by casting an integer).
template <typename T, size_t N>
constexpr const char* KeywordName(const Keyword<T> (&table)[N], const T& value) {
  for (const Keyword<T>& keyword : table) {
    if (keyword.value == value) return keyword.word;
  }
  return nullptr;
}

// "a, b or c": the table's keywords in order, for messages.
template <typename T, size_t N>
std::string KeywordList(const Keyword<T> (&table)[N]) {
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == N ? " or " : ", ", table[i].word);
  }
  return list;
}

// "must be a, b or c, got '<text>'", quoting at most 32 bytes of `text`
// with control and non-ASCII bytes escaped (a caller's string is echoed
// bounded and printable).
template <typename T, size_t N>
std::string KeywordError(const Keyword<T> (&table)[N], absl::string_view text) {
  constexpr size_t kQuotedBytes = 32;
  return absl::StrCat("must be ", KeywordList(table), ", got '",
                      absl::CHexEscape(text.substr(0, kQuotedBytes)),
                      text.size() > kQuotedBytes ? "...'" : "'");
}

// The value of keyword `text` (exact, case-sensitive). INVALID_ARGUMENT
// "<field>: must be a, b or c, got '<text>'" for any other text.
template <typename T, size_t N>
absl::StatusOr<T> ParseKeyword(const Keyword<T> (&table)[N], absl::string_view text,
                               absl::string_view field) {
  for (const Keyword<T>& keyword : table) {
    if (text == keyword.word) return keyword.value;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", KeywordError(table, text)));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_KEYWORD_H_
