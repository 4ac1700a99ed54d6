// See metrics_http.h.
#include "server/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/net_util.h"

namespace megatrain::server {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, ServerMetrics* metrics) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen, "--metrics_listen");
  if (!address.ok()) return address.status();
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<httplib::Server>();
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
    return absl::InternalError(absl::StrCat("--metrics_listen: ", listen, ": listener did not start"));
  }
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace megatrain::server
