// See job_store.h.
#include "server/core/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/runtime/status_macros.h"
#include "server/core/job_request_json.h"

namespace megatrain::server {
namespace {

using nlohmann::json;

// Version 2 added the `audit` table (CREATE TABLE IF NOT EXISTS upgrades a
// version-1 database in place). Version 3 added jobs.output_dir,
// checkpoints.owner and checkpoints.manifest_xxh64 (MigrateToVersion3).
constexpr int kSchemaVersion = 3;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  owner TEXT NOT NULL,
  request_id TEXT,
  spec_json TEXT NOT NULL,
  priority INTEGER NOT NULL,
  state INTEGER NOT NULL,
  create_time_unix_ms INTEGER NOT NULL,
  start_time_unix_ms INTEGER NOT NULL DEFAULT 0,
  end_time_unix_ms INTEGER NOT NULL DEFAULT 0,
  step INTEGER NOT NULL DEFAULT 0,
  max_steps INTEGER NOT NULL DEFAULT 0,
  loss REAL NOT NULL DEFAULT 0,
  eval_loss REAL,
  tokens_per_s REAL NOT NULL DEFAULT 0,
  mfu REAL NOT NULL DEFAULT 0,
  tokens INTEGER NOT NULL DEFAULT 0,
  eta_seconds REAL NOT NULL DEFAULT 0,
  device TEXT NOT NULL DEFAULT '',
  host_memory_bytes INTEGER NOT NULL DEFAULT 0,
  error_code INTEGER NOT NULL DEFAULT 0,
  message TEXT NOT NULL DEFAULT '',
  resume_from TEXT NOT NULL DEFAULT '',
  output_dir TEXT NOT NULL DEFAULT '',
  UNIQUE (owner, request_id)
);
CREATE INDEX IF NOT EXISTS jobs_by_state_priority_seq ON jobs(state, priority DESC, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner_seq ON jobs(owner, seq);
CREATE INDEX IF NOT EXISTS jobs_by_owner_state ON jobs(owner, state);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job_seq ON events(job_id, seq);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  dir TEXT NOT NULL,
  bytes INTEGER NOT NULL DEFAULT 0,
  create_time_unix_ms INTEGER NOT NULL DEFAULT 0,
  write_seconds REAL NOT NULL DEFAULT 0,
  owner TEXT NOT NULL DEFAULT '',
  manifest_xxh64 TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  time_unix_ms INTEGER NOT NULL,
  user TEXT NOT NULL,
  role TEXT NOT NULL,
  peer TEXT NOT NULL,
  method TEXT NOT NULL,
  target TEXT NOT NULL,
  job_id TEXT NOT NULL,
  code INTEGER NOT NULL,
  message TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_user_seq ON audit(user, seq);
CREATE INDEX IF NOT EXISTS audit_by_job_seq ON audit(job_id, seq);
)sql";

// Columns of a full job row, in the order RowToJob reads them.
constexpr const char* kJobColumns =
    "seq, id, owner, request_id, spec_json, priority, state, create_time_unix_ms, "
    "start_time_unix_ms, end_time_unix_ms, step, max_steps, loss, eval_loss, "
    "tokens_per_s, mfu, tokens, eta_seconds, device, host_memory_bytes, error_code, "
    "message, resume_from";

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  std::string message = absl::StrCat("sqlite: ", what, ": ", sqlite3_errstr(rc));
  if (db != nullptr) absl::StrAppend(&message, " (", sqlite3_errmsg(db), ")");
  if (rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB) return absl::DataLossError(message);
  if ((rc & 0xff) == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(message);
  // A full disk is the operator's to fix, a busy or locked database passes:
  // neither is a bug (issue 14), so neither is INTERNAL.
  if ((rc & 0xff) == SQLITE_FULL) return absl::ResourceExhaustedError(message);
  if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// A prepared statement; finalised on destruction.
class Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, absl::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db, rc, absl::StrCat("prepare '", sql, "'"));
    return Statement(db, stmt, sql);
  }
  Statement(Statement&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), sql_(other.sql_) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() {
    if (stmt_ != nullptr) sqlite3_finalize(stmt_);
  }

  // Binding: 1-based index.
  void Bind(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  void Bind(int index, int value) { sqlite3_bind_int64(stmt_, index, value); }
  void Bind(int index, double value) { sqlite3_bind_double(stmt_, index, value); }
  void Bind(int index, absl::string_view value) {
    sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }
  void BindNull(int index) { sqlite3_bind_null(stmt_, index); }
  // NULL when empty.
  template <typename T>
  void Bind(int index, const std::optional<T>& value) {
    if (value.has_value()) {
      Bind(index, *value);
    } else {
      BindNull(index);
    }
  }
  // Binds `values` to parameters 1, 2, ... in order.
  template <typename... Values>
  void BindAll(const Values&... values) {
    int index = 1;
    (Bind(index++, values), ...);
  }

  // Advances; true when a row is available. Errors as statuses.
  absl::StatusOr<bool> Step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, absl::StrCat("step '", sql_, "'"));
  }
  absl::Status Run() {
    auto row = Step();
    return row.ok() ? absl::OkStatus() : row.status();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) const { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    if (text == nullptr) return "";
    return std::string(reinterpret_cast<const char*>(text),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt, absl::string_view sql)
      : db_(db), stmt_(stmt), sql_(sql) {}
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  absl::string_view sql_;  // for messages; the caller keeps the text alive
};

absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, absl::StrCat("exec '", sql, "'"));
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

// BEGIN IMMEDIATE ... COMMIT, rolled back unless Commit() succeeds.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(sqlite3* db) {
    MEGATRAIN_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
    return Transaction(db);
  }
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() {
    if (db_ != nullptr) Exec(db_, "ROLLBACK").IgnoreError();
  }
  absl::Status Commit() {
    absl::Status status = Exec(db_, "COMMIT");
    if (status.ok()) db_ = nullptr;
    return status;
  }

 private:
  explicit Transaction(sqlite3* db) : db_(db) {}
  sqlite3* db_;
};

// Steps `stmt` once: the first column of its row as an integer, or
// `if_none` when it returns no row (COUNT, MAX and the like).
absl::StatusOr<int64_t> ReadInt(Statement& stmt, int64_t if_none) {
  MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  return row ? stmt.Int(0) : if_none;
}

// Every row of `stmt`, each made by `row_to` (a StatusOr<T>(const
// Statement&)): the first error stops the read.
template <typename RowTo>
auto ReadRows(Statement& stmt, RowTo row_to)
    -> absl::StatusOr<std::vector<typename decltype(row_to(stmt))::value_type>> {
  std::vector<typename decltype(row_to(stmt))::value_type> rows;
  while (true) {
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    MEGATRAIN_ASSIGN_OR_RETURN(auto value, row_to(stmt));
    rows.push_back(std::move(value));
  }
  return rows;
}

// Up to `page_size` rows of `stmt` (which selects one more) into `*rows`;
// true when another page follows.
template <typename T, typename RowTo>
absl::StatusOr<bool> ReadPage(Statement& stmt, int page_size, RowTo row_to, std::vector<T>* rows) {
  while (true) {
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return false;
    if (static_cast<int>(rows->size()) == page_size) return true;
    MEGATRAIN_ASSIGN_OR_RETURN(T value, row_to(stmt));
    rows->push_back(std::move(value));
  }
}

// Runs `stmt`, a change of the job row `id`; NOT_FOUND when no row changed.
absl::Status ChangeJobRow(sqlite3* db, Statement& stmt, absl::string_view id) {
  MEGATRAIN_RETURN_IF_ERROR(stmt.Run());
  if (sqlite3_changes(db) == 0)
    return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> RowToJob(const Statement& row) {
  JobRecord job;
  job.seq = row.Int(0);
  job.id = row.Text(1);
  job.owner = row.Text(2);
  job.request_id = row.IsNull(3) ? "" : row.Text(3);
  MEGATRAIN_ASSIGN_OR_RETURN(job.request, JobRequestFromJson(row.Text(4)));
  job.request.priority = static_cast<int32_t>(row.Int(5));
  const int64_t state = row.Int(6);
  if (state < static_cast<int64_t>(JobState::kQueued) ||
      state > static_cast<int64_t>(JobState::kCancelled)) {
    return absl::DataLossError(absl::StrCat("job ", job.id, ": bad state ", state));
  }
  job.state = static_cast<JobState>(state);
  job.create_time_unix_ms = row.Int(7);
  job.start_time_unix_ms = row.Int(8);
  job.end_time_unix_ms = row.Int(9);
  job.progress.step = row.Int(10);
  job.progress.max_steps = row.Int(11);
  job.progress.loss = row.Double(12);
  if (!row.IsNull(13)) job.progress.eval_loss = row.Double(13);
  job.progress.tokens_per_s = row.Double(14);
  job.progress.mfu = row.Double(15);
  job.progress.tokens = row.Int(16);
  job.progress.eta_seconds = row.Double(17);
  job.device = row.Text(18);
  job.host_memory_bytes = row.Int(19);
  job.error_code = static_cast<absl::StatusCode>(row.Int(20));
  job.message = row.Text(21);
  job.resume_from = row.Text(22);
  return job;
}

// The job of `stmt`'s first row; none when it returns no row.
absl::StatusOr<std::optional<JobRecord>> ReadOptionalJob(Statement& stmt) {
  MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<JobRecord>();
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, RowToJob(stmt));
  return std::optional<JobRecord>(std::move(job));
}

