// Daemon: megatraind assembled from its parts. Opens the state directory
// (SQLite job store, a lock file so that two daemons never share it), loads
// the auth tokens, starts the job manager (crash recovery), measures each
// device's PCIe bandwidth, and serves gRPC (JobService, CheckpointService,
// ServerService, grpc.health.v1 and reflection) and /metrics over HTTP.
//
// Security (docs/operations.md, "Security" states the threat model):
// without --auth_tokens every caller is the admin "local", so the gRPC
// listener must be a loopback address (127.0.0.0/8, ::1, localhost); Start
// refuses anything else. TLS (--tls_cert/--tls_key, optionally
// --tls_client_ca for mutual TLS) protects tokens on the wire; with
// --auth_tokens a non-loopback listener without TLS is refused unless
// --allow_cleartext_tokens is given. The tokens file and the TLS key must not
// be readable by others (FAILED_PRECONDITION naming the file and the
// chmod). The state directory is made 0700 and the database, its WAL, the
// lock file and the audit log 0600. The gRPC port is bound without
// SO_REUSEPORT, so a second daemon on the same address fails to start
// (UNAVAILABLE) instead of silently sharing the port. The /metrics
// listener serves numbers only (no job names or users) and is not
// restricted. Jobs read and write only under --data_roots / --output_roots
// (path_policy.h; with --auth_tokens they default to <state_dir>/data and
// <state_dir>/jobs). Mutating RPCs are audited (audit_log.h).
//
// Limits: gRPC messages are bounded by --max_message_bytes both ways; the
// server's threads by a grpc::ResourceQuota (--max_threads: a call that
// finds none free is refused with RESOURCE_EXHAUSTED rather than queued);
// WatchJob streams, which hold a thread each, by --max_watch_streams.
// Keepalive pings (every 60 s, 20 s to answer) find clients that vanished
// without closing their connection, so their streams end.
//
// Thread-safety: Start, Shutdown and the destructor are called from one
// thread (main); ports may be read from any thread.
#ifndef MEGATRAIN_SERVER_DAEMON_H_
#define MEGATRAIN_SERVER_DAEMON_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/engine_backend.h"
#include "server/core/path_policy.h"

#ifndef MEGATRAIN_VERSION
#error "MEGATRAIN_VERSION must be defined by the build (CMake's PROJECT_VERSION)"
#endif

namespace grpc {
class Server;
}

