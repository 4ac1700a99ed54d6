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
// A failed write is logged (megatraind's stderr) and does not fail the RPC:
// the call has already taken effect when it is recorded.
//
// Thread-safety: all methods are thread-safe. Ownership: the store is
// borrowed and must outlive the log; the file descriptor is owned and closed
// by the destructor.
#ifndef MEGATRAIN_SERVER_AUDIT_LOG_H_
#define MEGATRAIN_SERVER_AUDIT_LOG_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/audit_record.h"
#include "server/auth.h"
#include "server/job_store.h"

namespace megatrain::server {

class AuditLog {
 public:
  // Records into `store` and, when `jsonl_path` is not empty, appends to
  // that file (created if missing, mode 0600). FAILED_PRECONDITION naming
  // the file when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(JobStore* store,
                                                        const std::string& jsonl_path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Stores one record: time_unix_ms 0 means now; `message` and `detail` are
  // cut to kMaxAuditTextBytes. Errors are logged, not returned.
  void Record(AuditRecord record);

  // One page of records, newest first. PERMISSION_DENIED unless `caller` is
  // an admin; INVALID_ARGUMENT for a bad page_size or page_token.
  absl::StatusOr<AuditPage> List(const Principal& caller, const AuditQuery& query);

  // The JSON-lines file; empty when off.
  const std::string& jsonl_path() const { return jsonl_path_; }

 private:
  AuditLog(JobStore* store, std::string jsonl_path, int fd)
      : store_(store), jsonl_path_(std::move(jsonl_path)), fd_(fd) {}

  JobStore* const store_;
  const std::string jsonl_path_;
  std::mutex mu_;  // orders file lines like store seqs
  const int fd_;   // -1 when there is no file
};

// The JSON line of `record` (no trailing newline), as written to the file.
std::string AuditRecordToJsonLine(const AuditRecord& record);

// "2025-01-31T12:00:00.123Z": `unix_ms` in UTC, ISO 8601 with milliseconds.
std::string FormatUtcTime(int64_t unix_ms);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_AUDIT_LOG_H_
