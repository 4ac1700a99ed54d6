// megatrain-loadtest: the control-plane load benchmark (client/loadtest.h).
//
//   megatrain-loadtest --server 127.0.0.1:50051 [--token T] [--clients 64]
//     [--seconds 60] [--watch_fraction 0.25] [--daemon_pid PID] [--job ID]
//     [--baseline_seconds 10] [--watch_hold_seconds 5] [--poll_interval_ms 0]
//     [--json] [--tls_ca PEM ...]
//
// Prints the report (or JSON with --json) on stdout, progress on stderr.
// Exit codes: 0 the benchmark ran (whatever it measured); 1 it could not
// (no running job, daemon unreachable); 2 bad flags.
#include <algorithm>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/time/time.h"
#include "client/loadtest.h"

int main(int argc, char** argv) {
  using megatrain::client::LoadTestOptions;
  LoadTestOptions options;
  double seconds = 60, baseline_seconds = 10, watch_hold_seconds = 5, poll_interval_ms = 0;
  bool json = false;
  CLI::App app{
      "megatrain-loadtest: concurrent ListJobs/GetJob/WatchJob clients against "
      "megatraind while a job trains"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("megatrain-loadtest ") + MEGATRAIN_VERSION);
  app.add_option("--server", options.connection.server, "Daemon address host:port")
      ->envname("MEGATRAIN_SERVER");
  app.add_option("--token", options.connection.token, "Bearer token")->envname("MEGATRAIN_TOKEN");
  app.add_option("--tls_ca", options.connection.tls_ca, "PEM roots (enables TLS)");
  app.add_option("--tls_cert", options.connection.tls_cert, "PEM client certificate (mTLS)");
  app.add_option("--tls_key", options.connection.tls_key, "PEM client key (mTLS)");
  app.add_option("--clients", options.clients, "Concurrent clients, each on its own connection");
  app.add_option("--seconds", seconds, "Length of the load phase");
  app.add_option("--watch_fraction", options.watch_fraction,
                 "Share of the clients that follow the job with WatchJob");
  app.add_option("--watch_hold_seconds", watch_hold_seconds,
                 "A watcher hangs up after about this long and reconnects");
  app.add_option("--job", options.job_id, "Job to poll and watch (default: newest RUNNING)");
  app.add_option("--daemon_pid", options.daemon_pid,
                 "megatraind's pid: report its RSS, threads and CPU from /proc");
  app.add_option("--poll_interval_ms", poll_interval_ms,
                 "Each polling client calls once per interval (0: closed loop, a stress test)");
  app.add_option("--baseline_seconds", baseline_seconds,
                 "Throughput is measured alone for this long first");
  app.add_option("--client_nice", options.client_nice,
                 "Nice value of the client threads, 0-19 (on the daemon's machine: keeps the "
                 "clients' own CPU use from counting against the job)");
  app.add_flag("--json", json, "Print the report as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (seconds <= 0 || baseline_seconds <= 0 || watch_hold_seconds <= 0) {
    std::cerr << "megatrain-loadtest: --seconds, --baseline_seconds and --watch_hold_seconds "
                 "must be > 0\n";
    return 2;
  }
  options.duration = absl::Seconds(seconds);
  options.baseline = absl::Seconds(baseline_seconds);
  options.watch_hold = absl::Seconds(watch_hold_seconds);
  options.poll_interval = absl::Milliseconds(std::max(poll_interval_ms, 0.0));
  absl::StatusOr<megatrain::client::LoadTestReport> report =
      megatrain::client::RunLoadTest(options, std::cerr);
  if (!report.ok()) {
    std::cerr << "megatrain-loadtest: " << report.status().ToString() << "\n";
    return absl::IsInvalidArgument(report.status()) ? 2 : 1;
  }
  if (json) {
    std::cout << megatrain::client::LoadTestReportToJson(*report).dump(2) << "\n";
  } else {
    std::cout << megatrain::client::FormatLoadTestReport(*report);
  }
  return 0;
}
