// EscapeControlCharacters: text from another user made safe to print. Used
// by the daemon's log (server/core/logging.h) and by the CLI's human output
// (client/output.h, Printable), so that a job name holding "\n" or a
// terminal escape sequence can forge neither a log line nor a table row,
// nor drive the reader's terminal. Header-only and free of the server and
// the client, so that both include it without linking each other.
//
// Thread-safety: a pure function.
#ifndef MEGATRAIN_COMMON_ESCAPE_H_
#define MEGATRAIN_COMMON_ESCAPE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain {

// `text` with every ASCII control character (0x00-0x1f, 0x7f, ESC
// included) written as an escape: \n, \r, \t, or \xNN. Other bytes (UTF-8
// included) are kept.
inline std::string EscapeControlCharacters(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    }
  }
  return out;
}

}  // namespace megatrain

#endif  // MEGATRAIN_COMMON_ESCAPE_H_