std::string EventPayload(const JobEvent& event) {
  json j;
  switch (event.kind) {
    case JobEvent::Kind::kStateChange:
      j = {{"state", static_cast<int>(event.state)}, {"message", event.message}};
      break;
    case JobEvent::Kind::kStep:
      j = {{"step", event.step},
           {"max_steps", event.max_steps},
           {"loss", event.loss},
           {"grad_norm", event.grad_norm},
           {"lr", event.lr},
           {"tokens_per_s", event.tokens_per_s},
           {"mfu", event.mfu},
           {"skipped", event.skipped},
           {"step_seconds", event.step_seconds},
           {"eta_seconds", event.eta_seconds},
           {"aux_loss", event.aux_loss}};
      if (event.nvme_read_bytes > 0 || event.nvme_written_bytes > 0) {
        j["nvme_read_bytes"] = event.nvme_read_bytes;
        j["nvme_written_bytes"] = event.nvme_written_bytes;
      }
      j["devices"] = event.devices;
      j["device_tokens_per_s"] = event.device_tokens_per_s;
      break;
    case JobEvent::Kind::kEval:
      j = {{"step", event.step}, {"eval_loss", event.eval_loss}};
      break;
    case JobEvent::Kind::kCheckpoint:
      j = {{"step", event.step},
           {"dir", event.checkpoint_dir},
           {"seconds", event.checkpoint_seconds}};
      break;
  }
  // Non-finite doubles (a NaN loss) become null in JSON; read back as 0.
  return j.dump();
}

template <typename T>
void GetField(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) *out = it->get<T>();
}

absl::StatusOr<JobEvent> RowToEvent(const Statement& row) {
  JobEvent event;
  event.seq = row.Int(0);
  event.job_id = row.Text(1);
  event.time_unix_ms = row.Int(2);
  const int64_t kind = row.Int(3);
  if (kind < 1 || kind > 4) {
    return absl::DataLossError(absl::StrCat("event ", event.seq, ": bad kind ", kind));
  }
  event.kind = static_cast<JobEvent::Kind>(kind);
  try {
    const json j = json::parse(row.Text(4));
    int state = static_cast<int>(JobState::kQueued);
    GetField(j, "state", &state);
    event.state = static_cast<JobState>(state);
    GetField(j, "message", &event.message);
    GetField(j, "step", &event.step);
    GetField(j, "max_steps", &event.max_steps);
    GetField(j, "loss", &event.loss);
    GetField(j, "grad_norm", &event.grad_norm);
    GetField(j, "lr", &event.lr);
    GetField(j, "tokens_per_s", &event.tokens_per_s);
    GetField(j, "mfu", &event.mfu);
    GetField(j, "skipped", &event.skipped);
    GetField(j, "step_seconds", &event.step_seconds);
    GetField(j, "eta_seconds", &event.eta_seconds);
    GetField(j, "aux_loss", &event.aux_loss);
    GetField(j, "nvme_read_bytes", &event.nvme_read_bytes);
    GetField(j, "nvme_written_bytes", &event.nvme_written_bytes);
    // Events of daemons before issue 21 have neither: one device.
    GetField(j, "devices", &event.devices);
    if (!j.contains("device_tokens_per_s")) event.device_tokens_per_s = event.tokens_per_s;
    GetField(j, "device_tokens_per_s", &event.device_tokens_per_s);
    GetField(j, "eval_loss", &event.eval_loss);
    GetField(j, "dir", &event.checkpoint_dir);
    GetField(j, "seconds", &event.checkpoint_seconds);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("event ", event.seq, ": ", e.what()));
  }
  return event;
}

absl::StatusOr<int64_t> InsertEvent(sqlite3* db, const JobEvent& event) {
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(
          db, "INSERT INTO events (job_id, time_unix_ms, kind, payload) VALUES (?, ?, ?, ?)"));
  stmt.BindAll(event.job_id, event.time_unix_ms != 0 ? event.time_unix_ms : NowUnixMs(),
               static_cast<int64_t>(event.kind), EventPayload(event));
  MEGATRAIN_RETURN_IF_ERROR(stmt.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db));
}

