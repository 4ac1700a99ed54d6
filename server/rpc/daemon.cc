// See daemon.h.
#include "server/rpc/daemon.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>
#include <utility>
#include <sstream>

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/runtime/status_macros.h"
#include "server/core/audit_log.h"
#include "server/core/auth.h"
#include "server/rpc/checkpoint_service.h"
#include "server/core/job_manager.h"
#include "server/rpc/job_service.h"
#include "server/core/job_store.h"
#include "server/core/logging.h"
#include "server/core/metrics.h"
#include "server/core/metrics_http.h"
#include "server/core/net_util.h"
#include "server/core/nvml.h"
#include "server/core/output_group.h"
#include "server/core/path_policy.h"
#include "server/core/pcie_link_model.h"
#include "server/rpc/rpc_priority.h"
#include "server/rpc/server_service.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

// Share of physical memory used as the default --host_memory_budget: leaves
// room for the OS, the page cache of the data shards and the daemon itself.
constexpr double kDefaultBudgetShare = 0.8;

// Fewest --max_threads: gRPC's sync server keeps a few polling threads, and
// a handful of concurrent calls must still fit beside them.
constexpr int kMinThreads = 8;
// Keepalive: ping an idle connection every 60 s and drop it when the ping is
// not answered within 20 s, so that the streams of a client that vanished
// without closing its connection (a crashed host, a cut network) end.
constexpr int kKeepaliveTimeMs = 60'000;
constexpr int kKeepaliveTimeoutMs = 20'000;

absl::Status CheckLimits(const DaemonOptions& options) {
  // 1 KiB .. 1 GiB: below, ordinary requests fail; above, one message could
  // hold a large share of a small machine's memory.
  if (options.max_message_bytes < 1024 || options.max_message_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes: must be in [1KiB, 1GiB], got ", options.max_message_bytes));
  }
  if (options.max_threads < kMinThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_threads: must be >= ", kMinThreads, ", got ", options.max_threads));
  }
  if (options.rpc_nice < 0 || options.rpc_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rpc_nice: must be in [0, 19], got ", options.rpc_nice));
  }
  if (!(options.max_engine_call_seconds > 0 && options.max_engine_call_seconds <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_engine_call_seconds: must be in (0, 3600], got ", options.max_engine_call_seconds));
  }
  if (options.max_watch_streams < 1 || options.max_watch_streams > options.max_threads / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_watch_streams: must be in [1, --max_threads / 2 = ", options.max_threads / 2,
        "], got ", options.max_watch_streams));
  }
  if (options.max_watch_streams_per_user < 0 ||
      options.max_watch_streams_per_user > options.max_watch_streams) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_watch_streams_per_user: must be in [0, --max_watch_streams = ",
                     options.max_watch_streams, "] (0: three quarters of it), got ",
                     options.max_watch_streams_per_user));
  }
  // The job limits: 0 means no limit; a negative one is a typo, not "none".
  const std::pair<const char*, int> job_limits[] = {
      {"--max_running_jobs_per_user", options.max_running_jobs_per_user},
      {"--max_devices_per_user", options.max_devices_per_user},
      {"--max_queued_jobs_per_user", options.max_queued_jobs_per_user},
      {"--max_queued_jobs", options.max_queued_jobs},
  };
  for (const auto& [flag, value] : job_limits) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": must be >= 0 (0: no limit), got ", value));
    }
  }
  return absl::OkStatus();
}

// The roots of --data_roots / --output_roots with their defaults (see
// DaemonOptions): created where they are defaults.
absl::StatusOr<PathPolicy> MakePathPolicy(const DaemonOptions& options, bool auth_enabled,
                                          const fs::path& state_dir) {
  std::vector<std::string> data = SplitPathList(options.data_roots);
  std::vector<std::string> output = SplitPathList(options.output_roots);
  const std::string jobs_dir = (state_dir / "jobs").string();
  if (auth_enabled && data.empty()) {
    const fs::path default_data = state_dir / "data";
    std::error_code ec;
    fs::create_directories(default_data, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--data_roots: cannot create the default '", default_data.string(), "': ", ec.message()));
    }
    data.push_back(default_data.string());
  }
  // The default output directories must stay writable.
  if (auth_enabled || !output.empty()) output.push_back(jobs_dir);
  return PathPolicy::Create(data, output);
}

