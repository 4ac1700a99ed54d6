// See loadtest.h.
#include "client/loadtest.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::client {
namespace {

using nlohmann::json;

// What one client thread measured; merged at the end.
struct ClientResult {
  std::map<std::string, std::vector<double>> latency_ms;  // by method
  std::map<std::string, int64_t> calls;
  std::map<std::string, std::map<std::string, int64_t>> errors;  // method -> code -> n
  std::map<std::string, std::string> first_error;
  int64_t watch_events = 0;
};

void RecordCall(ClientResult* result, const std::string& method, absl::Duration took,
                const grpc::Status& status) {
  ++result->calls[method];
  result->latency_ms[method].push_back(absl::ToDoubleMilliseconds(took));
  if (!status.ok()) {
    const std::string code =
        std::string(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())));
    ++result->errors[method][code];
    if (result->first_error[method].empty()) {
      result->first_error[method] = absl::StrCat(code, ": ", status.error_message());
    }
  }
}

// A polling client: ListJobs and GetJob alternately, one per `interval`, or
// as fast as answers come when it is zero.
void PollLoop(Connection& connection, const std::string& job_id, absl::Time end,
              absl::Duration call_timeout, absl::Duration interval, ClientResult* result) {
  absl::Time next = absl::Now();
  v1::ListJobsRequest list;
  list.set_page_size(20);
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  bool list_next = true;
  while (absl::Now() < end) {
    auto context = connection.NewContext(call_timeout);
    const absl::Time start = absl::Now();
    grpc::Status status;
    if (list_next) {
      v1::ListJobsResponse response;
      status = connection.jobs().ListJobs(context.get(), list, &response);
      RecordCall(result, "ListJobs", absl::Now() - start, status);
    } else {
      v1::Job response;
      status = connection.jobs().GetJob(context.get(), get, &response);
      RecordCall(result, "GetJob", absl::Now() - start, status);
    }
    list_next = !list_next;
    if (interval > absl::ZeroDuration()) {
      // Fixed rate: a slow answer does not push later calls back.
      next += interval;
      const absl::Time now = absl::Now();
      if (next > now) absl::SleepFor(std::min(next, end) - now);
    }
  }
}

