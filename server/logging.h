// Minimal leveled logging for the daemon (Debian's Abseil 20220623 has no
// absl/log). Lines go to stderr as "<UTC time> <LEVEL> <message>".
//
// Thread-safety: all functions may be called from any thread; lines are
// written whole (one write per line under a mutex).
#ifndef MEGATRAIN_SERVER_LOGGING_H_
#define MEGATRAIN_SERVER_LOGGING_H_

#include "absl/strings/string_view.h"

namespace megatrain::server {

enum class LogLevel { kInfo, kWarning, kError };

// Writes one line to stderr.
void Log(LogLevel level, absl::string_view message);

inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_LOGGING_H_
