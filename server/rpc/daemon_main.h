// The megatraind command line: flags -> DaemonOptions, start, wait for
// SIGTERM/SIGINT, drain, exit. Lives in the library so that server/main.cc
// stays a one-liner.
//
// Flags (see docs/api.md, "Running the daemon"):
//   --listen=127.0.0.1:50051       gRPC address
//   --metrics_listen=127.0.0.1:9400  /metrics address ("" or "off" disables)
//   --state_dir=DIR                  required
//   --device=auto|cpu|cuda|cuda:N[,...]
//   --host_memory_budget=SIZE        e.g. 512GiB; default 80% of RAM
//   --auth_tokens=FILE  --tls_cert=PEM --tls_key=PEM --tls_client_ca=PEM
//   --max_running_jobs_per_user=N --max_devices_per_user=N
//   --max_queued_jobs_per_user=N
//   --max_queued_jobs=N --preemption --shutdown_timeout=SECONDS
//   --measure_link_bandwidth=true|false
//   --data_roots=DIR[,DIR] --output_roots=DIR[,DIR] --audit_log=FILE|off
//   --max_message_bytes=SIZE --max_threads=N --max_watch_streams=N
//   --allow_cleartext_tokens
//
// Signals: SIGTERM and SIGINT drain and exit (below). SIGHUP is logged and
// otherwise ignored: nothing is reloaded (restart to change flags or the
// tokens file). SIGPIPE is ignored.
//
// On start it prints one line to stdout, for scripts:
//   megatraind: ready grpc=127.0.0.1:50051 metrics=127.0.0.1:9400
// and logs to stderr. Exit codes: 0 after a clean SIGTERM/SIGINT drain;
// 1 when it cannot start (the reason on stderr); 2 for bad flags; 3 when
// jobs did not stop within --shutdown_timeout.
#ifndef MEGATRAIN_SERVER_DAEMON_MAIN_H_
#define MEGATRAIN_SERVER_DAEMON_MAIN_H_

#include <functional>
#include <memory>

#include "server/core/engine_backend.h"

namespace megatrain::server {

// Runs megatraind. `make_backend` is called once, after the flags parse.
// Must be called from main() before any other thread exists (it blocks
// SIGTERM/SIGINT/SIGHUP in all threads and waits for them with sigwait).
int RunDaemonMain(int argc, char** argv,
                  const std::function<std::unique_ptr<EngineBackend>()>& make_backend);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_DAEMON_MAIN_H_