// A watching client: WatchJob from seq 0 (the whole history, like `megatrain
// watch`), read for about `hold`, hang up, reconnect. A stream is held at
// least until its first event (or `call_timeout` without one: an error).
void WatchLoop(Connection& connection, const std::string& job_id, absl::Time end,
               absl::Duration hold, absl::Duration call_timeout, uint32_t seed,
               ClientResult* result) {
  std::mt19937 random(seed);
  // Spread the hang-ups: each stream lives [0.5, 1.5) x hold.
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  while (absl::Now() < end) {
    auto context = connection.NewContext(absl::InfiniteDuration());
    const absl::Time start = absl::Now();
    const absl::Time hang_up = std::min(end, start + jitter(random) * hold);
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    auto reader = connection.jobs().WatchJob(context.get(), request);
    // Reading blocks; a helper thread hangs up at `hang_up` once the first
    // event came, or at start + call_timeout without one.
    std::atomic<bool> done{false};
    std::atomic<bool> got_first{false};
    std::thread canceller([&] {
      while (!done.load()) {
        const absl::Time now = absl::Now();
        if (got_first.load() ? now >= hang_up : now >= start + call_timeout) {
          context->TryCancel();
          return;
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
      // The stream ended by itself: its status stands.
    });
    v1::JobEvent event;
    absl::Duration first_latency = absl::ZeroDuration();
    while (reader->Read(&event)) {
      if (!got_first.load()) {
        first_latency = absl::Now() - start;
        got_first.store(true);
      }
      ++result->watch_events;
    }
    done.store(true);
    canceller.join();
    grpc::Status status = reader->Finish();
    if (!got_first.load()) {
      if (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED) {
        status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no event within the timeout");
      }
      first_latency = absl::Now() - start;
    } else if (status.error_code() == grpc::StatusCode::CANCELLED) {
      status = grpc::Status::OK;  // our own hang-up
    }
    RecordCall(result, "WatchJob", first_latency, status);
    // A refused stream (RESOURCE_EXHAUSTED, ...) is retried after a pause,
    // as `megatrain watch` does, not in a tight loop.
    if (!status.ok()) absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<v1::Job> GetJob(Connection& connection, const std::string& job_id,
                               absl::Duration timeout) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::Status status =
      connection.jobs().GetJob(connection.NewContext(timeout).get(), request, &job);
  if (!status.ok()) return FromGrpcStatus(status);
  return job;
}

// megatrain_watch_streams through GetMetrics; -1 when absent.
int64_t WatchStreams(Connection& connection, absl::Duration timeout) {
  v1::GetMetricsRequest request;
  request.set_name_prefix("megatrain_watch_streams");
  v1::GetMetricsResponse response;
  if (!connection.server()
           .GetMetrics(connection.NewContext(timeout).get(), request, &response)
           .ok()) {
    return -1;
  }
  for (const v1::MetricFamily& family : response.families()) {
    if (family.name() == "megatrain_watch_streams" && family.samples_size() > 0) {
      return static_cast<int64_t>(family.samples(0).value());
    }
  }
  return -1;
}

// CPU time of this process (all threads), seconds.
double SelfCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

}  // namespace

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

absl::StatusOr<ProcessSample> SampleProcess(int pid) {
  ProcessSample sample;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  if (!status) return absl::NotFoundError(absl::StrCat("process ", pid, " not found"));
  std::string line;
  while (std::getline(status, line)) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
    if (fields.size() < 2) continue;
    int64_t value = 0;
    if (!absl::SimpleAtoi(fields[1], &value)) continue;
    if (fields[0] == "VmRSS") sample.rss_bytes = value * 1024;  // kB
    if (fields[0] == "VmHWM") sample.peak_rss_bytes = value * 1024;
    if (fields[0] == "Threads") sample.threads = value;
  }
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces, in parentheses):
  // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
  const size_t close = text.rfind(')');
  if (close != std::string::npos) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
    int64_t utime = 0, stime = 0;
    if (fields.size() > 13 && absl::SimpleAtoi(fields[11], &utime) &&
        absl::SimpleAtoi(fields[12], &stime)) {
      sample.cpu_seconds = static_cast<double>(utime + stime) / ::sysconf(_SC_CLK_TCK);
    }
  }
  return sample;
}

