// See audit_log.h.
#include "server/core/audit_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/core/logging.h"

namespace megatrain::server {
namespace {

// Cuts `text` to `max_bytes` (> 3), ending with "..." when cut. Cuts on a
// UTF-8 character boundary so that the JSON line stays valid.
void Truncate(std::string* text, size_t max_bytes) {
  if (text->size() <= max_bytes) return;
  size_t end = max_bytes - 3;
  while (end > 0 && (static_cast<unsigned char>((*text)[end]) & 0xC0) == 0x80) --end;
  text->resize(end);
  text->append("...");
}

void TruncateFields(AuditRecord* record) {
  Truncate(&record->user, kMaxAuditUserBytes);
  Truncate(&record->role, kMaxAuditRoleBytes);
  Truncate(&record->peer, kMaxAuditPeerBytes);
  Truncate(&record->method, kMaxAuditMethodBytes);
  Truncate(&record->target, kMaxAuditTargetBytes);
  Truncate(&record->job_id, kMaxAuditTargetBytes);
  Truncate(&record->message, kMaxAuditTextBytes);
  Truncate(&record->detail, kMaxAuditTextBytes);
}

}  // namespace

std::string PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = peer.rfind(':');
  if (colon <= 4) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

std::string FormatUtcTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string AuditRecordToJsonLine(const AuditRecord& record) {
  const nlohmann::json line = {{"seq", record.seq},
                               {"time", FormatUtcTime(record.time_unix_ms)},
                               {"time_unix_ms", record.time_unix_ms},
                               {"user", record.user},
                               {"role", record.role},
                               {"peer", record.peer},
                               {"method", record.method},
                               {"target", record.target},
                               {"job_id", record.job_id},
                               {"code", absl::StatusCodeToString(record.code)},
                               {"message", record.message},
                               {"detail", record.detail}};
  // Invalid UTF-8 from a client (a job name, a path) is replaced, not thrown.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(JobStore* store,
                                                         const std::string& jsonl_path) {
  AuditLogOptions options;
  options.jsonl_path = jsonl_path;
  return Open(store, std::move(options));
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(JobStore* store, AuditLogOptions options) {
  int fd = -1;
  const std::string& path = options.jsonl_path;
  if (!path.empty()) {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("audit log: cannot open '", path, "': ", std::strerror(errno)));
    }
    // A file made by an earlier version (or by hand) may be readable by
    // others; records name users, jobs and paths. Character devices
    // (/dev/null, /dev/full) are left alone.
    struct stat info;
    if (::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && (info.st_mode & 077) != 0 &&
        ::fchmod(fd, 0600) != 0) {
      LogWarning(absl::StrCat("audit log: cannot chmod 0600 '", path, "': ", std::strerror(errno)));
    }
  }
  return std::unique_ptr<AuditLog>(new AuditLog(store, std::move(options), fd));
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) ::close(fd_);
}

bool AuditLog::AdmitRefusedAuth(const std::string& peer, absl::Time now, int64_t* dropped) {
  PeerBucket* bucket = &refused_auth_overflow_;
  auto it = refused_auth_peers_.find(peer);
  if (it != refused_auth_peers_.end()) {
    bucket = &it->second;
  } else if (refused_auth_peers_.size() < kMaxRefusedAuthPeers) {
    bucket = &refused_auth_peers_[peer];
    bucket->last_refill = now;
  }
  if (bucket->last_refill == absl::Time()) bucket->last_refill = now;
  bucket->tokens = std::min<double>(
      kRefusedAuthBurst, bucket->tokens + (now - bucket->last_refill) / kRefusedAuthRefill);
  bucket->last_refill = now;
  if (bucket->tokens < 1) {
    ++refused_auth_dropped_;
    if (bucket->dropped++ == 0) {
      LogWarning(absl::StrCat("audit log: refused-authentication calls from ", peer,
                              " are over the rate (", kRefusedAuthBurst, ", then one per ",
                              absl::FormatDuration(kRefusedAuthRefill),
                              "); the next record kept says how many were left out"));
    }
    return false;
  }
  bucket->tokens -= 1;
  *dropped = bucket->dropped;
  bucket->dropped = 0;
  return true;
}

void AuditLog::Record(AuditRecord record) {
  if (record.time_unix_ms == 0) record.time_unix_ms = NowUnixMs();
  std::lock_guard<std::mutex> lock(mu_);
  if (record.code == absl::StatusCode::kUnauthenticated) {
    int64_t dropped = 0;
    if (!AdmitRefusedAuth(PeerHost(record.peer.substr(0, kMaxAuditPeerBytes)), absl::Now(),
                          &dropped)) {
      return;
    }
    if (dropped > 0) {
      record.detail = absl::StrCat(dropped,
                                   " earlier refused-authentication calls from this "
                                   "address were not recorded (rate limit)",
                                   record.detail.empty() ? "" : "; ", record.detail);
    }
  }
  TruncateFields(&record);
  std::string error;
  absl::StatusOr<int64_t> seq = store_->AppendAudit(record);
  if (seq.ok()) {
    record.seq = *seq;
  } else {
    error = absl::StrCat("storing in the database: ", seq.status().ToString());
  }
  if (fd_ >= 0) {
    const std::string line = AuditRecordToJsonLine(record) + "\n";
    // O_APPEND: one write() per line keeps lines whole even if another
    // process appends too. A short write (disk full) is reported, not retried.
    const ssize_t written = ::write(fd_, line.data(), line.size());
    if (written != static_cast<ssize_t>(line.size())) {
      if (!error.empty()) error.append("; ");
      absl::StrAppend(&error, "writing '", options_.jsonl_path,
                      "': ", written < 0 ? std::strerror(errno) : "short write");
    }
  }
  if (!error.empty()) {
    LogError(absl::StrCat("audit log: ", record.method, " by '", record.user, "': ", error,
                          "; mutating calls are refused until a record is written"));
  }
  last_error_ = std::move(error);
}

absl::Status AuditLog::CheckWritable() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_error_.empty()) {
      return absl::UnavailableError(
          absl::StrCat("the audit log cannot record this call (last write: ", last_error_,
                       "); mutating calls are refused until the operator fixes it"));
    }
  }
  if (options_.space_check_dir.empty()) return absl::OkStatus();
  struct statvfs fs;
  if (::statvfs(options_.space_check_dir.c_str(), &fs) != 0) return absl::OkStatus();
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (free_bytes >= options_.min_free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the daemon's state directory ", options_.space_check_dir, " has ", free_bytes,
                   " bytes free, less than the ", options_.min_free_bytes,
                   " needed to record this call; mutating calls are refused until space is freed"));
}

int64_t AuditLog::refused_auth_dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_auth_dropped_;
}

absl::StatusOr<AuditPage> AuditLog::List(const Principal& caller, const AuditQuery& query) {
  if (!caller.is_admin()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the audit log is for admins; user '", caller.name, "' is not one"));
  }
  return store_->ListAudit(query);
}

}  // namespace megatrain::server
