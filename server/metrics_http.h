// MetricsHttpServer: serves GET /metrics (Prometheus text format 0.0.4) over
// plain HTTP with cpp-httplib. prometheus-cpp's own Exposer (civetweb) is
// not used: it fails to bind on the GPU machines (shared/DEVICE.md).
//
// Thread-safety: Start/Stop from one thread; requests are served on
// httplib's worker threads. Ownership: owns its listener thread; the
// destructor stops and joins it. `metrics` must outlive the server.
#ifndef MEGATRAIN_SERVER_METRICS_HTTP_H_
#define MEGATRAIN_SERVER_METRICS_HTTP_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace megatrain::server {

class MetricsHttpServer {
 public:
  // Binds `listen` ("host:port"; port 0 picks a free one) and starts serving
  // /metrics. UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT
  // for a malformed address (naming --metrics_listen).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  ServerMetrics* metrics);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }
  // Stops serving and joins the listener thread. Idempotent.
  void Stop();

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_METRICS_HTTP_H_