// FAILED_PRECONDITION when the secret file `path` (a tokens file, a TLS
// key) may be read or written by users other than its owner and group
// (any "other" permission bit, or group write). NOT_FOUND when missing.
absl::Status CheckSecretFileMode(const std::string& path, absl::string_view flag) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  if ((info.st_mode & (S_IRWXO | S_IWGRP)) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: '%s' has mode %04o: other users could read or change this secret; run "
                      "'chmod 600 %s' (owned by the user megatraind runs as)",
                      flag, path, info.st_mode & 07777, path));
}

// Makes `path` mode `mode` when it exists with more permissions (an earlier
// version, or umask, made it readable by others). Logs what it did.
absl::Status RestrictMode(const fs::path& path, mode_t mode) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) return absl::OkStatus();  // not there (yet)
  if ((info.st_mode & 07777 & ~mode) == 0) return absl::OkStatus();
  if (::chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--state_dir: cannot chmod %04o '%s': %s", mode, path.string(), std::strerror(errno)));
  }
  LogInfo(
      absl::StrFormat("made %s mode %04o (was %04o)", path.string(), mode, info.st_mode & 07777));
  return absl::OkStatus();
}

// The state directory 0700; megatrain.db, its WAL and shared-memory files
// 0600 (created empty with that mode when missing, so that SQLite, which
// gives the WAL the database's mode, never makes them readable by others).
absl::Status SecureStateDir(const fs::path& state_dir) {
  MEGATRAIN_RETURN_IF_ERROR(RestrictMode(state_dir, 0700));
  const fs::path db = state_dir / "megatrain.db";
  const int fd = ::open(db.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir: cannot open '", db.string(), "': ", std::strerror(errno)));
  }
  ::close(fd);
  for (const char* suffix : {"", "-wal", "-shm"}) {
    MEGATRAIN_RETURN_IF_ERROR(RestrictMode(fs::path(db.string() + suffix), 0600));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const DaemonOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca: needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key: give both or neither");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  MEGATRAIN_RETURN_IF_ERROR(CheckSecretFileMode(options.tls_key, "--tls_key"));
  MEGATRAIN_ASSIGN_OR_RETURN(pair.private_key, ReadFile(options.tls_key, "--tls_key"));
  MEGATRAIN_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(options.tls_cert, "--tls_cert"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                               ReadFile(options.tls_client_ca, "--tls_client_ca"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// An exclusive flock on <state_dir>/megatraind.lock, released when the
// process dies (also on kill -9).
absl::StatusOr<int> LockStateDir(const std::string& state_dir) {
  const std::string path = (fs::path(state_dir) / "megatraind.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir: cannot open '", path, "': ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir: '", state_dir, "' is in use by another megatraind (", path, " is locked)"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] ssize_t written = ::write(fd, pid.data(), pid.size());
  }
  return fd;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view flag) {
  absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t unit_pos = 0;
  while (unit_pos < trimmed.size() &&
         (absl::ascii_isdigit(trimmed[unit_pos]) || trimmed[unit_pos] == '.')) {
    ++unit_pos;
  }
  double number = 0;
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(unit_pos)));
  double scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else if (unit == "tb") {
    scale = 1e12;
  } else if (unit == "k" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  }
  if (unit_pos == 0 || scale == 0 || !absl::SimpleAtod(trimmed.substr(0, unit_pos), &number) ||
      !std::isfinite(number * scale) || number * scale >= 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": expected a size such as 512GiB, 64G, 100GB or 1073741824, got '", text, "'"));
  }
  return static_cast<int64_t>(number * scale);
}

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