// Appends `event` and commits `txn`, which holds the change of its job's
// row: the event's seq.
absl::StatusOr<int64_t> AppendEventAndCommit(sqlite3* db, const JobEvent& event, Transaction& txn) {
  MEGATRAIN_ASSIGN_OR_RETURN(int64_t seq, InsertEvent(db, event));
  MEGATRAIN_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

// A row of ListCheckpoints' SELECT; DATA_LOSS for a bad manifest hash.
absl::StatusOr<CheckpointRecord> RowToCheckpoint(const Statement& row) {
  CheckpointRecord checkpoint;
  checkpoint.job_id = row.Text(0);
  checkpoint.step = row.Int(1);
  checkpoint.dir = row.Text(2);
  checkpoint.bytes = row.Int(3);
  checkpoint.create_time_unix_ms = row.Int(4);
  checkpoint.write_seconds = row.Double(5);
  checkpoint.owner = row.Text(6);
  const std::string manifest_hex = row.Text(7);
  if (!manifest_hex.empty() && !absl::SimpleHexAtoi(manifest_hex, &checkpoint.manifest_xxh64)) {
    return absl::DataLossError(absl::StrCat("checkpoint ",
                                            CheckpointId(checkpoint.job_id, checkpoint.step),
                                            ": bad manifest_xxh64 '", manifest_hex, "'"));
  }
  return checkpoint;
}

// A row of ListAudit's SELECT; DATA_LOSS for a status code out of range.
absl::StatusOr<AuditRecord> RowToAudit(const Statement& row) {
  AuditRecord record;
  record.seq = row.Int(0);
  record.time_unix_ms = row.Int(1);
  record.user = row.Text(2);
  record.role = row.Text(3);
  record.peer = row.Text(4);
  record.method = row.Text(5);
  record.target = row.Text(6);
  record.job_id = row.Text(7);
  const int64_t code = row.Int(8);
  if (code < 0 || code > 16) {
    return absl::DataLossError(absl::StrCat("audit record ", record.seq, ": bad code ", code));
  }
  record.code = static_cast<absl::StatusCode>(code);
  record.message = row.Text(9);
  record.detail = row.Text(10);
  return record;
}

// Page tokens are opaque to clients: web-safe base64 of
// "<version>|<seq of the last row returned>|<fingerprint of the filters>",
// version "v1" for jobs, "a1" for audit records.
constexpr uint64_t kFnvOffsetBasis = 1469598103934665603ull;

// FNV-1a 64 over `bytes`, continuing from `*hash`: stable across builds,
// unlike std::hash.
void FnvMix(absl::string_view bytes, uint64_t* hash) {
  for (unsigned char c : bytes) {
    *hash ^= c;
    *hash *= 1099511628211ull;
  }
}

uint64_t FilterFingerprint(const JobQuery& query) {
  uint64_t hash = kFnvOffsetBasis;
  FnvMix(query.owner, &hash);
  for (JobState state : query.states) FnvMix(absl::StrCat("|", static_cast<int>(state)), &hash);
  return hash;
}

uint64_t AuditFingerprint(const AuditQuery& query) {
  uint64_t hash = kFnvOffsetBasis;
  for (absl::string_view part :
       {absl::string_view(query.user), absl::string_view("|"), absl::string_view(query.job_id),
        absl::string_view("|"), absl::string_view(query.method)}) {
    FnvMix(part, &hash);
  }
  return hash;
}

std::string MakePageToken(absl::string_view version, int64_t last_seq, uint64_t fingerprint) {
  return absl::WebSafeBase64Escape(absl::StrCat(version, "|", last_seq, "|", fingerprint));
}

// The last seq of the previous page, from a token of `version` that must carry
// `fingerprint`; `filters` names the query's filters for the error message.
absl::StatusOr<int64_t> ParsePageToken(absl::string_view token, absl::string_view version,
                                       uint64_t fingerprint, absl::string_view filters) {
  std::string raw;
  std::vector<absl::string_view> parts;
  if (absl::WebSafeBase64Unescape(token, &raw)) parts = absl::StrSplit(raw, '|');
  int64_t last_seq = 0;
  uint64_t token_fingerprint = 0;
  if (parts.size() != 3 || parts[0] != version || !absl::SimpleAtoi(parts[1], &last_seq) ||
      !absl::SimpleAtoi(parts[2], &token_fingerprint)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: malformed token '", token, "'"));
  }
  if (token_fingerprint != fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: was issued for different filters (", filters, ")"));
  }
  return last_seq;
}

// The page size to use for a requested `page_size` (0: the default).
absl::StatusOr<int> EffectivePageSize(int page_size) {
  if (page_size < 0 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be in [0, ", kMaxPageSize, "], got ", page_size));
  }
  return page_size == 0 ? kDefaultPageSize : page_size;
}

// True when `table` has a column `column`.
absl::StatusOr<bool> HasColumn(sqlite3* db, absl::string_view table, absl::string_view column) {
  const std::string sql = absl::StrCat("PRAGMA table_info(", table, ")");
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, sql));
  while (true) {
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return false;
    if (stmt.Text(1) == column) return true;
  }
}

// Adds `table`.`column` (declared as `type`) unless it exists.
absl::Status AddColumnIfMissing(sqlite3* db, absl::string_view table, absl::string_view column,
                                absl::string_view type) {
  MEGATRAIN_ASSIGN_OR_RETURN(bool present, HasColumn(db, table, column));
  if (present) return absl::OkStatus();
  return Exec(db, absl::StrCat("ALTER TABLE ", table, " ADD COLUMN ", column, " ", type).c_str());
}

