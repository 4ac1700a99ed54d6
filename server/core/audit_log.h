// AuditLog: who did what to which job, when, and with what result.
//
// Every mutating RPC (SubmitJob, CancelJob, SuspendJob, ResumeJob,
// CreateCheckpoint, ExportCheckpoint, DeleteCheckpoint) is recorded when it
// finishes, before its response is sent, whether it succeeded or was
// refused (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, ...): the
// user and role (empty when authentication failed), the peer address, the
// method, the job or checkpoint id, the UTC time and the status code with
// its message. Read-only RPCs (GetJob, ListJobs, WatchJob, ...) are not
// recorded.
//
// Records go to two places:
//   - the `audit` table of the job store (megatrain.db), which admins query
//     with ListAuditRecords / `megatrain audit`;
//   - optionally a JSON-lines file (--state_dir/audit.jsonl by default), one
//     object per line, for log shippers:
//       {"seq":7,"time":"2025-01-31T12:00:00.123Z","time_unix_ms":...,
//        "user":"alice","role":"user","peer":"ipv4:127.0.0.1:5555",
//        "method":"CancelJob","target":"job-000003","job_id":"job-000003",
//        "code":"PERMISSION_DENIED","message":"...","detail":""}
//     The file is created with mode 0600 and opened O_APPEND: rotate it with
//     logrotate's `copytruncate`.
// Every field is cut to its cap (audit_record.h) before it is stored.
//
// Refused authentication: records of calls refused with UNAUTHENTICATED are
// rate-limited per peer address (the port ignored): a burst of
// kRefusedAuthBurst, then one per kRefusedAuthRefill. The next record kept
// from that peer says in its `detail` how many were left out, and the first
// one left out is logged. A client hammering the daemon with bad tokens
// cannot fill the disk with audit rows.
//
// Fail closed (Note [Audit fail closed]): a mutating RPC is refused before it
// does anything when the log cannot record it: RESOURCE_EXHAUSTED when the
// state directory's file system has less than min_free_bytes free,
// UNAVAILABLE when the last record could not be written (the message says
// why). A write that fails is logged; the call it records has already taken
// effect. The record of a refused call is still attempted, and the first
// one that is written again ends the refusals.
//
// Thread-safety: all methods are thread-safe. Ownership: the store is
// borrowed and must outlive the log; the file descriptor is owned and closed
// by the destructor.
#ifndef MEGATRAIN_SERVER_AUDIT_LOG_H_
#define MEGATRAIN_SERVER_AUDIT_LOG_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/audit_record.h"
#include "server/core/auth.h"
#include "server/core/job_store.h"

namespace megatrain::server {

// Records of UNAUTHENTICATED calls kept per peer address: a burst of this
// many, then one per kRefusedAuthRefill.
inline constexpr int kRefusedAuthBurst = 20;
inline constexpr absl::Duration kRefusedAuthRefill = absl::Seconds(6);
// Peer addresses whose refused calls are counted; beyond it they share one
// count (bounded memory whatever the number of addresses).
inline constexpr size_t kMaxRefusedAuthPeers = 4096;

struct AuditLogOptions {
  // JSON-lines copy; empty: none.
  std::string jsonl_path;
  // Directory whose file system holds the database (the state directory);
  // empty: no free-space check.
  std::string space_check_dir;
  // Mutating calls are refused (RESOURCE_EXHAUSTED) when space_check_dir's
  // file system has less than this free, in bytes. Why 1 MiB: an audit row
  // and a job row are a few KiB; SQLite's WAL needs some pages more.
  int64_t min_free_bytes = int64_t{1} << 20;
};

class AuditLog {
 public:
  // Records into `store` and, when `jsonl_path` is not empty, appends to
  // that file (created if missing; mode 0600, also when it existed).
  // FAILED_PRECONDITION naming the file when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(JobStore* store,
                                                        const std::string& jsonl_path);
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(JobStore* store, AuditLogOptions options);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Stores one record: time_unix_ms 0 means now; every field is cut to its
  // cap (audit_record.h). UNAUTHENTICATED records beyond the per-peer rate
  // are counted, not stored. Errors are logged, not returned, and make
  // CheckWritable refuse until a record is written again.
  void Record(AuditRecord record);

  // Note [Audit fail closed]: OK when a mutating call may go ahead;
  // RESOURCE_EXHAUSTED when the state directory's file system is nearly
  // full, UNAVAILABLE when the last record could not be written.
  absl::Status CheckWritable() const;

  // UNAUTHENTICATED records left out by the rate limit since the start.
  int64_t refused_auth_dropped() const;

  // One page of records, newest first. PERMISSION_DENIED unless `caller` is
  // an admin; INVALID_ARGUMENT for a bad page_size or page_token.
  absl::StatusOr<AuditPage> List(const Principal& caller, const AuditQuery& query);

  // The JSON-lines file; empty when off.
  const std::string& jsonl_path() const { return options_.jsonl_path; }

 private:
  // Per-peer token bucket of refused-authentication records.
  struct PeerBucket {
    double tokens = kRefusedAuthBurst;
    absl::Time last_refill;
    int64_t dropped = 0;  // left out since the last record kept
  };

  AuditLog(JobStore* store, AuditLogOptions options, int fd)
      : store_(store), options_(std::move(options)), fd_(fd) {}

  // False when a refused-auth record from `peer` is over the rate; else
  // true, and *dropped is how many were left out before it. Needs mu_.
  bool AdmitRefusedAuth(const std::string& peer, absl::Time now, int64_t* dropped);

  JobStore* const store_;
  const AuditLogOptions options_;
  mutable std::mutex mu_;   // orders file lines like store seqs; guards below
  const int fd_;            // -1 when there is no file
  std::string last_error_;  // why the last record failed; empty when it was written
  std::map<std::string, PeerBucket> refused_auth_peers_;
  PeerBucket refused_auth_overflow_;  // peers beyond kMaxRefusedAuthPeers
  int64_t refused_auth_dropped_ = 0;
};

// The peer address without its port: "ipv4:10.0.0.7:41234" -> "ipv4:10.0.0.7",
// "ipv6:[::1]:5555" -> "ipv6:[::1]"; other forms unchanged.
std::string PeerHost(absl::string_view peer);

// The JSON line of `record` (no trailing newline), as written to the file.
std::string AuditRecordToJsonLine(const AuditRecord& record);

// "2025-01-31T12:00:00.123Z": `unix_ms` in UTC, ISO 8601 with milliseconds.
std::string FormatUtcTime(int64_t unix_ms);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_AUDIT_LOG_H_