namespace {

// What Start reads from the flags, the TLS files and the tokens file before
// anything on disk changes.
struct StartupFlags {
  HostPort listen;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<Authenticator> auth;
  std::vector<std::string> devices;
  int64_t physical_memory_bytes = 0;
  int64_t host_memory_budget_bytes = 0;
};

// --listen against --auth_tokens and TLS (the security rules in daemon.h).
absl::Status CheckListenSecurity(const DaemonOptions& opt, const HostPort& listen) {
  if (opt.auth_tokens.empty() && !IsLoopbackHost(listen.host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", opt.listen,
                     ": without --auth_tokens the daemon serves only loopback "
                     "addresses (127.0.0.1, ::1, localhost); give --auth_tokens to listen on ",
                     listen.host));
  }
  if (!opt.auth_tokens.empty() && !IsLoopbackHost(listen.host) && opt.tls_cert.empty() &&
      !opt.allow_cleartext_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", opt.listen,
        ": with --auth_tokens and without TLS, bearer tokens would "
        "cross the network in clear; give --tls_cert and --tls_key, or pass "
        "--allow_cleartext_tokens to accept that (a trusted network, or TLS terminated in "
        "front of the daemon)"));
  }
  return absl::OkStatus();
}

// Everyone is the admin "local" without --auth_tokens; else the tokens
// file, which must not be readable by others.
absl::StatusOr<std::unique_ptr<Authenticator>> LoadAuthenticator(const DaemonOptions& opt) {
  if (opt.auth_tokens.empty()) return Authenticator::AllowAll();
  MEGATRAIN_RETURN_IF_ERROR(CheckSecretFileMode(opt.auth_tokens, "--auth_tokens"));
  return Authenticator::FromTokensFile(opt.auth_tokens);
}

// Checks every flag, in the order their errors are reported, and reads the
// secret files. Asks `backend` for its CUDA devices only once the flags
// before --device are good.
absl::StatusOr<StartupFlags> ReadStartupFlags(const DaemonOptions& opt, EngineBackend& backend) {
  StartupFlags flags;
  MEGATRAIN_ASSIGN_OR_RETURN(flags.listen, ParseHostPort(opt.listen, "--listen"));
  MEGATRAIN_RETURN_IF_ERROR(CheckListenSecurity(opt, flags.listen));
  if (opt.state_dir.empty()) return absl::InvalidArgumentError("--state_dir: required");
  MEGATRAIN_RETURN_IF_ERROR(CheckLimits(opt));
  MEGATRAIN_ASSIGN_OR_RETURN(flags.credentials, MakeCredentials(opt));
  MEGATRAIN_ASSIGN_OR_RETURN(flags.auth, LoadAuthenticator(opt));
  MEGATRAIN_ASSIGN_OR_RETURN(flags.devices, ResolveDevices(opt.device, backend.CudaDeviceCount()));
  flags.physical_memory_bytes = PhysicalMemoryBytes();
  int64_t budget = opt.host_memory_budget_bytes;
  if (budget == 0) budget = static_cast<int64_t>(kDefaultBudgetShare * flags.physical_memory_bytes);
  if (budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_memory_budget: must be > 0, got ", budget));
  }
  flags.host_memory_budget_bytes = budget;
  return flags;
}

// The link model of `device` from NVML's PCIe counters read before, between
// and after the two directions of the bandwidth probe (Note [PCIe link
// model]); the defaults when a reading is missing or does not fit.
PcieLinkModel LinkModelOf(const std::string& device, const LinkBandwidth& bandwidth,
                          const std::optional<PcieCounterReading>& before,
                          const std::optional<PcieCounterReading>& between,
                          const std::optional<PcieCounterReading>& after) {
  if (!before.has_value() || !between.has_value() || !after.has_value()) return PcieLinkModel();
  absl::StatusOr<PcieLinkModel> measured =
      CalibratePcieLinkModel(bandwidth.bytes_copied_each_way, *before, *between, *after);
  if (measured.ok()) return *measured;
  LogWarning(
      absl::StrCat(device, ": ", measured.status().message(), "; using the default link model"));
  return PcieLinkModel();
}

}  // namespace

