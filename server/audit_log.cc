// See audit_log.h.
#include "server/audit_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/logging.h"

namespace megatrain::server {
namespace {

// Cuts `text` to kMaxAuditTextBytes, ending with "..." when cut. Cuts on a
// UTF-8 character boundary so that the JSON line stays valid.
void Truncate(std::string* text) {
  if (text->size() <= kMaxAuditTextBytes) return;
  size_t end = kMaxAuditTextBytes - 3;
  while (end > 0 && (static_cast<unsigned char>((*text)[end]) & 0xC0) == 0x80) --end;
  text->resize(end);
  text->append("...");
}

}  // namespace

std::string FormatUtcTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string AuditRecordToJsonLine(const AuditRecord& record) {
  const nlohmann::json line = {
      {"seq", record.seq},         {"time", FormatUtcTime(record.time_unix_ms)},
      {"time_unix_ms", record.time_unix_ms},
      {"user", record.user},       {"role", record.role},
      {"peer", record.peer},       {"method", record.method},
      {"target", record.target},   {"job_id", record.job_id},
      {"code", absl::StatusCodeToString(record.code)},
      {"message", record.message}, {"detail", record.detail}};
  // Invalid UTF-8 from a client (a job name, a path) is replaced, not thrown.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(JobStore* store,
                                                         const std::string& jsonl_path) {
  int fd = -1;
  if (!jsonl_path.empty()) {
    fd = ::open(jsonl_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "audit log: cannot open '", jsonl_path, "': ", std::strerror(errno)));
    }
  }
  return std::unique_ptr<AuditLog>(new AuditLog(store, jsonl_path, fd));
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) ::close(fd_);
}

void AuditLog::Record(AuditRecord record) {
  if (record.time_unix_ms == 0) record.time_unix_ms = NowUnixMs();
  Truncate(&record.message);
  Truncate(&record.detail);
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<int64_t> seq = store_->AppendAudit(record);
  if (seq.ok()) {
    record.seq = *seq;
  } else {
    LogError(absl::StrCat("audit log: storing ", record.method, " by '", record.user,
                          "': ", seq.status().ToString()));
  }
  if (fd_ < 0) return;
  const std::string line = AuditRecordToJsonLine(record) + "\n";
  // O_APPEND: one write() per line keeps lines whole even if another
  // process appends too. A short write (disk full) is reported, not retried.
  const ssize_t written = ::write(fd_, line.data(), line.size());
  if (written != static_cast<ssize_t>(line.size())) {
    LogError(absl::StrCat("audit log: writing '", jsonl_path_, "': ",
                          written < 0 ? std::strerror(errno) : "short write"));
  }
}

absl::StatusOr<AuditPage> AuditLog::List(const Principal& caller, const AuditQuery& query) {
  if (!caller.is_admin()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the audit log is for admins; user '", caller.name, "' is not one"));
  }
  return store_->ListAudit(query);
}

}  // namespace megatrain::server