namespace {

absl::Status CheckOptions(const LoadTestOptions& options) {
  if (options.clients < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--clients: must be >= 1, got ", options.clients));
  }
  if (options.watch_fraction < 0 || options.watch_fraction > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--watch_fraction: must be in [0, 1], got ", options.watch_fraction));
  }
  if (options.client_nice < 0 || options.client_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client_nice: must be in [0, 19], got ", options.client_nice));
  }
  return absl::OkStatus();
}

// `job_id`, or the newest RUNNING job's id (NOT_FOUND when none).
absl::StatusOr<std::string> JobToMeasure(Connection& main, const std::string& job_id,
                                         absl::Duration timeout) {
  if (!job_id.empty()) return job_id;
  v1::ListJobsRequest request;
  request.add_states(v1::JOB_STATE_RUNNING);
  request.set_page_size(1);
  v1::ListJobsResponse response;
  grpc::Status status = main.jobs().ListJobs(main.NewContext(timeout).get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  if (response.jobs_size() == 0) {
    return absl::NotFoundError("no RUNNING job to measure; submit one or pass --job");
  }
  return response.jobs(0).id();
}

// Where the job's progress stood at one moment.
struct ProgressMark {
  absl::Time time;
  int64_t tokens = 0;
  int64_t step = 0;
};

absl::StatusOr<ProgressMark> MarkProgress(Connection& main, const std::string& job_id,
                                          absl::Duration timeout) {
  absl::StatusOr<v1::Job> job = GetJob(main, job_id, timeout);
  if (!job.ok()) return job.status();
  return ProgressMark{absl::Now(), job->progress().tokens(), job->progress().step()};
}

// Tokens/s and steps/s between two marks.
void Rates(const ProgressMark& from, const ProgressMark& to, double* tokens_per_s,
           double* steps_per_s) {
  const double seconds = std::max(absl::ToDoubleSeconds(to.time - from.time), 1e-9);
  *tokens_per_s = static_cast<double>(to.tokens - from.tokens) / seconds;
  *steps_per_s = static_cast<double>(to.step - from.step) / seconds;
}

// The job alone for `baseline`: fills the *_before rates.
absl::Status MeasureBaseline(Connection& main, const LoadTestOptions& options,
                             LoadTestReport* report, std::ostream& log) {
  absl::StatusOr<v1::Job> job = GetJob(main, report->job_id, options.call_timeout);
  if (!job.ok()) return job.status();
  if (job->state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", report->job_id, " is not RUNNING; the load test measures a training job"));
  }
  log << "measuring " << report->job_id << " alone for " << absl::FormatDuration(options.baseline)
      << "\n";
  absl::StatusOr<ProgressMark> from = MarkProgress(main, report->job_id, options.call_timeout);
  if (!from.ok()) return from.status();
  absl::SleepFor(options.baseline);
  absl::StatusOr<ProgressMark> to = MarkProgress(main, report->job_id, options.call_timeout);
  if (!to.ok()) return to.status();
  Rates(*from, *to, &report->tokens_per_s_before, &report->steps_per_s_before);
  return absl::OkStatus();
}

// Runs `client` on a thread at nice `nice` (0: unchanged).
std::thread ClientThread(int nice, std::function<void()> client) {
  return std::thread([nice, client = std::move(client)] {
    if (nice > 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice);
    client();
  });
}

// Every client's connection is up before the load starts, so that the run
// counts the daemon's answers under load, not the set-up: a channel whose
// first connect attempt failed (seen once in a loaded 2-core CI run) fails
// every call at once until its reconnect backoff (about 1 s) ends,
// thousands of errors a second. UNAVAILABLE naming the client when it is
// not connected within `timeout`.
absl::Status WaitUntilConnected(Connection& connection, int client_idx, const std::string& server,
                                absl::Duration timeout) {
  const std::shared_ptr<grpc::Channel>& channel = connection.channel();
  const absl::Time deadline = absl::Now() + timeout;
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY &&
         channel->WaitForStateChange(state, absl::ToChronoTime(deadline))) {
    state = channel->GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("client ", client_idx, ": not connected to ", server,
                                             " within ", absl::FormatDuration(timeout)));
}

// The load phase: every client on its own connection until `duration` ends.
absl::StatusOr<std::vector<ClientResult>> RunClients(const LoadTestOptions& options,
                                                     const ConnectionOptions& connection_options,
                                                     const LoadTestReport& report, absl::Time end) {
  std::vector<std::unique_ptr<Connection>> connections;
  for (int client_idx = 0; client_idx < options.clients; ++client_idx) {
    absl::StatusOr<std::unique_ptr<Connection>> connection = Connection::Create(connection_options);
    if (!connection.ok()) return connection.status();
    connections.push_back(*std::move(connection));
  }
  for (int client_idx = 0; client_idx < options.clients; ++client_idx) {
    MEGATRAIN_RETURN_IF_ERROR(WaitUntilConnected(*connections[client_idx], client_idx,
                                                 connection_options.server, options.call_timeout));
  }
  std::vector<ClientResult> results(options.clients);
  std::vector<std::thread> threads;
  for (int client_idx = 0; client_idx < options.clients; ++client_idx) {
    Connection* connection = connections[client_idx].get();
    ClientResult* result = &results[client_idx];
    if (client_idx < report.watchers) {
      threads.push_back(ClientThread(options.client_nice, [&, connection, result, client_idx] {
        WatchLoop(*connection, report.job_id, end, options.watch_hold, options.call_timeout,
                  static_cast<uint32_t>(client_idx + 1), result);
      }));
    } else {
      threads.push_back(ClientThread(options.client_nice, [&, connection, result] {
        PollLoop(*connection, report.job_id, end, options.call_timeout, options.poll_interval,
                 result);
      }));
    }
  }
  for (std::thread& thread : threads) thread.join();
  return results;  // `connections` close here: every client hangs up
}

// Calls, errors and latency quantiles of every method over all clients.
void AddClientResults(const std::vector<ClientResult>& results, LoadTestReport* report) {
  for (const ClientResult& result : results) {
    report->watch_events += result.watch_events;
    for (const auto& [method, calls] : result.calls) report->methods[method].calls += calls;
    for (const auto& [method, codes] : result.errors) {
      for (const auto& [code, count] : codes) {
        report->methods[method].errors += count;
        report->methods[method].errors_by_code[code] += count;
      }
    }
    for (const auto& [method, error] : result.first_error) {
      if (report->methods[method].first_error.empty()) report->methods[method].first_error = error;
    }
  }
  for (auto& [method, method_report] : report->methods) {
    std::vector<double> all;
    for (const ClientResult& result : results) {
      auto it = result.latency_ms.find(method);
      if (it != result.latency_ms.end())
        all.insert(all.end(), it->second.begin(), it->second.end());
    }
    std::sort(all.begin(), all.end());
    method_report.p50_ms = Quantile(all, 0.5);
    method_report.p99_ms = Quantile(all, 0.99);
    method_report.max_ms = all.empty() ? 0 : all.back();
  }
}

// The daemon notices hung-up watchers within a second: poll the gauge for
// up to 10 s (a benchmark may poll; tests wait on the daemon instead).
int64_t WatchStreamsOnceSettled(Connection& main, absl::Duration timeout) {
  int64_t streams = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    streams = WatchStreams(main, timeout);
    if (streams <= 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return streams;
}

}  // namespace

absl::StatusOr<LoadTestReport> RunLoadTest(const LoadTestOptions& options, std::ostream& log) {
  MEGATRAIN_RETURN_IF_ERROR(CheckOptions(options));
  ConnectionOptions connection_options = options.connection;
  connection_options.own_connection = true;
  absl::StatusOr<std::unique_ptr<Connection>> control = Connection::Create(connection_options);
  if (!control.ok()) return control.status();
  Connection& main = **control;
  LoadTestReport report;
  report.clients = options.clients;
  report.watchers = static_cast<int>(std::lround(options.clients * options.watch_fraction));
  report.client_nice = options.client_nice;
  report.poll_interval_ms = absl::ToDoubleMilliseconds(options.poll_interval);
  MEGATRAIN_ASSIGN_OR_RETURN(report.job_id,
                             JobToMeasure(main, options.job_id, options.call_timeout));
  MEGATRAIN_RETURN_IF_ERROR(MeasureBaseline(main, options, &report, log));
  if (options.daemon_pid > 0) {
    MEGATRAIN_ASSIGN_OR_RETURN(report.process_before, SampleProcess(options.daemon_pid));
    report.measured_process = true;
  }
  log << "load: " << options.clients << " clients (" << report.watchers << " watching) for "
      << absl::FormatDuration(options.duration) << "\n";
  const double client_cpu_start = SelfCpuSeconds();
  MEGATRAIN_ASSIGN_OR_RETURN(const ProgressMark start,
                             MarkProgress(main, report.job_id, options.call_timeout));
  MEGATRAIN_ASSIGN_OR_RETURN(
      const std::vector<ClientResult> results,
      RunClients(options, connection_options, report, start.time + options.duration));
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start.time);
  report.client_cpu_cores_during = (SelfCpuSeconds() - client_cpu_start) / report.seconds;
  absl::StatusOr<ProgressMark> stop = MarkProgress(main, report.job_id, options.call_timeout);
  if (stop.ok()) Rates(start, *stop, &report.tokens_per_s_during, &report.steps_per_s_during);
  if (report.measured_process) {
    absl::StatusOr<ProcessSample> after = SampleProcess(options.daemon_pid);
    if (after.ok()) {
      report.process_after = *after;
      report.daemon_cpu_cores_during =
          (after->cpu_seconds - report.process_before.cpu_seconds) / report.seconds;
    }
  }
  report.watch_streams_after = WatchStreamsOnceSettled(main, options.call_timeout);
  AddClientResults(results, &report);
  return report;
}