struct Daemon::Parts {
  // Declared in dependency order: destroyed in reverse.
  DaemonOptions options;
  int lock_fd = -1;
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<AuditLog> audit;
  PathPolicy path_policy = PathPolicy::Unrestricted();
  std::unique_ptr<ServerMetrics> metrics;
  std::unique_ptr<Nvml> nvml;
  std::unique_ptr<JobManager> manager;
  std::unique_ptr<JobServiceImpl> job_service;
  std::unique_ptr<CheckpointServiceImpl> checkpoint_service;
  std::unique_ptr<ServerServiceImpl> server_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<MetricsHttpServer> http;
  std::string grpc_host;
  int grpc_port = 0;
  bool shut_down = false;
  // Absolute --state_dir; the JSON-lines audit log ("" when off).
  fs::path state_dir;
  std::string audit_jsonl;
  // Ready once grpc_server->Wait() returned (Shutdown); the server is not
  // destroyed before.
  std::shared_future<void> handlers_done;

  ~Parts() {
    if (handlers_done.valid()) handlers_done.wait();
    grpc_server.reset();
    if (lock_fd >= 0) ::close(lock_fd);
  }

  // Start's steps, in order; each fills the members it names.
  absl::Status OpenStateDir();  // state_dir, lock_fd, store, path_policy, audit
  void StartMonitoring(const std::vector<std::string>& devices);  // metrics, nvml
  ServerFacts Facts(const StartupFlags& flags) const;
  void MeasureLinks(const std::vector<std::string>& devices, ServerFacts* facts);
  void InstallNvmlSampler(const std::vector<std::string>& devices);
  absl::Status StartJobManager(const StartupFlags& flags);  // manager
  // NVML's memory of the smallest of `devices`, in bytes; 0 when one is
  // unknown (a CPU device, no NVML): admission then skips the check.
  int64_t SmallestDeviceMemory(const std::vector<std::string>& devices) const;
  absl::Status StartGrpc(const StartupFlags& flags, ServerFacts facts);
  absl::Status StartMetricsHttp();  // http, unless --metrics_listen is off
  void LogStarted(const StartupFlags& flags) const;
};

// The state directory (created, locked, made private), the job store, the
// path policy and the audit log.
absl::Status Daemon::Parts::OpenStateDir() {
  std::error_code ec;
  state_dir = fs::absolute(options.state_dir);
  fs::create_directories(state_dir / "jobs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir: cannot create '", state_dir.string(), "': ", ec.message()));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(lock_fd, LockStateDir(state_dir.string()));
  MEGATRAIN_RETURN_IF_ERROR(RestrictMode(state_dir / "megatraind.lock", 0600));
  MEGATRAIN_RETURN_IF_ERROR(SecureStateDir(state_dir));
  if (!options.output_group.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(gid_t gid, ResolveOutputGroup(options.output_group));
    MEGATRAIN_RETURN_IF_ERROR(
        ShareOutputsWithGroup(state_dir.string(), (state_dir / "jobs").string(), gid));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(store, JobStore::Open((state_dir / "megatrain.db").string()));
  MEGATRAIN_ASSIGN_OR_RETURN(path_policy, MakePathPolicy(options, auth->enabled(), state_dir));
  audit_jsonl = options.audit_log;
  if (audit_jsonl.empty()) audit_jsonl = (state_dir / "audit.jsonl").string();
  if (audit_jsonl == "off") audit_jsonl.clear();
  AuditLogOptions audit_options;
  audit_options.jsonl_path = audit_jsonl;
  audit_options.space_check_dir = state_dir.string();
  audit_options.min_free_bytes = options.state_dir_min_free_bytes;
  MEGATRAIN_ASSIGN_OR_RETURN(audit, AuditLog::Open(store.get(), std::move(audit_options)));
  return absl::OkStatus();
}

void Daemon::Parts::StartMonitoring(const std::vector<std::string>& devices) {
  metrics = std::make_unique<ServerMetrics>();
  // NVML's PCIe byte counters are read every 20 ms from here on, so that
  // their totals start at daemon start (Note [NVML PCIe counters]).
  NvmlOptions nvml_options;
  for (const std::string& device : devices) {
    if (!absl::StartsWith(device, "cpu")) nvml_options.pcie_counter_devices.push_back(device);
  }
  nvml = Nvml::Load(nvml_options);
}