// Brings a version-1 or -2 database to version 3 (idempotent; a fresh one
// already has the columns): adds jobs.output_dir, filled from each job's
// spec, and checkpoints.owner (filled from jobs.owner) and
// checkpoints.manifest_xxh64 (left '': those records are legacy ones).
absl::Status MigrateToVersion3(sqlite3* db) {
  MEGATRAIN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  MEGATRAIN_RETURN_IF_ERROR(
      AddColumnIfMissing(db, "jobs", "output_dir", "TEXT NOT NULL DEFAULT ''"));
  MEGATRAIN_RETURN_IF_ERROR(
      AddColumnIfMissing(db, "checkpoints", "owner", "TEXT NOT NULL DEFAULT ''"));
  MEGATRAIN_RETURN_IF_ERROR(
      AddColumnIfMissing(db, "checkpoints", "manifest_xxh64", "TEXT NOT NULL DEFAULT ''"));
  std::vector<std::pair<std::string, std::string>> output_dirs;  // job id -> output_dir
  {
    MEGATRAIN_ASSIGN_OR_RETURN(
        Statement stmt,
        Statement::Prepare(db, "SELECT id, spec_json FROM jobs WHERE output_dir = ''"));
    while (true) {
      MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
      if (!row) break;
      const std::string id = stmt.Text(0);
      absl::StatusOr<JobRequest> request = JobRequestFromJson(stmt.Text(1));
      if (!request.ok()) return Annotate(request.status(), absl::StrCat("job ", id));
      output_dirs.emplace_back(id, NormalizeOutputDir(request->spec.output_dir));
    }
  }
  for (const auto& [id, output_dir] : output_dirs) {
    MEGATRAIN_ASSIGN_OR_RETURN(
        Statement stmt, Statement::Prepare(db, "UPDATE jobs SET output_dir = ? WHERE id = ?"));
    stmt.BindAll(output_dir, id);
    MEGATRAIN_RETURN_IF_ERROR(stmt.Run());
  }
  MEGATRAIN_RETURN_IF_ERROR(
      Exec(db,
           "UPDATE checkpoints SET owner = COALESCE((SELECT owner FROM jobs WHERE jobs.id = "
           "checkpoints.job_id), '') WHERE owner = ''"));
  MEGATRAIN_RETURN_IF_ERROR(
      Exec(db, "CREATE INDEX IF NOT EXISTS jobs_by_output_dir ON jobs(output_dir)"));
  return txn.Commit();
}

}  // namespace

std::string NormalizeOutputDir(absl::string_view output_dir) {
  if (output_dir.empty()) return "";
  std::string normal = std::filesystem::path(std::string(output_dir)).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

absl::Status JobStore::CheckSameFileLocked() {
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0) {
    const int error = errno;
    const std::string what = error == ENOENT
                                 ? std::string("deleted")
                                 : absl::StrCat("made unreachable (", std::strerror(error), ")");
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": the job database was ", what,
        " while megatraind runs; refusing to write (the change would be lost). Stop the "
        "daemon, restore the file from a backup (or move the job directories away to start "
        "afresh) and start it again"));
  }
  if (static_cast<uint64_t>(now.st_dev) != file_device_ ||
      static_cast<uint64_t>(now.st_ino) != file_inode_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": the job database was replaced while megatraind runs (opened inode ", file_inode_,
        ", the path now names inode ", now.st_ino,
        "); refusing to write to the old file. Stop the daemon, put the right database in "
        "place and start it again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, absl::StrCat("open ", path));
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  {
    struct stat opened {};
    if (::stat(path.c_str(), &opened) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": stat after opening"));
    }
    store->file_device_ = static_cast<uint64_t>(opened.st_dev);
    store->file_inode_ = static_cast<uint64_t>(opened.st_ino);
  }
  // busy_timeout: another process (e.g. the sqlite3 shell) may hold a lock.
  MEGATRAIN_RETURN_IF_ERROR(Annotate(Exec(db, "PRAGMA busy_timeout = 5000"), path));
  {
    MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, "PRAGMA journal_mode = WAL"));
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row || stmt.Text(0) != "wal") {
      return absl::InternalError(absl::StrCat(path, ": cannot switch SQLite to WAL mode"));
    }
  }
  MEGATRAIN_RETURN_IF_ERROR(Annotate(Exec(db, "PRAGMA synchronous = NORMAL"), path));
  int64_t version = 0;
  {
    MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, "PRAGMA user_version"));
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (row) version = stmt.Int(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": schema version ", version, " is newer than this daemon's (", kSchemaVersion, ")"));
  }
  MEGATRAIN_RETURN_IF_ERROR(Annotate(Exec(db, kSchema), path));
  MEGATRAIN_RETURN_IF_ERROR(Annotate(MigrateToVersion3(db), absl::StrCat(path, ": migrating")));
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(Exec(db, absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str()), path));
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::StatusOr<int64_t> JobStore::NextJobSeq() {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt,
                             Statement::Prepare(db_, "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs"));
  return ReadInt(stmt, 1);
}

