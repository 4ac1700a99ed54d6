// See metrics_http.h.
#include "server/core/metrics_http.h"

// httplib's default listen backlog is 5: a burst of connections (16 slow
// clients, then a scrape) overflowed the kernel's accept queue and the
// scrape's SYN waited for a retransmit (1 s). 128 is the kernel's classic
// SOMAXCONN; connections beyond the worker threads wait in it, not in SYN
// retries.
#define CPPHTTPLIB_LISTEN_BACKLOG 128
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
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

}  // namespace

// Note [Metrics listener limits]
// /metrics is served to anyone who can reach --metrics_listen, so a client
// must not be able to starve Prometheus: every connection gets one thread
// of a fixed pool (httplib's default pool has max(8, cores - 1) threads and
// an idle client holds one until its read times out, 5 s by default), and
// reads and writes have short timeouts. Keep-alive connections are closed
// after kMaxKeepAliveRequests requests so that no client keeps a thread
// for good.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, ServerMetrics* metrics, MetricsHttpOptions options) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen, "--metrics_listen");
  if (!address.ok()) return address.status();
  if (options.max_connections < 1 || options.header_read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics listener: max_connections and the timeouts must be positive");
  }
  // Requests one keep-alive connection may make before it is closed.
  constexpr size_t kMaxKeepAliveRequests = 100;
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<httplib::Server>();
  const int threads = options.max_connections;
  server->http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  const auto [read_s, read_us] = SecondsAndMicros(options.header_read_timeout);
  server->http_->set_read_timeout(read_s, read_us);
  const auto [write_s, write_us] = SecondsAndMicros(options.write_timeout);
  server->http_->set_write_timeout(write_s, write_us);
  server->http_->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options.header_read_timeout)));
  server->http_->set_keep_alive_max_count(kMaxKeepAliveRequests);
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