ServerFacts Daemon::Parts::Facts(const StartupFlags& flags) const {
  ServerFacts facts;
  facts.version = kVersion;
  facts.start_time_unix_ms = NowUnixMs();
  facts.physical_memory_bytes = flags.physical_memory_bytes;
  facts.auth_enabled = auth->enabled();
  facts.preemption_enabled = options.preemption;
  facts.backend = backend.get();
  facts.nvme_budget_bytes = options.nvme_budget_bytes;
  facts.max_engine_call = absl::Seconds(options.max_engine_call_seconds);
  return facts;
}

// Each GPU's pinned copy bandwidth and PCIe link model, into `facts` and
// the metrics (unless --measure_link_bandwidth=false).
void Daemon::Parts::MeasureLinks(const std::vector<std::string>& devices, ServerFacts* facts) {
  for (const std::string& device : devices) {
    if (!options.measure_link_bandwidth || absl::StartsWith(device, "cpu")) continue;
    // NVML's PCIe counters around each direction of the probe calibrate the
    // link model (Note [PCIe link model]); without them it keeps its defaults.
    std::optional<PcieCounterReading> before, between, after;
    if (nvml != nullptr) before = nvml->PcieBytes(device);
    absl::StatusOr<LinkBandwidth> bandwidth = backend->MeasureLinkBandwidth(device, [&] {
      if (nvml != nullptr) between = nvml->PcieBytes(device);
    });
    if (nvml != nullptr) after = nvml->PcieBytes(device);
    if (!bandwidth.ok()) {
      if (!absl::IsUnimplemented(bandwidth.status())) {
        LogWarning(
            absl::StrCat(device, ": measuring PCIe bandwidth: ", bandwidth.status().ToString()));
      }
      continue;
    }
    facts->link_bandwidth[device] = *bandwidth;
    metrics->SetLinkBandwidth(device, *bandwidth);
    LogInfo(absl::StrFormat("%s: pinned H2D %.1f GB/s, D2H %.1f GB/s", device,
                            bandwidth->h2d_bytes_per_second / 1e9,
                            bandwidth->d2h_bytes_per_second / 1e9));
    const PcieLinkModel model = LinkModelOf(device, *bandwidth, before, between, after);
    metrics->SetPcieLinkModel(device, model);
    LogInfo(absl::StrFormat(
        "%s: PCIe link model (%s): rx %.3f x H2D + %.3f x D2H, tx %.3f x D2H + %.3f x H2D", device,
        model.calibrated ? "measured with NVML" : "defaults", model.rx_per_h2d_byte,
        model.rx_per_d2h_byte, model.tx_per_d2h_byte, model.tx_per_h2d_byte));
  }
}

// NVML's memory and PCIe readings of every device, taken at each scrape.
void Daemon::Parts::InstallNvmlSampler(const std::vector<std::string>& devices) {
  if (nvml == nullptr) return;
  Nvml* sampled = nvml.get();
  ServerMetrics* sink = metrics.get();
  metrics->SetPreCollectHook([sampled, sink, devices] {
    for (const std::string& device : devices) {
      std::optional<NvmlSample> sample = sampled->Sample(device);
      if (!sample.has_value()) continue;
      sink->SetGpuMemory(device, sample->memory_used_bytes, sample->memory_total_bytes);
      sink->SetNvmlPcieThroughput(device, sample->pcie_tx_bytes_per_second,
                                  sample->pcie_rx_bytes_per_second);
      if (sample->pcie_byte_counters) {
        sink->SetNvmlPcieBytes(device, sample->pcie_tx_bytes, sample->pcie_rx_bytes,
                               sample->pcie_counter_late_reads);
      }
    }
  });
}

int64_t Daemon::Parts::SmallestDeviceMemory(const std::vector<std::string>& devices) const {
  if (nvml == nullptr || devices.empty()) return 0;
  int64_t smallest = 0;
  for (const std::string& device : devices) {
    std::optional<NvmlSample> sample = nvml->Sample(device);
    if (!sample.has_value() || sample->memory_total_bytes <= 0) return 0;
    if (smallest == 0 || sample->memory_total_bytes < smallest) {
      smallest = sample->memory_total_bytes;
    }
  }
  return smallest;
}

