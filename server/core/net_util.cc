// See net_util.h.
#include "server/core/net_util.h"

#include <arpa/inet.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace megatrain::server {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, absl::string_view flag) {
  HostPort result;
  absl::string_view port_text;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected [host]:port, got '", address, "'"));
    }
    result.host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected host:port (IPv6 as [host]:port), got '", address, "'"));
    }
    result.host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
  }
  if (result.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": missing host in '", address, "'"));
  }
  if (!absl::SimpleAtoi(port_text, &result.port) || result.port < 0 || result.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": port must be in [0, 65535], got '", port_text, "'"));
  }
  return result;
}

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost") return true;
  const std::string text(host);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

std::string FormatHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace megatrain::server