std::string FormatLoadTestReport(const LoadTestReport& report) {
  std::ostringstream out;
  out << absl::StrFormat("job %s, %d clients (%d watching), %.1f s of load, polling %s\n\n",
                         report.job_id, report.clients, report.watchers, report.seconds,
                         report.poll_interval_ms > 0
                             ? absl::StrFormat("every %.0f ms per client", report.poll_interval_ms)
                             : std::string("in a closed loop"));
  out << absl::StrFormat("%-10s %10s %8s %10s %10s %10s %10s\n", "method", "calls", "errors",
                         "calls/s", "p50 ms", "p99 ms", "max ms");
  for (const auto& [method, m] : report.methods) {
    out << absl::StrFormat("%-10s %10d %8d %10.1f %10.2f %10.2f %10.2f\n", method, m.calls,
                           m.errors, m.calls / std::max(report.seconds, 1e-9), m.p50_ms, m.p99_ms,
                           m.max_ms);
  }
  out << "(WatchJob: streams opened; latency until the first event; " << report.watch_events
      << " events received)\n";
  for (const auto& [method, m] : report.methods) {
    if (m.errors == 0) continue;
    out << method << " errors:";
    for (const auto& [code, count] : m.errors_by_code) out << " " << code << "=" << count;
    out << " (e.g. " << m.first_error << ")\n";
  }
  out << "\n";
  if (report.measured_process) {
    const ProcessSample& b = report.process_before;
    const ProcessSample& a = report.process_after;
    out << absl::StrFormat("daemon RSS      %s before, %s after (peak %s)\n", Mib(b.rss_bytes),
                           Mib(a.rss_bytes), Mib(a.peak_rss_bytes));
    out << absl::StrFormat("daemon threads  %d before, %d after the load phase\n", b.threads,
                           a.threads);
    out << absl::StrFormat("daemon CPU      %.2f cores during the load (training included)\n",
                           report.daemon_cpu_cores_during);
  }
  out << absl::StrFormat("client CPU      %.2f cores during the load (this process)\n",
                         report.client_cpu_cores_during);
  const double change = report.tokens_per_s_before > 0
                            ? 100.0 * (report.tokens_per_s_during / report.tokens_per_s_before - 1)
                            : 0;
  out << absl::StrFormat("tokens/s        %.0f before, %.0f during the load (%+.1f%%)\n",
                         report.tokens_per_s_before, report.tokens_per_s_during, change);
  const double step_ratio =
      report.steps_per_s_before > 0 ? report.steps_per_s_during / report.steps_per_s_before : 0;
  out << absl::StrFormat("steps/s         %.2f idle, %.2f under %d clients (%.0f%% of idle)\n",
                         report.steps_per_s_before, report.steps_per_s_during, report.clients,
                         100.0 * step_ratio);
  out << absl::StrFormat("client threads  nice %d\n", report.client_nice);
  out << "watch streams   " << report.watch_streams_after << " open after every client hung up\n";
  return out.str();
}