// The job manager (recovers interrupted jobs).
absl::Status Daemon::Parts::StartJobManager(const StartupFlags& flags) {
  JobManagerOptions manager_options;
  manager_options.jobs_dir = (state_dir / "jobs").string();
  manager_options.devices = flags.devices;
  manager_options.host_memory_budget_bytes = flags.host_memory_budget_bytes;
  manager_options.device_memory_bytes = SmallestDeviceMemory(flags.devices);
  manager_options.max_running_jobs_per_user = options.max_running_jobs_per_user;
  manager_options.max_devices_per_user = options.max_devices_per_user;
  manager_options.max_queued_jobs_per_user = options.max_queued_jobs_per_user;
  manager_options.max_queued_jobs = options.max_queued_jobs;
  manager_options.preemption = options.preemption;
  manager_options.path_policy = path_policy;
  manager_options.nvme = {options.nvme_dir, options.nvme_budget_bytes};
  MEGATRAIN_ASSIGN_OR_RETURN(manager, JobManager::Create(std::move(manager_options), store.get(),
                                                         backend.get(), metrics.get()));
  return absl::OkStatus();
}

// The services, and the gRPC server on --listen with the message, thread
// and keepalive limits (daemon.h).
absl::Status Daemon::Parts::StartGrpc(const StartupFlags& flags, ServerFacts facts) {
  job_service = std::make_unique<JobServiceImpl>(
      manager.get(), auth.get(), metrics.get(), audit.get(), options.max_watch_streams,
      options.max_watch_streams_per_user, absl::Seconds(options.max_engine_call_seconds));
  checkpoint_service = std::make_unique<CheckpointServiceImpl>(manager.get(), auth.get(),
                                                               metrics.get(), audit.get());
  server_service = std::make_unique<ServerServiceImpl>(std::move(facts), manager.get(), auth.get(),
                                                       metrics.get(), nvml.get(), audit.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  SetRpcThreadNice(options.rpc_nice);  // Note [RPC threads below training]
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, flags.credentials, &grpc_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  grpc::ResourceQuota quota("megatraind");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  // gRPC sets SO_REUSEPORT by default: a second daemon could then bind the
  // same address and take half of the connections. Off, its bind fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(job_service.get());
  builder.RegisterService(checkpoint_service.get());
  builder.RegisterService(server_service.get());
  grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot bind ", options.listen,
        ": the address is in use (another megatraind, or another program, listens on it) or "
        "is not an address of this machine; stop the other process or choose another "
        "--listen"));
  }
  grpc_host = flags.listen.host;
  grpc_server->GetHealthCheckService()->SetServingStatus(true);
  return absl::OkStatus();
}

absl::Status Daemon::Parts::StartMetricsHttp() {
  if (options.metrics_listen.empty()) return absl::OkStatus();
  MEGATRAIN_ASSIGN_OR_RETURN(http, MetricsHttpServer::Start(options.metrics_listen, metrics.get()));
  return absl::OkStatus();
}

void Daemon::Parts::LogStarted(const StartupFlags& flags) const {
  LogInfo(absl::StrCat("megatraind ", kVersion, ": devices ", absl::StrJoin(flags.devices, ","),
                       ", host memory budget ", flags.host_memory_budget_bytes, " bytes, auth ",
                       auth->enabled() ? absl::StrCat(auth->user_count(), " users") : "off",
                       ", preemption ", options.preemption ? "on" : "off"));
  auto roots = [](const std::vector<std::string>& list) {
    return list.empty() ? std::string("anywhere") : absl::StrJoin(list, ",");
  };
  LogInfo(absl::StrCat("jobs read under ", roots(path_policy.data_roots()), ", write under ",
                       roots(path_policy.output_roots()), "; audit log ",
                       audit_jsonl.empty() ? "in the database only" : audit_jsonl, "; max message ",
                       options.max_message_bytes, " bytes, max threads ", options.max_threads,
                       ", max watch streams ", options.max_watch_streams));
}

