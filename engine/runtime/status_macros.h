// Small status helpers. Debian's Abseil (20220623) ships no status macros, so
// the project keeps its own: MEGATRAIN_RETURN_IF_ERROR and
// MEGATRAIN_ASSIGN_OR_RETURN, with the usual Abseil semantics.
#ifndef MEGATRAIN_ENGINE_STATUS_MACROS_H_
#define MEGATRAIN_ENGINE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define MEGATRAIN_STATUS_CONCAT_INNER_(a, b) a##b
#define MEGATRAIN_STATUS_CONCAT_(a, b) MEGATRAIN_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define MEGATRAIN_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    ::absl::Status megatrain_status_ = (expr);             \
    if (!megatrain_status_.ok()) return megatrain_status_; \
  } while (0)

// `MEGATRAIN_ASSIGN_OR_RETURN(auto x, Foo());` assigns the value of a
// StatusOr<T> or returns its status from the enclosing function.
#define MEGATRAIN_ASSIGN_OR_RETURN(lhs, rexpr)                                                   \
  MEGATRAIN_ASSIGN_OR_RETURN_IMPL_(MEGATRAIN_STATUS_CONCAT_(megatrain_statusor_, __LINE__), lhs, \
                                   rexpr)

#define MEGATRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = std::move(statusor).value()

namespace megatrain {

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping the code. OK stays OK. Add context once per layer.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace megatrain

#endif  // MEGATRAIN_ENGINE_STATUS_MACROS_H_