json LoadTestReportToJson(const LoadTestReport& report) {
  json methods = json::object();
  for (const auto& [method, m] : report.methods) {
    methods[method] = {{"calls", m.calls},
                       {"errors", m.errors},
                       {"errors_by_code", m.errors_by_code},
                       {"first_error", m.first_error},
                       {"p50_ms", m.p50_ms},
                       {"p99_ms", m.p99_ms},
                       {"max_ms", m.max_ms}};
  }
  auto process = [](const ProcessSample& p) {
    return json{{"rss_bytes", p.rss_bytes},
                {"peak_rss_bytes", p.peak_rss_bytes},
                {"threads", p.threads},
                {"cpu_seconds", p.cpu_seconds}};
  };
  json out = {{"job_id", report.job_id},
              {"clients", report.clients},
              {"watchers", report.watchers},
              {"seconds", report.seconds},
              {"methods", methods},
              {"watch_events", report.watch_events},
              {"tokens_per_s_before", report.tokens_per_s_before},
              {"tokens_per_s_during", report.tokens_per_s_during},
              {"steps_per_s_before", report.steps_per_s_before},
              {"steps_per_s_during", report.steps_per_s_during},
              {"client_nice", report.client_nice},
              {"watch_streams_after", report.watch_streams_after},
              {"client_cpu_cores_during", report.client_cpu_cores_during},
              {"poll_interval_ms", report.poll_interval_ms}};
  if (report.measured_process) {
    out["daemon_before"] = process(report.process_before);
    out["daemon_after"] = process(report.process_after);
    out["daemon_cpu_cores_during"] = report.daemon_cpu_cores_during;
  }
  return out;
}

}  // namespace megatrain::client