absl::StatusOr<int64_t> JobStore::InsertJob(const JobRecord& job, const JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  {
    MEGATRAIN_ASSIGN_OR_RETURN(
        Statement stmt,
        Statement::Prepare(db_,
                           "INSERT INTO jobs (seq, id, owner, request_id, spec_json, priority, "
                           "state, create_time_unix_ms, start_time_unix_ms, end_time_unix_ms, "
                           "max_steps, device, host_memory_bytes, error_code, message, "
                           "resume_from, output_dir) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    // request_id NULL when empty: the unique index ignores NULLs.
    const std::optional<std::string> request_id =
        job.request_id.empty() ? std::nullopt : std::optional<std::string>(job.request_id);
    stmt.BindAll(job.seq, job.id, job.owner, request_id, JobRequestToJson(job.request),
                 static_cast<int64_t>(job.request.priority), static_cast<int64_t>(job.state),
                 job.create_time_unix_ms, job.start_time_unix_ms, job.end_time_unix_ms,
                 job.progress.max_steps, job.device, job.host_memory_bytes,
                 static_cast<int64_t>(job.error_code), job.message, job.resume_from,
                 NormalizeOutputDir(job.request.spec.output_dir));
    MEGATRAIN_RETURN_IF_ERROR(Annotate(stmt.Run(), absl::StrCat("job ", job.id)));
  }
  return AppendEventAndCommit(db_, event, txn);
}

absl::StatusOr<JobRecord> JobStore::GetJob(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  static const std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?");
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  stmt.Bind(1, id);
  MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  return RowToJob(stmt);
}

absl::StatusOr<std::optional<JobRecord>> JobStore::FindByRequestId(absl::string_view owner,
                                                                   absl::string_view request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  static const std::string sql =
      absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE owner = ? AND request_id = ?");
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  stmt.BindAll(owner, request_id);
  return ReadOptionalJob(stmt);
}

absl::StatusOr<JobPage> JobStore::ListJobs(const JobQuery& query) {
  MEGATRAIN_ASSIGN_OR_RETURN(const int page_size, EffectivePageSize(query.page_size));
  int64_t before_seq = INT64_MAX;
  if (!query.page_token.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(
        before_seq,
        ParsePageToken(query.page_token, "v1", FilterFingerprint(query), "states, owner"));
  }
  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE seq < ?");
  if (!query.owner.empty()) absl::StrAppend(&sql, " AND owner = ?");
  if (!query.states.empty()) {
    std::vector<std::string> marks(query.states.size(), "?");
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(marks, ", "), ")");
  }
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ?");

  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  int index = 1;
  stmt.Bind(index++, before_seq);
  if (!query.owner.empty()) stmt.Bind(index++, query.owner);
  for (JobState state : query.states) stmt.Bind(index++, static_cast<int64_t>(state));
  // One more than the page: tells whether another page follows.
  stmt.Bind(index++, static_cast<int64_t>(page_size) + 1);
  JobPage page;
  MEGATRAIN_ASSIGN_OR_RETURN(const bool more, ReadPage(stmt, page_size, RowToJob, &page.jobs));
  if (more) {
    page.next_page_token = MakePageToken("v1", page.jobs.back().seq, FilterFingerprint(query));
  }
  return page;
}

absl::StatusOr<std::vector<JobRecord>> JobStore::JobsInState(JobState state) {
  std::lock_guard<std::mutex> lock(mu_);
  static const std::string sql = absl::StrCat(
      "SELECT ", kJobColumns, " FROM jobs WHERE state = ? ORDER BY priority DESC, seq ASC");
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  stmt.Bind(1, static_cast<int64_t>(state));
  return ReadRows(stmt, RowToJob);
}

absl::StatusOr<std::map<JobState, int64_t>> JobStore::CountByState() {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt, Statement::Prepare(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state"));
  std::map<JobState, int64_t> counts;
  for (JobState state : kAllJobStates) counts[state] = 0;
  while (true) {
    MEGATRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    const int64_t state = stmt.Int(0);
    if (state >= 1 && state <= 7) counts[static_cast<JobState>(state)] = stmt.Int(1);
  }
  return counts;
}

absl::StatusOr<std::optional<JobRecord>> JobStore::FindOutputDirOverlap(
    absl::string_view output_dir) {
  const std::string dir = NormalizeOutputDir(output_dir);
  if (dir.empty()) return std::optional<JobRecord>();
  // Inside `dir`: starts with "dir/" (just "/" for the root). Containing
  // `dir`: `dir` starts with "output_dir/".
  const std::string dir_prefix = dir == "/" ? dir : absl::StrCat(dir, "/");
  static const std::string sql =
      absl::StrCat("SELECT ", kJobColumns,
                   " FROM jobs WHERE output_dir <> '' AND (output_dir = ?1 OR "
                   "substr(output_dir, 1, length(?2)) = ?2 OR "
                   "substr(?1, 1, length(output_dir) + 1) = output_dir || '/' OR output_dir = '/') "
                   "AND (state NOT IN (?3, ?4, ?5) OR "
                   "EXISTS (SELECT 1 FROM checkpoints WHERE checkpoints.job_id = jobs.id)) "
                   "ORDER BY seq LIMIT 1");
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  stmt.BindAll(dir, dir_prefix, static_cast<int64_t>(JobState::kSucceeded),
               static_cast<int64_t>(JobState::kFailed), static_cast<int64_t>(JobState::kCancelled));
  return ReadOptionalJob(stmt);
}

absl::StatusOr<int64_t> JobStore::CountJobs(absl::string_view owner, JobState state) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_, "SELECT COUNT(*) FROM jobs WHERE owner = ? AND state = ?"));
  stmt.BindAll(owner, static_cast<int64_t>(state));
  return ReadInt(stmt, 0);
}

