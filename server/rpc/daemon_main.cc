// See daemon_main.h.
#include "server/rpc/daemon_main.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/rpc/daemon.h"
#include "server/core/logging.h"
#include "server/core/net_util.h"

namespace megatrain::server {

namespace {

// Flags read as text or seconds, converted after parsing.
struct RawFlags {
  std::string host_memory_budget;
  std::string nvme_budget;
  std::string max_message_bytes = "16MiB";
  double shutdown_timeout_seconds = 600;
};

// Blocks the shutdown signals before any thread starts: every thread
// inherits the mask, and the main thread collects them with sigwait.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // SIGHUP's default action kills the process; a closing terminal or a
  // habitual `kill -HUP` must not. It is collected and logged
  // (WaitForShutdownSignal).
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that hangs up must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

// megatraind's flags (daemon_main.h), into `options` and `flags`.
void AddFlags(CLI::App* app, DaemonOptions* options, RawFlags* flags) {
  app->option_defaults()->always_capture_default();
  app->set_version_flag("--version", std::string("megatraind ") + kVersion);
  app->add_option("--listen", options->listen, "gRPC address host:port");
  app->add_option("--metrics_listen", options->metrics_listen,
                  "HTTP address of /metrics ('' or 'off': no metrics listener)");
  app->add_option("--state_dir", options->state_dir,
                  "Directory of the job database, locks and default job outputs")
      ->required();
  app->add_option("--device", options->device, "auto | cpu | cuda | cuda:N, comma-separated");
  app->add_option("--host_memory_budget", flags->host_memory_budget,
                  "Host memory all running jobs may need together, e.g. 512GiB "
                  "(default: 80% of physical memory)");
  // The NVMe tier (docs/operations.md "The NVMe tier").
  app->add_option("--nvme_budget", flags->nvme_budget,
                  "Local SSD space for the NVMe tier, e.g. 4TB: what `megatrain plan` assumes and, "
                  "with --nvme_dir, the disk all running jobs' AdamW moment files may take "
                  "(default 0: no tier)");
  app->add_option("--nvme_dir", options->nvme_dir,
                  "Absolute directory on a local SSD for jobs with memory.nvme_tier moments or "
                  "auto (one subdirectory per job; needs --nvme_budget)");
  app->add_option("--auth_tokens", options->auth_tokens,
                  "YAML file of users, roles and token SHA-256 hashes (default: auth off, "
                  "loopback only)");
  app->add_option("--tls_cert", options->tls_cert, "PEM certificate chain for TLS");
  app->add_option("--tls_key", options->tls_key, "PEM private key for TLS");
  app->add_option("--tls_client_ca", options->tls_client_ca,
                  "PEM CA bundle: require client certificates (mutual TLS)");
  app->add_flag("--allow_cleartext_tokens", options->allow_cleartext_tokens,
                "With --auth_tokens, serve a non-loopback --listen without TLS: bearer tokens "
                "then cross the network in clear");
  app->add_option("--data_roots", options->data_roots,
                  "Comma-separated directories jobs may read (model.hf_dir, data.*) "
                  "(default: anywhere without --auth_tokens, <state_dir>/data with it)");
  app->add_option("--output_roots", options->output_roots,
                  "Comma-separated directories jobs and exports may write (default: anywhere "
                  "without --auth_tokens, <state_dir>/jobs with it; <state_dir>/jobs always)");
  app->add_option("--audit_log", options->audit_log,
                  "JSON-lines audit log file (default <state_dir>/audit.jsonl; 'off': only "
                  "the database table)");
  app->add_option("--output_group", options->output_group,
                  "Unix group that may read job outputs under <state_dir>/jobs (checkpoints, "
                  "exports): state dir 0710, jobs dir 02750, umask 027 (default: owner only)");
  app->add_option("--max_message_bytes", flags->max_message_bytes,
                  "Largest gRPC message received or sent, e.g. 16MiB");
  app->add_option("--max_threads", options->max_threads,
                  "Most threads of the gRPC server (calls beyond: RESOURCE_EXHAUSTED)");
  app->add_option("--rpc_nice", options->rpc_nice,
                  "Nice value of the threads serving RPCs, 0-19 (default 19: training first; "
                  "0: the same priority as training)");
  app->add_option("--max_engine_call_seconds", options->max_engine_call_seconds,
                  "Longest plan or admission estimate under one RPC, whatever the client's "
                  "deadline (default 60; beyond: DEADLINE_EXCEEDED)");
  app->add_option("--max_watch_streams", options->max_watch_streams,
                  "Most concurrent WatchJob streams (at most --max_threads / 2)");
  app->add_option("--max_watch_streams_per_user", options->max_watch_streams_per_user,
                  "Most concurrent WatchJob streams of one user (at most --max_watch_streams; "
                  "0: three quarters of it, rounded up)");
  app->add_option("--max_running_jobs_per_user", options->max_running_jobs_per_user,
                  "Running jobs per user (0: no limit)");
  app->add_option("--max_devices_per_user", options->max_devices_per_user,
                  "Devices one user's running jobs may hold together, e.g. 2 on a shared "
                  "8-GPU machine (0: no limit; train.devices beyond it is refused at submit)");
  app->add_option("--max_queued_jobs_per_user", options->max_queued_jobs_per_user,
                  "Queued jobs per user (0: no limit)");
  app->add_option("--max_queued_jobs", options->max_queued_jobs,
                  "Queued jobs in all (0: no limit)");
  app->add_flag("--preemption", options->preemption,
                "Let higher-priority jobs suspend running lower-priority ones");
  app->add_option("--shutdown_timeout", flags->shutdown_timeout_seconds,
                  "Seconds SIGTERM waits for running jobs to checkpoint");
  app->add_option("--measure_link_bandwidth", options->measure_link_bandwidth,
                  "Measure PCIe bandwidth at start-up");
}

// Parses `argv`; the exit code when megatraind must exit now (0 after
// --help or --version, 2 for bad flags).
std::optional<int> ParseFlags(int argc, char** argv, DaemonOptions* options, RawFlags* flags) {
  CLI::App app{"megatraind: MegaTrain training daemon (gRPC control plane, job queue, metrics)"};
  AddFlags(&app, options, flags);
  // CLI11 reads "--metrics_listen=" (an empty value) as a flag without its
  // value and takes the next argument instead; "off" is what it means.
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& arg : args) {
    if (arg == "--metrics_listen=") arg = "--metrics_listen=off";
  }
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  try {
    app.parse(argc, arg_pointers.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (options->metrics_listen == "off") options->metrics_listen.clear();
  return std::nullopt;
}

// The byte-size flags into `options`; false (the error on stderr) for a
// bad size. An empty --host_memory_budget or --nvme_budget keeps the
// default; --max_message_bytes is always parsed.
bool ApplyByteSizes(const RawFlags& flags, DaemonOptions* options) {
  struct ByteSizeFlag {
    const char* name;
    const std::string& text;
    int64_t* bytes;
    bool empty_keeps_default;
  };
  const ByteSizeFlag sizes[] = {
      {"--host_memory_budget", flags.host_memory_budget, &options->host_memory_budget_bytes, true},
      {"--nvme_budget", flags.nvme_budget, &options->nvme_budget_bytes, true},
      {"--max_message_bytes", flags.max_message_bytes, &options->max_message_bytes, false},
  };
  for (const ByteSizeFlag& size : sizes) {
    if (size.empty_keeps_default && size.text.empty()) continue;
    absl::StatusOr<int64_t> bytes = ParseByteSize(size.text, size.name);
    if (!bytes.ok()) {
      std::fprintf(stderr, "megatraind: %s\n", std::string(bytes.status().message()).c_str());
      return false;
    }
    *size.bytes = *bytes;
  }
  return true;
}

// "megatraind: ready grpc=... metrics=..." on stdout, for scripts.
void PrintReadyLine(const Daemon& daemon, const DaemonOptions& options) {
  std::string metrics = "off";
  if (daemon.metrics_port() != 0) {
    absl::StatusOr<HostPort> address = ParseHostPort(options.metrics_listen, "--metrics_listen");
    metrics = FormatHostPort(address.ok() ? address->host : "127.0.0.1", daemon.metrics_port());
  }
  std::printf("megatraind: ready grpc=%s metrics=%s\n", daemon.grpc_address().c_str(),
              metrics.c_str());
  std::fflush(stdout);
}

// Waits for SIGTERM or SIGINT (returned), logging and ignoring SIGHUP.
int WaitForShutdownSignal(const sigset_t& signals) {
  int signal_number = 0;
  while (true) {
    sigwait(&signals, &signal_number);
    if (signal_number != SIGHUP) break;
    LogInfo(
        "received SIGHUP: ignored (megatraind reloads nothing: flags, the tokens file and "
        "the TLS files are read at start, so restart it to change them; the audit log is "
        "appended with O_APPEND, rotate it with logrotate's copytruncate)");
  }
  LogInfo(absl::StrCat("received ", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"));
  return signal_number;
}

}  // namespace

int RunDaemonMain(int argc, char** argv,
                  const std::function<std::unique_ptr<EngineBackend>()>& make_backend) {
  const sigset_t signals = BlockShutdownSignals();
  DaemonOptions options;
  RawFlags flags;
  if (std::optional<int> exit_code = ParseFlags(argc, argv, &options, &flags)) return *exit_code;
  if (!ApplyByteSizes(flags, &options)) return 2;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options, make_backend());
  if (!daemon.ok()) {
    LogError(absl::StrCat("megatraind cannot start: ", daemon.status().ToString()));
    return 1;
  }
  PrintReadyLine(**daemon, options);
  WaitForShutdownSignal(signals);
  if (!(*daemon)->Shutdown(absl::Seconds(flags.shutdown_timeout_seconds))) {
    // Jobs still run on their threads: destroying the daemon would wait for
    // them. Leave without destructors; the store is consistent (every
    // transition is committed) and the next start re-queues the jobs.
    std::fflush(stderr);
    _exit(3);
  }
  daemon->reset();
  return 0;
}

}  // namespace megatrain::server
