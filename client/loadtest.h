// The control-plane load benchmark behind `megatrain-loadtest`: N
// concurrent clients, each on its own gRPC connection, call ListJobs and
// GetJob in a closed loop, or follow a job with WatchJob and hang up after
// a while (reconnect churn), against a daemon whose job trains meanwhile.
// It reports per method the calls, errors (by code) and p50/p99/max
// latency; the daemon's resident memory, peak memory, thread count and CPU
// time before and after (from /proc/<pid>, when the daemon's pid is given);
// the watched job's training throughput (tokens/s from GetJob's progress)
// before and during the load; and whether every WatchJob stream was freed
// afterwards (the megatrain_watch_streams gauge).
//
// It is a benchmark, not a test: it asserts nothing and exits 0 whenever it
// could run (docs/performance.md, "Control-plane load").
//
// Thread-safety: RunLoadTest starts and joins its own threads; call it from
// one thread.
#ifndef MEGATRAIN_CLIENT_LOADTEST_H_
#define MEGATRAIN_CLIENT_LOADTEST_H_

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"

namespace megatrain::client {

struct LoadTestOptions {
  // Address, token and TLS of the daemon (ConnectionOptions.own_connection
  // is set for every client).
  ConnectionOptions connection;
  // Concurrent clients (>= 1).
  int clients = 64;
  // Length of the load phase.
  absl::Duration duration = absl::Seconds(60);
  // Share of the clients that watch (WatchJob) instead of polling, [0, 1].
  double watch_fraction = 0.25;
  // A watcher hangs up after this long and reconnects (from seq 0).
  absl::Duration watch_hold = absl::Seconds(5);
  // Job to GetJob and watch; empty: the newest RUNNING job (NOT_FOUND when
  // there is none).
  std::string job_id;
  // megatraind's pid for /proc/<pid>/status and stat; 0: not measured.
  int daemon_pid = 0;
  // Throughput is measured over this long before the load starts.
  absl::Duration baseline = absl::Seconds(10);
  // Deadline of each unary call.
  absl::Duration call_timeout = absl::Seconds(10);
  // A polling client calls once per interval (fixed rate); zero: a closed
  // loop, the next call as soon as the previous one returns (a stress test).
  absl::Duration poll_interval = absl::ZeroDuration();
  // Nice value of the client threads, in [0, 19]. On the daemon's own
  // machine the clients stand in for users on other machines; niced, their
  // own CPU use does not count against the job (0: compete equally).
  int client_nice = 19;
};

// Latency and errors of one method.
struct MethodReport {
  int64_t calls = 0;   // finished calls (WatchJob: streams opened)
  int64_t errors = 0;  // calls that did not end OK (WatchJob: the hang-ups
                       // the client made itself do not count)
  std::map<std::string, int64_t> errors_by_code;  // "UNAVAILABLE" -> n
  std::string first_error;                        // code and message of one
  // Latency in milliseconds (WatchJob: until the first event arrived).
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

// /proc/<pid> numbers of the daemon.
struct ProcessSample {
  int64_t rss_bytes = 0;       // VmRSS
  int64_t peak_rss_bytes = 0;  // VmHWM
  int64_t threads = 0;         // Threads
  double cpu_seconds = 0;      // utime + stime
};

struct LoadTestReport {
  std::string job_id;
  int clients = 0;
  int watchers = 0;
  double seconds = 0;                           // load phase as run
  std::map<std::string, MethodReport> methods;  // "ListJobs", "GetJob", "WatchJob"
  int64_t watch_events = 0;                     // events received by all watchers
  bool measured_process = false;
  ProcessSample process_before;
  ProcessSample process_after;
  double daemon_cpu_cores_during = 0;  // CPU seconds per second in the load phase
  double client_cpu_cores_during = 0;  // this process's CPU per second (the clients)
  double poll_interval_ms = 0;         // as configured; 0: closed loop
  double tokens_per_s_before = 0;      // from progress.tokens over `baseline`
  double tokens_per_s_during = 0;      // over the load phase
  double steps_per_s_before = 0;       // from progress.step over `baseline` (idle)
  double steps_per_s_during = 0;       // over the load phase
  int client_nice = 0;                 // as configured
  int64_t watch_streams_after = -1;    // megatrain_watch_streams once all hung up
};

// Runs the benchmark; progress notes go to `log`. NOT_FOUND when no job
// runs (and none was named); FAILED_PRECONDITION when the named job is not
// RUNNING; INVALID_ARGUMENT for bad options; errors of the first GetJob.
absl::StatusOr<LoadTestReport> RunLoadTest(const LoadTestOptions& options, std::ostream& log);

// Human-readable report (a table per method, then memory and throughput).
std::string FormatLoadTestReport(const LoadTestReport& report);
nlohmann::json LoadTestReportToJson(const LoadTestReport& report);

// Reads /proc/<pid>/status and /proc/<pid>/stat. NOT_FOUND when the process
// is gone.
absl::StatusOr<ProcessSample> SampleProcess(int pid);

// The value at quantile `q` in [0, 1] of `sorted` (nearest rank); 0 when
// empty.
double Quantile(const std::vector<double>& sorted, double q);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_LOADTEST_H_