absl::StatusOr<int64_t> JobStore::UpdateState(const JobRecord& job, const JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  {
    MEGATRAIN_ASSIGN_OR_RETURN(
        Statement stmt,
        Statement::Prepare(db_,
                           "UPDATE jobs SET state = ?, start_time_unix_ms = ?, "
                           "end_time_unix_ms = ?, device = ?, host_memory_bytes = ?, "
                           "error_code = ?, message = ?, resume_from = ? WHERE id = ?"));
    stmt.BindAll(static_cast<int64_t>(job.state), job.start_time_unix_ms, job.end_time_unix_ms,
                 job.device, job.host_memory_bytes, static_cast<int64_t>(job.error_code),
                 job.message, job.resume_from, job.id);
    MEGATRAIN_RETURN_IF_ERROR(ChangeJobRow(db_, stmt, job.id));
  }
  return AppendEventAndCommit(db_, event, txn);
}

absl::StatusOr<int64_t> JobStore::UpdateProgress(absl::string_view id, const JobProgress& progress,
                                                 const JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  {
    MEGATRAIN_ASSIGN_OR_RETURN(
        Statement stmt,
        Statement::Prepare(db_,
                           "UPDATE jobs SET step = ?, max_steps = ?, loss = ?, eval_loss = ?, "
                           "tokens_per_s = ?, mfu = ?, tokens = ?, eta_seconds = ? "
                           "WHERE id = ?"));
    stmt.BindAll(progress.step, progress.max_steps, progress.loss, progress.eval_loss,
                 progress.tokens_per_s, progress.mfu, progress.tokens, progress.eta_seconds, id);
    MEGATRAIN_RETURN_IF_ERROR(ChangeJobRow(db_, stmt, id));
  }
  return AppendEventAndCommit(db_, event, txn);
}

absl::StatusOr<int64_t> JobStore::AppendEvent(const JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  return InsertEvent(db_, event);
}

absl::StatusOr<std::vector<JobEvent>> JobStore::ListEvents(absl::string_view id, int64_t after_seq,
                                                           int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "SELECT seq, job_id, time_unix_ms, kind, payload FROM events "
                         "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?"));
  stmt.BindAll(id, after_seq, static_cast<int64_t>(limit));
  return ReadRows(stmt, RowToEvent);
}

absl::StatusOr<int64_t> JobStore::LastEventSeq(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?"));
  stmt.Bind(1, id);
  return ReadInt(stmt, 0);
}

absl::Status JobStore::RecordCheckpoint(const CheckpointRecord& checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "INSERT OR REPLACE INTO checkpoints (job_id, step, dir, bytes, "
                         "create_time_unix_ms, write_seconds, owner, manifest_xxh64) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"));
  // '' for a legacy record (no hash known); 16 hex digits otherwise.
  const std::string manifest_hex =
      checkpoint.manifest_xxh64 == 0 ? "" : absl::StrFormat("%016x", checkpoint.manifest_xxh64);
  stmt.BindAll(checkpoint.job_id, checkpoint.step, checkpoint.dir, checkpoint.bytes,
               checkpoint.create_time_unix_ms, checkpoint.write_seconds, checkpoint.owner,
               manifest_hex);
  return stmt.Run();
}

absl::StatusOr<std::vector<CheckpointRecord>> JobStore::ListCheckpoints(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "SELECT job_id, step, dir, bytes, create_time_unix_ms, write_seconds, "
                         "owner, manifest_xxh64 FROM checkpoints WHERE job_id = ? ORDER BY step"));
  stmt.Bind(1, id);
  return ReadRows(stmt, RowToCheckpoint);
}

absl::Status JobStore::DeleteCheckpoint(absl::string_view id, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?"));
  stmt.BindAll(id, step);
  return stmt.Run();
}

