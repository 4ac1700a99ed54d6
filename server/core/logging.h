// Minimal leveled logging for the daemon (Debian's Abseil 20220623 has no
// absl/log). Lines go to stderr as "<UTC time> <LEVEL> <message>".
//
// Every message is escaped (EscapeControlCharacters) before it is written:
// messages carry user-supplied strings (job names, labels, paths, error
// texts), and a name holding "\n...ERROR..." or a terminal escape sequence
// must not forge a log line or drive the operator's terminal.
//
// Thread-safety: all functions may be called from any thread; lines are
// written whole (one write per line under a mutex).
#ifndef MEGATRAIN_SERVER_LOGGING_H_
#define MEGATRAIN_SERVER_LOGGING_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/escape.h"

namespace megatrain::server {

enum class LogLevel { kInfo, kWarning, kError };

// `text` with every ASCII control character written as an escape
// (common/escape.h, shared with the CLI).
using ::megatrain::EscapeControlCharacters;

// Most bytes of a caller's input an error message quotes (QuoteForError).
inline constexpr size_t kMaxQuotedInputBytes = 256;

// `input` for an error message: in single quotes, control characters
// escaped, cut to kMaxQuotedInputBytes with "...(N bytes)" when longer.
std::string QuoteForError(absl::string_view input);

// Writes one line to stderr; control characters in `message` are escaped.
void Log(LogLevel level, absl::string_view message);

inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_LOGGING_H_
