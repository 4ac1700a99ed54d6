// See metrics_http.h.
#include "server/metrics_http.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "server/net_util.h"

namespace megatrain::server {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, ServerMetrics* metrics) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen, "--metrics_listen");
  if (!address.ok()) return address.status();
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<httplib::Server>();
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
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace megatrain::server