absl::StatusOr<int64_t> JobStore::AppendAudit(const AuditRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_RETURN_IF_ERROR(CheckSameFileLocked());
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "INSERT INTO audit (time_unix_ms, user, role, peer, method, target, "
                         "job_id, code, message, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  stmt.BindAll(record.time_unix_ms != 0 ? record.time_unix_ms : NowUnixMs(), record.user,
               record.role, record.peer, record.method, record.target, record.job_id,
               static_cast<int64_t>(record.code), record.message, record.detail);
  MEGATRAIN_RETURN_IF_ERROR(stmt.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

absl::StatusOr<AuditPage> JobStore::ListAudit(const AuditQuery& query) {
  MEGATRAIN_ASSIGN_OR_RETURN(const int page_size, EffectivePageSize(query.page_size));
  int64_t before_seq = INT64_MAX;
  if (!query.page_token.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(
        before_seq,
        ParsePageToken(query.page_token, "a1", AuditFingerprint(query), "user, job_id, method"));
  }
  std::string sql =
      "SELECT seq, time_unix_ms, user, role, peer, method, target, job_id, code, message, "
      "detail FROM audit WHERE seq < ?";
  if (!query.user.empty()) absl::StrAppend(&sql, " AND user = ?");
  if (!query.job_id.empty()) absl::StrAppend(&sql, " AND job_id = ?");
  if (!query.method.empty()) absl::StrAppend(&sql, " AND method = ?");
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ?");

  std::lock_guard<std::mutex> lock(mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  int index = 1;
  stmt.Bind(index++, before_seq);
  if (!query.user.empty()) stmt.Bind(index++, query.user);
  if (!query.job_id.empty()) stmt.Bind(index++, query.job_id);
  if (!query.method.empty()) stmt.Bind(index++, query.method);
  // One more than the page: tells whether another page follows.
  stmt.Bind(index++, static_cast<int64_t>(page_size) + 1);
  AuditPage page;
  MEGATRAIN_ASSIGN_OR_RETURN(const bool more, ReadPage(stmt, page_size, RowToAudit, &page.records));
  if (more) {
    page.next_page_token = MakePageToken("a1", page.records.back().seq, AuditFingerprint(query));
  }
  return page;
}

// ---------------------------------------------------------------------------
// Queue queries (indexed; see job_store.h).

absl::StatusOr<int64_t> JobStore::CountLiveJobs(absl::string_view owner) {
  std::lock_guard<std::mutex> lock(mu_);
  // States 1..4 are QUEUED, RUNNING, SUSPENDING, SUSPENDED (job.h).
  const char* sql = owner.empty()
                        ? "SELECT COUNT(*) FROM jobs WHERE state BETWEEN 1 AND 4"
                        : "SELECT COUNT(*) FROM jobs WHERE owner = ? AND state BETWEEN 1 AND 4";
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, sql));
  if (!owner.empty()) stmt.Bind(1, owner);
  return ReadInt(stmt, 0);
}

absl::StatusOr<int64_t> JobStore::QueuePosition(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  // Counts the index entries before the job's own (priority DESC, seq) as
  // two index ranges (an OR of both would scan every queued entry).
  MEGATRAIN_ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "SELECT (SELECT COUNT(*) FROM jobs WHERE state = ?2 AND "
                         "priority > j.priority) + (SELECT COUNT(*) FROM jobs WHERE "
                         "state = ?2 AND priority = j.priority AND seq <= j.seq) "
                         "FROM jobs AS j WHERE j.id = ?1 AND j.state = ?2"));
  stmt.BindAll(id, static_cast<int64_t>(JobState::kQueued));
  return ReadInt(stmt, 0);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::QueuedJobsPage(
    const std::optional<QueueCursor>& after, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  static const std::string head_sql =
      absl::StrCat("SELECT ", kJobColumns,
                   " FROM jobs WHERE state = ?1 ORDER BY priority DESC, seq ASC LIMIT ?2");
  static const std::string after_sql = absl::StrCat(
      "SELECT ", kJobColumns,
      " FROM jobs WHERE state = ?1 AND (priority < ?3 OR (priority = ?3 AND seq > ?4)) "
      "ORDER BY priority DESC, seq ASC LIMIT ?2");
  MEGATRAIN_ASSIGN_OR_RETURN(Statement stmt,
                             Statement::Prepare(db_, after.has_value() ? after_sql : head_sql));
  stmt.Bind(1, static_cast<int64_t>(JobState::kQueued));
  stmt.Bind(2, static_cast<int64_t>(limit));
  if (after.has_value()) {
    stmt.Bind(3, static_cast<int64_t>(after->priority));
    stmt.Bind(4, after->seq);
  }
  return ReadRows(stmt, RowToJob);
}

}  // namespace megatrain::server
