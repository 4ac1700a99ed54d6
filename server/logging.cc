// See logging.h.
#include "server/logging.h"

#include <cstdio>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace megatrain::server {
namespace {

std::mutex& LogMutex() {
  static std::mutex* mu = new std::mutex();  // never destroyed: usable at exit
  return *mu;
}

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

}  // namespace

void Log(LogLevel level, absl::string_view message) {
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " ", LevelName(level), " ", message, "\n");
  std::lock_guard<std::mutex> lock(LogMutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace megatrain::server
