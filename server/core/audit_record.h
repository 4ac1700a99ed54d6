// Types of the audit log (server/core/audit_log.h): one record per mutating RPC,
// allowed or refused, and the query admins page through. Plain value types,
// kept apart from audit_log.h so that the job store can persist them without
// depending on the log.
//
// Thread-safety: plain value types.
#ifndef MEGATRAIN_SERVER_AUDIT_RECORD_H_
#define MEGATRAIN_SERVER_AUDIT_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace megatrain::server {

// Longest value kept of each field, in bytes (AuditLog::Record cuts longer
// ones, ending them with "..."): a record stays small whatever a client
// sends, also for calls refused before authentication. The user, role and
// method come from the daemon, the rest from the caller.
inline constexpr size_t kMaxAuditTextBytes = 1024;   // message, detail
inline constexpr size_t kMaxAuditUserBytes = 64;     // user (auth.h names are at most 64)
inline constexpr size_t kMaxAuditRoleBytes = 16;     // role
inline constexpr size_t kMaxAuditPeerBytes = 128;    // peer
inline constexpr size_t kMaxAuditMethodBytes = 64;   // method
inline constexpr size_t kMaxAuditTargetBytes = 160;  // target, job_id (ids: 128 + "...")

// One audited call.
struct AuditRecord {
  int64_t seq = 0;           // assigned by the store, increasing
  int64_t time_unix_ms = 0;  // when the call finished (UTC, Unix epoch ms)
  std::string user;          // authenticated user; empty when authentication failed
  std::string role;          // "user" | "admin"; empty when authentication failed
  std::string peer;          // gRPC peer, "ipv4:127.0.0.1:41234"
  std::string method;        // "SubmitJob", "CancelJob", ...
  std::string target;        // job id or checkpoint id; empty when unknown
  std::string job_id;        // the job `target` belongs to; empty when unknown
  absl::StatusCode code = absl::StatusCode::kOk;  // the call's result
  std::string message;                            // the error message; empty for OK
  std::string detail;  // method-specific: "request_id=r1 name=tiny", "out_dir=/x"
};

// A page request over the audit log, newest records first. Empty filters
// match everything.
struct AuditQuery {
  std::string user;
  std::string job_id;  // records of this job (its own and its checkpoints')
  std::string method;
  int page_size = 0;       // [0, 1000]; 0: 50
  std::string page_token;  // from the previous AuditPage; empty: first page
};

struct AuditPage {
  std::vector<AuditRecord> records;
  std::string next_page_token;  // empty on the last page
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_AUDIT_RECORD_H_
