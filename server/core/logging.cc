// See logging.h.
#include "server/core/logging.h"

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

std::string QuoteForError(absl::string_view input) {
  if (input.size() <= kMaxQuotedInputBytes) {
    return absl::StrCat("'", EscapeControlCharacters(input), "'");
  }
  // Cut on a UTF-8 character boundary so that the message stays valid.
  size_t end = kMaxQuotedInputBytes;
  while (end > 0 && (static_cast<unsigned char>(input[end]) & 0xC0) == 0x80) --end;
  return absl::StrCat("'", EscapeControlCharacters(input.substr(0, end)), "...' (", input.size(),
                      " bytes)");
}

void Log(LogLevel level, absl::string_view message) {
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   LevelName(level), " ", EscapeControlCharacters(message), "\n");
  std::lock_guard<std::mutex> lock(LogMutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace megatrain::server
