// Tests of server/core/audit_log.h and the audit table of server/core/job_store.h:
// records land in SQLite and in the JSON-lines file, admins page through
// them with filters, users are refused, long texts are cut.
#include "server/core/audit_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using nlohmann::json;
using ::testing::HasSubstr;

const Principal kAlice{"alice", Role::kUser};
const Principal kAdmin{"root", Role::kAdmin};

AuditRecord Record(const std::string& user, const std::string& method, const std::string& target,
                   absl::StatusCode code = absl::StatusCode::kOk) {
  AuditRecord record;
  record.user = user;
  record.role = "user";
  record.peer = "ipv4:127.0.0.1:1234";
  record.method = method;
  record.target = target;
  record.job_id = target.substr(0, target.find('/'));
  record.code = code;
  return record;
}

AuditQuery Query(const std::string& user, const std::string& job_id = "",
                 const std::string& method = "", int page_size = 0,
                 const std::string& page_token = "") {
  AuditQuery query;
  query.user = user;
  query.job_id = job_id;
  query.method = method;
  query.page_size = page_size;
  query.page_token = page_token;
  return query;
}

std::vector<json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(json::parse(line));
  return lines;
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto store = JobStore::Open(dir_ + "/megatrain.db");
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
    auto log = AuditLog::Open(store_.get(), dir_ + "/audit.jsonl");
    ASSERT_THAT(log, IsOk());
    log_ = *std::move(log);
  }

  std::string dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<AuditLog> log_;
};

