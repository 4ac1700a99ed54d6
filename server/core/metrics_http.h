// MetricsHttpServer: serves GET /metrics (Prometheus text format 0.0.4) over
// plain HTTP with cpp-httplib. prometheus-cpp's own Exposer (civetweb) is
// not used: it fails to bind on the GPU machines (shared/DEVICE.md).
//
// Slow and idle clients (Note [Metrics listener limits]): connections are
// served by a fixed pool of max_connections threads, so a scrape finds a
// free thread while fewer than that many clients are connected, however
// slow they are; beyond it, new connections wait in the accept queue. A
// client that sends nothing for header_read_timeout is disconnected; a
// response write that makes no progress for write_timeout is abandoned; and
// every connection is closed once request_timeout has passed since a
// thread began serving it, whatever it sends: a client that trickles one byte just inside
// header_read_timeout holds a thread for at most request_timeout. Each
// connection serves one request (no keep-alive), so the deadline bounds a
// thread's whole time with one client.
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
#include "absl/time/time.h"
#include "server/core/metrics.h"

namespace httplib {
class Server;
}

namespace megatrain::server {

struct MetricsHttpOptions {
  // Threads serving connections: the most connections served at once.
  int max_connections = 32;
  // A connection that sends nothing for this long while its request is read
  // (or between keep-alive requests) is closed. Why 2 s: a scraper sends
  // its request at once; 2 s covers a loaded machine.
  absl::Duration header_read_timeout = absl::Seconds(2);
  // A response write that makes no progress for this long is abandoned.
  absl::Duration write_timeout = absl::Seconds(5);
  // A connection is closed this long after a thread began serving it,
  // request read or not, response written or not. Why 5 s: a scrape (a few hundred bytes
  // in, tens of KiB out) takes milliseconds; Prometheus' default scrape
  // timeout is 10 s, so a scrape that would miss 5 s is lost anyway.
  absl::Duration request_timeout = absl::Seconds(5);
};

class MetricsHttpServer {
 public:
  // Binds `listen` ("host:port"; port 0 picks a free one) and starts serving
  // /metrics. UNAVAILABLE when the address cannot be bound (also when another
  // process listens on it: no SO_REUSEPORT); INVALID_ARGUMENT for a
  // malformed address (naming --metrics_listen) or options.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  ServerMetrics* metrics,
                                                                  MetricsHttpOptions options = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }
  // Stops serving and joins the listener thread. Idempotent.
  void Stop();

 private:
  class DeadlineServer;

  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_METRICS_HTTP_H_
