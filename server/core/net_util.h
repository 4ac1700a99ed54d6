// Listen-address helpers shared by the gRPC and /metrics listeners.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_NET_UTIL_H_
#define MEGATRAIN_SERVER_NET_UTIL_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace megatrain::server {

struct HostPort {
  std::string host;  // without brackets: "127.0.0.1", "::1", "localhost", "0.0.0.0"
  int port = 0;      // 0: pick a free port
};

// Parses "host:port" or "[v6]:port". INVALID_ARGUMENT naming `flag` for a
// missing host or port or a port outside [0, 65535].
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, absl::string_view flag);

// True for "localhost", 127.0.0.0/8 and ::1: addresses that only this
// machine can reach.
bool IsLoopbackHost(absl::string_view host);

// "host:port", bracketing IPv6 hosts.
std::string FormatHostPort(absl::string_view host, int port);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_NET_UTIL_H_