TEST_F(AuditLogTest, RecordsGoToTheStoreAndTheJsonLinesFile) {
  AuditRecord denied =
      Record("bob", "CancelJob", "job-000001", absl::StatusCode::kPermissionDenied);
  denied.message = "job job-000001 belongs to another user";
  denied.time_unix_ms = 1700000000123;  // 2023-11-14T22:13:20.123Z
  log_->Record(denied);
  log_->Record(Record("alice", "SubmitJob", "job-000002"));

  absl::StatusOr<AuditPage> page = log_->List(kAdmin, {});
  ASSERT_THAT(page, IsOk());
  ASSERT_EQ(page->records.size(), 2u);
  EXPECT_EQ(page->records[0].method, "SubmitJob");  // newest first
  EXPECT_GT(page->records[0].time_unix_ms, 0);      // 0 became "now"
  const AuditRecord& first = page->records[1];
  EXPECT_EQ(first.user, "bob");
  EXPECT_EQ(first.role, "user");
  EXPECT_EQ(first.peer, "ipv4:127.0.0.1:1234");
  EXPECT_EQ(first.target, "job-000001");
  EXPECT_EQ(first.job_id, "job-000001");
  EXPECT_EQ(first.code, absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(first.message, "job job-000001 belongs to another user");
  EXPECT_EQ(first.time_unix_ms, 1700000000123);
  EXPECT_LT(first.seq, page->records[0].seq);

  std::vector<json> lines = ReadLines(dir_ + "/audit.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["time"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(lines[0]["user"], "bob");
  EXPECT_EQ(lines[0]["method"], "CancelJob");
  EXPECT_EQ(lines[0]["code"], "PERMISSION_DENIED");
  EXPECT_EQ(lines[0]["seq"], first.seq);
  EXPECT_EQ(lines[1]["code"], "OK");

  // Only the daemon's user may read the file.
  struct stat info {};
  ASSERT_EQ(::stat((dir_ + "/audit.jsonl").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600);
}

TEST_F(AuditLogTest, ReopeningAppendsAndKeepsTheTable) {
  log_->Record(Record("alice", "SubmitJob", "job-000001"));
  log_.reset();
  store_.reset();
  auto store = JobStore::Open(dir_ + "/megatrain.db");
  ASSERT_THAT(store, IsOk());
  auto log = AuditLog::Open(store->get(), dir_ + "/audit.jsonl");
  ASSERT_THAT(log, IsOk());
  (*log)->Record(Record("alice", "CancelJob", "job-000001"));
  absl::StatusOr<AuditPage> page = (*log)->List(kAdmin, {});
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->records.size(), 2u);
  EXPECT_EQ(ReadLines(dir_ + "/audit.jsonl").size(), 2u);
}

TEST_F(AuditLogTest, UsersMayNotReadIt) {
  EXPECT_THAT(log_->List(kAlice, {}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("the audit log is for admins; user 'alice'")));
}

TEST_F(AuditLogTest, FiltersByUserJobAndMethod) {
  log_->Record(Record("alice", "SubmitJob", "job-000001"));
  log_->Record(Record("alice", "CreateCheckpoint", "job-000001/step-4"));
  log_->Record(Record("bob", "CancelJob", "job-000001", absl::StatusCode::kPermissionDenied));
  log_->Record(Record("bob", "SubmitJob", "job-000002"));
  log_->Record(Record("alice", "SubmitJob", "job-000010"));

  auto count = [&](AuditQuery query) {
    absl::StatusOr<AuditPage> page = log_->List(kAdmin, query);
    EXPECT_THAT(page, IsOk());
    return page.ok() ? page->records.size() : 0;
  };
  EXPECT_EQ(count(Query("alice")), 3u);
  // A job's records include its checkpoints'; job-000010 does not match
  // job-000001.
  EXPECT_EQ(count(Query("", "job-000001")), 3u);
  EXPECT_EQ(count(Query("", "", "SubmitJob")), 3u);
  EXPECT_EQ(count(Query("bob", "job-000001")), 1u);
  EXPECT_EQ(count(Query("carol")), 0u);
}

TEST_F(AuditLogTest, PagesFollowTheTokenAndCheckTheFilters) {
  for (int record_idx = 0; record_idx < 5; ++record_idx) {
    log_->Record(Record("alice", "SubmitJob", absl::StrCat("job-00000", record_idx + 1)));
  }
  AuditQuery query;
  query.page_size = 2;
  std::vector<std::string> targets;
  while (true) {
    absl::StatusOr<AuditPage> page = log_->List(kAdmin, query);
    ASSERT_THAT(page, IsOk());
    for (const AuditRecord& record : page->records) targets.push_back(record.target);
    if (page->next_page_token.empty()) break;
    query.page_token = page->next_page_token;
  }
  EXPECT_THAT(targets, ::testing::ElementsAre("job-000005", "job-000004", "job-000003",
                                              "job-000002", "job-000001"));

  absl::StatusOr<AuditPage> first = log_->List(kAdmin, Query("", "", "", 2));
  ASSERT_THAT(first, IsOk());
  AuditQuery other_filters = Query("bob", "", "", 2, first->next_page_token);
  EXPECT_THAT(log_->List(kAdmin, other_filters),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("different filters")));
  EXPECT_THAT(log_->List(kAdmin, Query("", "", "", 0, "garbage")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_token: malformed")));
  EXPECT_THAT(log_->List(kAdmin, Query("", "", "", 1001)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
}

TEST_F(AuditLogTest, LongTextsAreCut) {
  AuditRecord record = Record("alice", "SubmitJob", "");
  record.message = std::string(5000, 'm');
  record.detail = "name=" + std::string(5000, 'd');
  log_->Record(record);
  absl::StatusOr<AuditPage> page = log_->List(kAdmin, {});
  ASSERT_THAT(page, IsOk());
  ASSERT_EQ(page->records.size(), 1u);
  EXPECT_EQ(page->records[0].message.size(), kMaxAuditTextBytes);
  EXPECT_THAT(page->records[0].message, ::testing::EndsWith("..."));
  EXPECT_EQ(page->records[0].detail.size(), kMaxAuditTextBytes);
}

TEST_F(AuditLogTest, WithoutAFileOnlyTheTableIsWritten) {
  auto log = AuditLog::Open(store_.get(), "");
  ASSERT_THAT(log, IsOk());
  (*log)->Record(Record("alice", "SubmitJob", "job-000001"));
  EXPECT_EQ((*log)->jsonl_path(), "");
  absl::StatusOr<AuditPage> page = (*log)->List(kAdmin, {});
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->records.size(), 1u);
}

TEST_F(AuditLogTest, UnwritableFileIsFailedPrecondition) {
  EXPECT_THAT(AuditLog::Open(store_.get(), dir_ + "/no/such/dir/audit.jsonl"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("audit log: cannot open")));
}

TEST(FormatUtcTimeTest, IsIso8601WithMilliseconds) {
  EXPECT_EQ(FormatUtcTime(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(FormatUtcTime(1700000000123), "2023-11-14T22:13:20.123Z");
}

}  // namespace
}  // namespace megatrain::server
