// See metrics_http.h.
#include "server/core/metrics_http.h"

// httplib's default listen backlog is 5: a burst of connections (16 slow
// clients, then a scrape) overflowed the kernel's accept queue and the
// scrape's SYN waited for a retransmit (1 s). 128 is the kernel's classic
// SOMAXCONN; connections beyond the worker threads wait in it, not in SYN
// retries.
#define CPPHTTPLIB_LISTEN_BACKLOG 128
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/net_util.h"

namespace megatrain::server {

namespace {

// httplib takes timeouts as (seconds, microseconds).
std::pair<time_t, time_t> SecondsAndMicros(absl::Duration duration) {
  const int64_t micros = absl::ToInt64Microseconds(duration);
  return {static_cast<time_t>(micros / 1'000'000), static_cast<time_t>(micros % 1'000'000)};
}

// Waits up to `timeout` (at least 1 ms when positive) for `events` on
// `sock`; true when they are there.
bool PollFor(int sock, short events, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return false;
  const int timeout_ms = static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))), 1, int64_t{1} << 30));
  pollfd entry{sock, events, 0};
  int ready;
  do {
    ready = ::poll(&entry, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  return ready > 0 && (entry.revents & (events | POLLHUP | POLLERR)) != 0;
}

// "ip", port of a socket address (IPv4 or IPv6).
void AddressOf(const sockaddr_storage& address, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    port = ntohs(v6.sin6_port);
  }
  ip = text;
}

// A connection's socket whose every read and write ends by `deadline`, as
// well as within the per-operation timeouts. Used by DeadlineServer only.
class DeadlineSocketStream final : public httplib::Stream {
 public:
  DeadlineSocketStream(int sock, absl::Time deadline, absl::Duration read_timeout,
                       absl::Duration write_timeout)
      : sock_(sock),
        deadline_(deadline),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  bool is_readable() const override { return PollFor(sock_, POLLIN, ReadWait()); }
  bool is_writable() const override { return PollFor(sock_, POLLOUT, WriteWait()); }

  ssize_t read(char* ptr, size_t size) override {
    if (!is_readable()) return -1;
    ssize_t received;
    do {
      received = ::recv(sock_, ptr, size, 0);
    } while (received < 0 && errno == EINTR);
    return received;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t sent;
    do {
      sent = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      AddressOf(address, ip, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      AddressOf(address, ip, port);
    }
  }
  socket_t socket() const override { return sock_; }

 private:
  absl::Duration ReadWait() const { return std::min(read_timeout_, deadline_ - absl::Now()); }
  absl::Duration WriteWait() const { return std::min(write_timeout_, deadline_ - absl::Now()); }

  const int sock_;
  const absl::Time deadline_;
  const absl::Duration read_timeout_;
  const absl::Duration write_timeout_;
};

}  // namespace

// An httplib server that serves one request per connection and closes it
// request_timeout after a thread began serving it (Note [Metrics listener
// limits]).
// httplib times each read and write but not a request as a whole; it lets
// a subclass replace the per-connection loop (its TLS server does) and
// hands the parsed request to the handlers through process_request.
class MetricsHttpServer::DeadlineServer final : public httplib::Server {
 public:
  explicit DeadlineServer(const MetricsHttpOptions& options) : options_(options) {}

 private:
  // Called by httplib on a pool thread for each accepted connection.
  bool process_and_close_socket(socket_t sock) override {
    DeadlineSocketStream stream(sock, absl::Now() + options_.request_timeout,
                                options_.header_read_timeout, options_.write_timeout);
    bool connection_closed = false;
    const bool served = process_request(stream, /*close_connection=*/true, connection_closed,
                                        /*setup_request=*/nullptr);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return served;
  }

  const MetricsHttpOptions options_;
};

// Note [Metrics listener limits]
// /metrics is served to anyone who can reach --metrics_listen, so a client
// must not be able to starve Prometheus: every connection gets one thread
// of a fixed pool (httplib's default pool has max(8, cores - 1) threads and
// an idle client holds one until its read times out, 5 s by default), and
// reads and writes have short timeouts, and each connection serves one
// request within request_timeout of its accept (DeadlineServer), so that
// no client keeps a thread longer, however it paces its bytes.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, ServerMetrics* metrics, MetricsHttpOptions options) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen, "--metrics_listen");
  if (!address.ok()) return address.status();
  if (options.max_connections < 1 || options.header_read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration() ||
      options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics listener: max_connections and the timeouts must be positive");
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<DeadlineServer>(options);
  const int threads = options.max_connections;
  server->http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  const auto [read_s, read_us] = SecondsAndMicros(options.header_read_timeout);
  server->http_->set_read_timeout(read_s, read_us);
  const auto [write_s, write_us] = SecondsAndMicros(options.write_timeout);
  server->http_->set_write_timeout(write_s, write_us);
  server->http_->set_payload_max_length(4096);  // GET only: no body is needed
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would
  // let a second daemon bind the same port silently.
  server->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->http_->Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->TextExposition(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("megatraind: metrics at /metrics\n", "text/plain");
  });
  if (address->port == 0) {
    server->port_ = server->http_->bind_to_any_port(address->host);
    if (server->port_ < 0) {
      return absl::UnavailableError(
          absl::StrCat("--metrics_listen: cannot bind ", address->host, " (any port)"));
    }
  } else {
    if (!server->http_->bind_to_port(address->host, address->port)) {
      return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot bind ", listen,
                                                 " (in use or not a local address?)"));
    }
    server->port_ = address->port;
  }
  httplib::Server* http = server->http_.get();
  server->thread_ = std::thread([http] { http->listen_after_bind(); });
  // httplib's stop() is a no-op until the listener thread has marked itself
  // running, and it offers no readiness notification: wait (bounded, ~5 s)
  // so that a Stop() right after Start() cannot be lost.
  for (int attempt = 0; attempt < 5000 && !http->is_running(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!http->is_running()) {
    return absl::InternalError(
        absl::StrCat("--metrics_listen: ", listen, ": listener did not start"));
  }
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace megatrain::server