namespace megatrain::server {

// The daemon's version: CMake's PROJECT_VERSION (server/CMakeLists.txt
// defines MEGATRAIN_VERSION for megatrain_server and whatever links it), as
// every binary's --version and the megatrain_build_info metric print it.
inline constexpr char kVersion[] = MEGATRAIN_VERSION;

struct DaemonOptions {
  // gRPC address, "host:port" (port 0 picks one).
  std::string listen = "127.0.0.1:50051";
  // /metrics address, "host:port"; empty disables the HTTP listener.
  std::string metrics_listen = "127.0.0.1:9400";
  // Holds megatrain.db (+ WAL), megatraind.lock and jobs/<id>/ (default
  // output directories). Created if missing.
  std::string state_dir;
  // --device: auto | cpu | cuda | cuda:N, comma-separated (ResolveDevices).
  std::string device = "auto";
  // Host memory all running jobs may need together; 0: 80% of physical
  // memory.
  int64_t host_memory_budget_bytes = 0;
  // --nvme_budget: the NVMe tier's capacity, in bytes: what PlanJob plans
  // with and, with nvme_dir, the disk all running jobs' moment files may
  // take (Note [NVMe admission] in server/core/nvme_admission.h); 0: none.
  int64_t nvme_budget_bytes = 0;
  // --nvme_dir: absolute directory on a local SSD for the jobs' moment
  // files (one subdirectory per job); empty: jobs cannot use the tier.
  std::string nvme_dir;
  // Tokens file (auth.h); empty: auth off, loopback only.
  std::string auth_tokens;
  // PEM files for TLS; cert and key go together; client CA enables mTLS.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // With auth_tokens, a non-loopback `listen` without TLS is refused unless
  // this is set: the operator states that bearer tokens may cross the
  // network in clear (a trusted network, or TLS terminated in front).
  bool allow_cleartext_tokens = false;
  // Comma-separated absolute directories jobs may read from / write to
  // (path_policy.h). Empty: unrestricted without auth_tokens; with
  // auth_tokens, <state_dir>/data and <state_dir>/jobs (created). The
  // output roots always include <state_dir>/jobs when restricted.
  std::string data_roots;
  std::string output_roots;
  // JSON-lines copy of the audit log; empty: <state_dir>/audit.jsonl;
  // "off": none (the SQLite table is always written).
  std::string audit_log;
  // --output_group: a Unix group that may read job outputs (checkpoints,
  // exports under <state_dir>/jobs); empty: the daemon's user only
  // (server/core/output_group.h).
  std::string output_group;
  // Largest gRPC message received or sent, in bytes (a request or response
  // beyond it fails with RESOURCE_EXHAUSTED).
  int64_t max_message_bytes = int64_t{16} << 20;
  // Most threads the gRPC server may use (grpc::ResourceQuota); >= 8.
  int max_threads = 256;
  // Nice value of the threads that run RPC handlers, in [0, 19] (Note [RPC
  // threads below training] in server/rpc/rpc_priority.h); 0: unchanged.
  int rpc_nice = 19;
  // Longest engine call under an RPC (PlanJob's plan, SubmitJob's
  // footprint estimate), in seconds, in (0, 3600], whatever the client's
  // deadline (Note [Cancelled engine calls] in server/rpc/rpc_call.h).
  double max_engine_call_seconds = 60;
  // Most concurrent WatchJob streams; in [1, max_threads / 2] so that
  // unary calls always find threads.
  int max_watch_streams = 64;
  // Most concurrent WatchJob streams of one user, in [0, max_watch_streams];
  // 0: three quarters of max_watch_streams, rounded up (48 of 64), so that
  // one user cannot take every stream from the others.
  int max_watch_streams_per_user = 0;
  // Mutating calls are refused with RESOURCE_EXHAUSTED while the state
  // directory's file system has less than this free, in bytes (Note [Audit
  // fail closed], audit_log.h). Not a flag; tests raise it.
  int64_t state_dir_min_free_bytes = int64_t{1} << 20;
  int max_running_jobs_per_user = 0;  // 0: no limit
  // Devices one user's running jobs hold together (Note [Device limit] in
  // server/core/job_manager.h); 0: no limit.
  int max_devices_per_user = 0;
  int max_queued_jobs_per_user = 100;  // 0: no limit
  int max_queued_jobs = 10000;         // 0: no limit
  bool preemption = false;
  // Measure PCIe bandwidth at start-up (about a second per GPU).
  bool measure_link_bandwidth = true;
};

class Daemon {
 public:
  // Starts everything; returns once both listeners accept connections.
  // INVALID_ARGUMENT for bad options (naming the flag); FAILED_PRECONDITION
  // when another daemon holds the state directory or a secret file is
  // readable by others; UNAVAILABLE when an address cannot be bound (also
  // when another process listens on it); errors of the store, tokens file
  // and TLS files.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options,
                                                       std::unique_ptr<EngineBackend> backend);
  // Shutdown(absl::InfiniteDuration()) unless already shut down.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  int grpc_port() const;
  int metrics_port() const;  // 0 when disabled
  // "127.0.0.1:50051": the gRPC address clients dial.
  std::string grpc_address() const;

  // WatchJob streams open now.
  int watch_streams() const;
  // Blocks until exactly `count` WatchJob streams are open, at most
  // `timeout`; false on timeout. For tests.
  bool WaitForWatchStreams(int count, absl::Duration timeout) const;
  // The path policy in force (resolved roots).
  const PathPolicy& path_policy() const;

  // SIGTERM sequence: health reports NOT_SERVING and new work is refused
  // (UNAVAILABLE); every running job writes a checkpoint and is re-queued;
  // then the listeners close. Returns within about `drain_timeout` + 1 s
  // whatever the jobs and RPC handlers do: false when jobs were still
  // running after `drain_timeout`, or RPC handlers (cancelled) had not
  // returned by then, e.g. blocked in file I/O (the caller should exit
  // without destroying the daemon, whose destructor would wait for them).
  // Idempotent.
  bool Shutdown(absl::Duration drain_timeout);

 private:
  struct Parts;
  explicit Daemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

// Parses a byte size: a number with an optional unit: B, KB/MB/GB/TB
// (powers of 1000), KiB/MiB/GiB/TiB or K/M/G/T (powers of 1024). "512GiB",
// "1.5T", "1000000". INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view flag);

// Physical memory of this machine, in bytes.
int64_t PhysicalMemoryBytes();

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_DAEMON_H_