Daemon::Daemon(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

Daemon::~Daemon() {
  if (parts_ != nullptr && !parts_->shut_down) Shutdown(absl::InfiniteDuration());
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options,
                                                      std::unique_ptr<EngineBackend> backend) {
  auto parts = std::make_unique<Parts>();
  Parts& p = *parts;
  p.options = std::move(options);
  p.backend = std::move(backend);
  // Flags first: fail before touching anything.
  MEGATRAIN_ASSIGN_OR_RETURN(StartupFlags flags, ReadStartupFlags(p.options, *p.backend));
  p.auth = std::move(flags.auth);
  MEGATRAIN_RETURN_IF_ERROR(p.OpenStateDir());
  p.StartMonitoring(flags.devices);
  ServerFacts facts = p.Facts(flags);
  p.MeasureLinks(flags.devices, &facts);
  p.InstallNvmlSampler(flags.devices);
  MEGATRAIN_RETURN_IF_ERROR(p.StartJobManager(flags));
  MEGATRAIN_RETURN_IF_ERROR(p.StartGrpc(flags, std::move(facts)));
  MEGATRAIN_RETURN_IF_ERROR(p.StartMetricsHttp());
  p.LogStarted(flags);
  return std::unique_ptr<Daemon>(new Daemon(std::move(parts)));
}

int Daemon::grpc_port() const { return parts_->grpc_port; }

int Daemon::watch_streams() const { return parts_->job_service->watch_streams(); }

bool Daemon::WaitForWatchStreams(int count, absl::Duration timeout) const {
  return parts_->job_service->WaitForWatchStreams(count, timeout);
}

const PathPolicy& Daemon::path_policy() const { return parts_->path_policy; }

int Daemon::metrics_port() const { return parts_->http == nullptr ? 0 : parts_->http->port(); }

std::string Daemon::grpc_address() const {
  return FormatHostPort(parts_->grpc_host, parts_->grpc_port);
}

bool Daemon::Shutdown(absl::Duration drain_timeout) {
  Parts& p = *parts_;
  if (p.shut_down) return true;
  p.shut_down = true;
  LogInfo("shutting down: refusing new work, checkpointing running jobs");
  const absl::Time deadline = absl::Now() + drain_timeout;
  p.grpc_server->GetHealthCheckService()->SetServingStatus(false);
  const bool drained = p.manager->Drain(drain_timeout);
  if (!drained) {
    LogError("shutdown: jobs still running after the drain timeout");
    return false;
  }
  // Watchers end with UNAVAILABLE within a second of the drain; give
  // in-flight unary calls a moment (at most 5 s, and not past the drain
  // deadline), then cancel what is left. A handler blocked in file I/O (a
  // hung file system under a submission) does not return when cancelled:
  // the wait for the handlers is bounded too, so that --shutdown_timeout
  // always applies (the caller then exits without destructors).
  const absl::Time calls_deadline =
      std::max(std::min(absl::Now() + absl::Seconds(5), deadline), absl::Now());
  auto stopped = std::make_shared<std::promise<void>>();
  p.handlers_done = stopped->get_future().share();
  grpc::Server* server = p.grpc_server.get();
  // grpc's Shutdown itself waits for the handlers after cancelling them, so
  // both run on a thread of their own.
  std::thread([server, stopped, calls_deadline] {
    server->Shutdown(absl::ToChronoTime(calls_deadline));
    server->Wait();
    stopped->set_value();
  }).detach();
  // One second past the deadline for the cancelled calls to unwind.
  const absl::Duration wait =
      std::max(deadline - absl::Now(), absl::ZeroDuration()) + absl::Seconds(1);
  if (wait == absl::InfiniteDuration()) {
    p.handlers_done.wait();
  } else if (p.handlers_done.wait_for(absl::ToChronoNanoseconds(wait)) !=
             std::future_status::ready) {
    LogError(
        "shutdown: RPC handlers still running after the shutdown timeout (blocked in file "
        "I/O?)");
    return false;
  }
  if (p.http != nullptr) p.http->Stop();
  LogInfo("shutdown complete");
  return true;
}

}  // namespace megatrain::server
