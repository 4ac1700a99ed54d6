// Tests of server/core/job_store.h: round trips, persistence across reopen,
// idempotency keys, pagination, events and checkpoints.
#include "server/core/job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "server/core/job_request_json.h"

#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tmpfs.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

JobRecord MakeJob(int64_t seq, const std::string& owner, int32_t priority = 0,
                  JobState state = JobState::kQueued) {
  JobRecord job;
  job.seq = seq;
  job.id = JobIdForSeq(seq);
  job.owner = owner;
  job.request.spec.name = absl::StrCat("job", seq);
  job.request.spec.model.preset = "tiny";
  job.request.spec.data.tokens = "/data/tiny";
  job.request.spec.train.max_steps = 60;
  job.request.spec.train.compute_dtype = engine::ComputeDtype::kBf16;
  job.request.spec.optimizer.lr = 3e-3;
  job.request.spec.output_dir = "/out/" + job.id;
  job.request.priority = priority;
  job.request.labels = {{"team", "nlp"}};
  job.state = state;
  job.create_time_unix_ms = 1000 + seq;
  job.host_memory_bytes = 4096;
  job.message = "submitted";
  return job;
}

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::path(MakeTempDir()) / "megatrain.db").string();
    auto store = JobStore::Open(path_);
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
  }

  void Insert(const JobRecord& job) {
    MEGATRAIN_ASSERT_OK(
        store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "submitted")));
  }

  std::string path_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(JobStoreTest, InsertThenGetRoundTripsEveryField) {
  JobRecord job = MakeJob(1, "alice", 7);
  job.request_id = "req-1";
  job.resume_from = "/out/job-000001/step-20";
  Insert(job);
  absl::StatusOr<JobRecord> loaded = store_->GetJob("job-000001");
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->id, "job-000001");
  EXPECT_EQ(loaded->seq, 1);
  EXPECT_EQ(loaded->owner, "alice");
  EXPECT_EQ(loaded->request_id, "req-1");
  EXPECT_EQ(loaded->request.priority, 7);
  EXPECT_EQ(loaded->request.spec.name, "job1");
  EXPECT_EQ(loaded->request.spec.model.preset, "tiny");
  EXPECT_EQ(loaded->request.spec.train.compute_dtype, engine::ComputeDtype::kBf16);
  EXPECT_DOUBLE_EQ(loaded->request.spec.optimizer.lr, 3e-3);
  EXPECT_EQ(loaded->request.labels.at("team"), "nlp");
  EXPECT_EQ(loaded->state, JobState::kQueued);
  EXPECT_EQ(loaded->host_memory_bytes, 4096);
  EXPECT_EQ(loaded->resume_from, "/out/job-000001/step-20");
  EXPECT_EQ(loaded->create_time_unix_ms, 1001);
}

TEST_F(JobStoreTest, UnknownJobIsNotFound) {
  EXPECT_THAT(store_->GetJob("job-000404"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-000404")));
}

TEST_F(JobStoreTest, JobsSurviveReopen) {
  Insert(MakeJob(1, "alice"));
  JobRecord running = MakeJob(2, "bob");
  Insert(running);
  running.state = JobState::kRunning;
  running.device = "cpu";
  MEGATRAIN_ASSERT_OK(store_->UpdateState(
      running, JobEvent::StateChange(running.id, JobState::kRunning, "started")));
  store_.reset();  // close, as a killed process would leave it (WAL)

  auto reopened = JobStore::Open(path_);
  ASSERT_THAT(reopened, IsOk());
  absl::StatusOr<JobRecord> job = (*reopened)->GetJob("job-000002");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state, JobState::kRunning);
  EXPECT_EQ(job->device, "cpu");
  absl::StatusOr<int64_t> next_seq = (*reopened)->NextJobSeq();
  ASSERT_THAT(next_seq, IsOk());
  EXPECT_EQ(*next_seq, 3);
}

TEST_F(JobStoreTest, DatabaseIsInWalMode) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_F(JobStoreTest, RequestIdIsUniquePerOwner) {
  JobRecord first = MakeJob(1, "alice");
  first.request_id = "same";
  Insert(first);
  JobRecord again = MakeJob(2, "alice");
  again.request_id = "same";
  EXPECT_THAT(store_->InsertJob(again, JobEvent::StateChange(again.id, JobState::kQueued, "")),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("job-000002")));
  JobRecord other_owner = MakeJob(3, "bob");
  other_owner.request_id = "same";
  Insert(other_owner);

  auto found = store_->FindByRequestId("alice", "same");
  ASSERT_THAT(found, IsOk());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->id, "job-000001");
  auto missing = store_->FindByRequestId("carol", "same");
  ASSERT_THAT(missing, IsOk());
  EXPECT_FALSE(missing->has_value());
}

std::vector<std::string> Ids(const JobPage& page) {
  std::vector<std::string> ids;
  for (const JobRecord& job : page.jobs) ids.push_back(job.id);
  return ids;
}

TEST_F(JobStoreTest, ListJobsPaginatesNewestFirst) {
  for (int seq = 1; seq <= 5; ++seq) Insert(MakeJob(seq, "alice"));
  JobQuery query;
  query.page_size = 2;
  auto page1 = store_->ListJobs(query);
  ASSERT_THAT(page1, IsOk());
  EXPECT_THAT(Ids(*page1), ElementsAre("job-000005", "job-000004"));
  ASSERT_FALSE(page1->next_page_token.empty());

  query.page_token = page1->next_page_token;
  auto page2 = store_->ListJobs(query);
  ASSERT_THAT(page2, IsOk());
  EXPECT_THAT(Ids(*page2), ElementsAre("job-000003", "job-000002"));

  query.page_token = page2->next_page_token;
  auto page3 = store_->ListJobs(query);
  ASSERT_THAT(page3, IsOk());
  EXPECT_THAT(Ids(*page3), ElementsAre("job-000001"));
  EXPECT_TRUE(page3->next_page_token.empty());
}

TEST_F(JobStoreTest, ListJobsExactMultipleHasNoEmptyLastPage) {
  for (int seq = 1; seq <= 4; ++seq) Insert(MakeJob(seq, "alice"));
  JobQuery query;
  query.page_size = 2;
  auto page1 = store_->ListJobs(query);
  ASSERT_THAT(page1, IsOk());
  query.page_token = page1->next_page_token;
  auto page2 = store_->ListJobs(query);
  ASSERT_THAT(page2, IsOk());
  EXPECT_THAT(Ids(*page2), ElementsAre("job-000002", "job-000001"));
  EXPECT_TRUE(page2->next_page_token.empty());
}

TEST_F(JobStoreTest, ListJobsFiltersByOwnerAndState) {
  Insert(MakeJob(1, "alice", 0, JobState::kQueued));
  Insert(MakeJob(2, "bob", 0, JobState::kQueued));
  Insert(MakeJob(3, "alice", 0, JobState::kSucceeded));
  Insert(MakeJob(4, "alice", 0, JobState::kFailed));
  JobQuery query;
  query.owner = "alice";
  query.states = {JobState::kQueued, JobState::kSucceeded};
  auto page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(*page), ElementsAre("job-000003", "job-000001"));
}

TEST_F(JobStoreTest, ListJobsRejectsBadPageSizeAndTokens) {
  Insert(MakeJob(1, "alice"));
  Insert(MakeJob(2, "alice"));
  JobQuery query;
  query.page_size = -1;
  EXPECT_THAT(store_->ListJobs(query),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
  query.page_size = kMaxPageSize + 1;
  EXPECT_THAT(store_->ListJobs(query),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
  query.page_size = 0;
  query.page_token = "garbage!";
  EXPECT_THAT(store_->ListJobs(query),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_token: malformed")));

  // A token is bound to its filters.
  query.page_token.clear();
  query.page_size = 1;
  auto page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  query.page_token = page->next_page_token;
  query.owner = "alice";
  EXPECT_THAT(store_->ListJobs(query),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("different filters")));
}

TEST_F(JobStoreTest, JobsInStateOrdersByPriorityThenSubmission) {
  Insert(MakeJob(1, "a", 0));
  Insert(MakeJob(2, "a", 5));
  Insert(MakeJob(3, "a", 5));
  Insert(MakeJob(4, "a", -1));
  Insert(MakeJob(5, "a", 9, JobState::kRunning));
  auto queued = store_->JobsInState(JobState::kQueued);
  ASSERT_THAT(queued, IsOk());
  std::vector<std::string> ids;
  for (const JobRecord& job : *queued) ids.push_back(job.id);
  EXPECT_THAT(ids, ElementsAre("job-000002", "job-000003", "job-000001", "job-000004"));
}

TEST_F(JobStoreTest, EventsAreOrderedAndFilteredBySeq) {
  Insert(MakeJob(1, "alice"));
  Insert(MakeJob(2, "alice"));
  JobProgress progress;
  progress.step = 1;
  progress.loss = 4.5;
  JobEvent step;
  step.job_id = "job-000001";
  step.kind = JobEvent::Kind::kStep;
  step.step = 1;
  step.loss = 4.5;
  step.tokens_per_s = 1000;
  step.aux_loss = 1.25;  // MoE load-balancing loss: stored with the step event
  MEGATRAIN_ASSERT_OK(store_->UpdateProgress("job-000001", progress, step));
  JobEvent checkpoint;
  checkpoint.job_id = "job-000001";
  checkpoint.kind = JobEvent::Kind::kCheckpoint;
  checkpoint.step = 1;
  checkpoint.checkpoint_dir = "/out/step-1";
  checkpoint.checkpoint_seconds = 0.5;
  MEGATRAIN_ASSERT_OK(store_->AppendEvent(checkpoint));

  auto events = store_->ListEvents("job-000001", 0, 100);
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].kind, JobEvent::Kind::kStateChange);
  EXPECT_EQ((*events)[1].kind, JobEvent::Kind::kStep);
  EXPECT_DOUBLE_EQ((*events)[1].loss, 4.5);
  EXPECT_DOUBLE_EQ((*events)[1].aux_loss, 1.25);
  EXPECT_EQ((*events)[2].kind, JobEvent::Kind::kCheckpoint);
  EXPECT_EQ((*events)[2].checkpoint_dir, "/out/step-1");
  EXPECT_LT((*events)[0].seq, (*events)[1].seq);

  auto after = store_->ListEvents("job-000001", (*events)[1].seq, 100);
  ASSERT_THAT(after, IsOk());
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].kind, JobEvent::Kind::kCheckpoint);
  absl::StatusOr<int64_t> last_seq = store_->LastEventSeq("job-000001");
  ASSERT_THAT(last_seq, IsOk());
  EXPECT_EQ(*last_seq, (*events)[2].seq);

  auto job = store_->GetJob("job-000001");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->progress.step, 1);
  EXPECT_DOUBLE_EQ(job->progress.loss, 4.5);
}

// A data-parallel job's step events keep their devices and per-device
// tokens/s; a step event stored before the fields existed (issue 21) reads
// as one device at the job's tokens/s.
TEST_F(JobStoreTest, StepEventsKeepTheirDevicesAndOldOnesReadAsOneDevice) {
  Insert(MakeJob(1, "alice"));
  JobProgress progress;
  progress.step = 1;
  JobEvent step;
  step.job_id = "job-000001";
  step.kind = JobEvent::Kind::kStep;
  step.step = 1;
  step.tokens_per_s = 5000;
  step.devices = 2;
  step.device_tokens_per_s = 2500;
  MEGATRAIN_ASSERT_OK(store_->UpdateProgress("job-000001", progress, step));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db,
                         "INSERT INTO events (job_id, time_unix_ms, kind, payload) VALUES "
                         "('job-000001', 1, 2, '{\"step\": 2, \"tokens_per_s\": 1000}')",
                         nullptr, nullptr, &error),
            SQLITE_OK)
      << (error != nullptr ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);

  auto events = store_->ListEvents("job-000001", 0, 100);
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[1].devices, 2);
  EXPECT_DOUBLE_EQ((*events)[1].tokens_per_s, 5000);
  EXPECT_DOUBLE_EQ((*events)[1].device_tokens_per_s, 2500);
  EXPECT_EQ((*events)[2].kind, JobEvent::Kind::kStep);
  EXPECT_EQ((*events)[2].step, 2);
  EXPECT_EQ((*events)[2].devices, 1);
  EXPECT_DOUBLE_EQ((*events)[2].device_tokens_per_s, 1000);
}

TEST_F(JobStoreTest, UpdateStateOfUnknownJobIsNotFound) {
  JobRecord ghost = MakeJob(9, "alice");
  EXPECT_THAT(store_->UpdateState(ghost, JobEvent::StateChange(ghost.id, JobState::kRunning, "")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-000009")));
}

TEST_F(JobStoreTest, CountsByStateAndOwner) {
  Insert(MakeJob(1, "alice", 0, JobState::kQueued));
  Insert(MakeJob(2, "alice", 0, JobState::kQueued));
  Insert(MakeJob(3, "bob", 0, JobState::kSucceeded));
  auto counts = store_->CountByState();
  ASSERT_THAT(counts, IsOk());
  EXPECT_EQ(counts->at(JobState::kQueued), 2);
  EXPECT_EQ(counts->at(JobState::kSucceeded), 1);
  EXPECT_EQ(counts->at(JobState::kFailed), 0);
  absl::StatusOr<int64_t> alice_queued = store_->CountJobs("alice", JobState::kQueued);
  ASSERT_THAT(alice_queued, IsOk());
  EXPECT_EQ(*alice_queued, 2);
}

TEST_F(JobStoreTest, CheckpointsRecordListDelete) {
  Insert(MakeJob(1, "alice"));
  MEGATRAIN_ASSERT_OK(store_->RecordCheckpoint({"job-000001", 20, "/out/step-20", 0, 5000, 1.5}));
  MEGATRAIN_ASSERT_OK(store_->RecordCheckpoint({"job-000001", 10, "/out/step-10", 0, 4000, 1.0}));
  auto listed = store_->ListCheckpoints("job-000001");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 10);
  EXPECT_EQ((*listed)[1].dir, "/out/step-20");
  EXPECT_DOUBLE_EQ((*listed)[1].write_seconds, 1.5);
  MEGATRAIN_ASSERT_OK(store_->DeleteCheckpoint("job-000001", 10));
  listed = store_->ListCheckpoints("job-000001");
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->size(), 1u);
}

// --- Issue 14: ownership records, schema migration, file identity -----------

namespace ownership {

void ExecSql(sqlite3* db, const std::string& sql) {
  char* error = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error != nullptr ? error : "") << " in " << sql;
}

// The version-2 tables this migration starts from (as the daemon of
// 2026-11-23 created them), with one job and one checkpoint record.
void WriteVersion2Database(const std::string& path, const JobRecord& job) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ExecSql(db, R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, request_id TEXT,
  spec_json TEXT NOT NULL, priority INTEGER NOT NULL, state INTEGER NOT NULL,
  create_time_unix_ms INTEGER NOT NULL, start_time_unix_ms INTEGER NOT NULL DEFAULT 0,
  end_time_unix_ms INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL DEFAULT 0,
  max_steps INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0, eval_loss REAL,
  tokens_per_s REAL NOT NULL DEFAULT 0, mfu REAL NOT NULL DEFAULT 0,
  tokens INTEGER NOT NULL DEFAULT 0, eta_seconds REAL NOT NULL DEFAULT 0,
  device TEXT NOT NULL DEFAULT '', host_memory_bytes INTEGER NOT NULL DEFAULT 0,
  error_code INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
  resume_from TEXT NOT NULL DEFAULT '', UNIQUE (owner, request_id));
CREATE TABLE checkpoints (
  job_id TEXT NOT NULL, step INTEGER NOT NULL, dir TEXT NOT NULL,
  bytes INTEGER NOT NULL DEFAULT 0, create_time_unix_ms INTEGER NOT NULL DEFAULT 0,
  write_seconds REAL NOT NULL DEFAULT 0, PRIMARY KEY (job_id, step));
PRAGMA user_version = 2;
)sql");
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "INSERT INTO jobs (seq, id, owner, spec_json, priority, state, "
                               "create_time_unix_ms) VALUES (?, ?, ?, ?, 0, ?, 1)",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  const std::string spec_json = JobRequestToJson(job.request);
  sqlite3_bind_int64(stmt, 1, job.seq);
  sqlite3_bind_text(stmt, 2, job.id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt, 3, job.owner.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt, 4, spec_json.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 5, static_cast<int64_t>(JobState::kSuspended));
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_DONE);
  sqlite3_finalize(stmt);
  ExecSql(db, absl::StrCat("INSERT INTO checkpoints (job_id, step, dir) VALUES ('", job.id,
                           "', 20, '/out/", job.id, "/checkpoints/step-00000020')"));
  sqlite3_close(db);
}

}  // namespace ownership

TEST_F(JobStoreTest, OpenMigratesAVersion2DatabaseKeepingJobsAndCheckpoints) {
  const std::string path = (std::filesystem::path(MakeTempDir()) / "old.db").string();
  const JobRecord job = MakeJob(7, "carol");
  ownership::WriteVersion2Database(path, job);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_THAT(store, IsOk());
  absl::StatusOr<JobRecord> loaded = (*store)->GetJob(job.id);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->owner, "carol");
  absl::StatusOr<std::vector<CheckpointRecord>> checkpoints = (*store)->ListCheckpoints(job.id);
  ASSERT_THAT(checkpoints, IsOk());
  ASSERT_EQ(checkpoints->size(), 1u);
  EXPECT_EQ((*checkpoints)[0].owner, "carol");      // filled from jobs.owner
  EXPECT_EQ((*checkpoints)[0].manifest_xxh64, 0u);  // legacy: unknown
  // jobs.output_dir was filled from the spec: the overlap check sees it.
  absl::StatusOr<std::optional<JobRecord>> overlap =
      (*store)->FindOutputDirOverlap("/out/job-000007/sub");
  ASSERT_THAT(overlap, IsOk());
  ASSERT_TRUE(overlap->has_value());
  EXPECT_EQ((*overlap)->id, job.id);
  // New ids continue after the old ones.
  absl::StatusOr<int64_t> next_seq = (*store)->NextJobSeq();
  ASSERT_THAT(next_seq, IsOk());
  EXPECT_EQ(*next_seq, 8);
  store->reset();
  // Opening again is a no-op (the migration is idempotent).
  EXPECT_THAT(JobStore::Open(path), IsOk());
}

TEST_F(JobStoreTest, CheckpointRecordKeepsOwnerAndManifestHash) {
  Insert(MakeJob(1, "alice"));
  CheckpointRecord record;
  record.job_id = "job-000001";
  record.step = 4;
  record.dir = "/out/job-000001/checkpoints/step-00000004";
  record.owner = "alice";
  record.manifest_xxh64 = 0xfedcba9876543210ull;
  MEGATRAIN_ASSERT_OK(store_->RecordCheckpoint(record));
  absl::StatusOr<std::vector<CheckpointRecord>> listed = store_->ListCheckpoints("job-000001");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].owner, "alice");
  EXPECT_EQ((*listed)[0].manifest_xxh64, 0xfedcba9876543210ull);
}

TEST_F(JobStoreTest, FindOutputDirOverlapComparesWholePathComponents) {
  Insert(MakeJob(1, "alice"));  // output_dir /out/job-000001
  for (const std::string& dir : {"/out/job-000001", "/out/job-000001/", "/out/./job-000001",
                                 "/out/job-000001/a/b", "/out", "/"}) {
    absl::StatusOr<std::optional<JobRecord>> found = store_->FindOutputDirOverlap(dir);
    ASSERT_THAT(found, IsOk());
    EXPECT_TRUE(found->has_value()) << dir;
  }
  for (const std::string& dir : {"/out/job-0000011", "/out/job-00000", "/other", ""}) {
    absl::StatusOr<std::optional<JobRecord>> found = store_->FindOutputDirOverlap(dir);
    ASSERT_THAT(found, IsOk());
    EXPECT_FALSE(found->has_value()) << dir;
  }
}

// Issue 36: a terminal job claims its directory only while checkpoints of
// it are recorded; a cancelled job that wrote none frees its path.
TEST_F(JobStoreTest, FindOutputDirOverlapSkipsTerminalJobsWithoutCheckpoints) {
  Insert(MakeJob(1, "alice", 0, JobState::kCancelled));  // /out/job-000001, no checkpoints
  Insert(MakeJob(2, "bob", 0, JobState::kSucceeded));    // /out/job-000002, one checkpoint
  CheckpointRecord record;
  record.job_id = "job-000002";
  record.step = 4;
  record.dir = "/out/job-000002/checkpoints/step-00000004";
  record.owner = "bob";
  MEGATRAIN_ASSERT_OK(store_->RecordCheckpoint(record));
  absl::StatusOr<std::optional<JobRecord>> freed = store_->FindOutputDirOverlap("/out/job-000001");
  ASSERT_THAT(freed, IsOk());
  EXPECT_FALSE(freed->has_value());
  absl::StatusOr<std::optional<JobRecord>> claimed = store_->FindOutputDirOverlap("/out");
  ASSERT_THAT(claimed, IsOk());
  ASSERT_TRUE(claimed->has_value());
  EXPECT_EQ((*claimed)->id, "job-000002");
}

TEST_F(JobStoreTest, WritesFailClearlyAfterTheFileWasReplaced) {
  Insert(MakeJob(1, "alice"));
  // Another database moved into place under the same name (a restore while
  // running, a mistaken copy): a new inode.
  const std::string other = path_ + ".other";
  ASSERT_THAT(JobStore::Open(other), IsOk());
  std::filesystem::rename(other, path_);
  EXPECT_THAT(store_->InsertJob(MakeJob(2, "bob"),
                                JobEvent::StateChange("job-000002", JobState::kQueued, "")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path_), HasSubstr("was replaced while megatraind runs"),
                             HasSubstr("refusing to write"))));
  EXPECT_THAT(store_->AppendEvent(JobEvent::StateChange("job-000001", JobState::kQueued, "x")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replaced")));
  // Reads go on.
  EXPECT_THAT(store_->GetJob("job-000001"), IsOk());
}

TEST_F(JobStoreTest, WritesFailClearlyAfterTheFileWasDeleted) {
  std::filesystem::remove(path_);
  CheckpointRecord record;
  record.job_id = "job-000001";
  record.step = 1;
  record.dir = "/out/x";
  EXPECT_THAT(store_->RecordCheckpoint(record),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("was deleted while megatraind runs"),
                             HasSubstr("restore the file from a backup"))));
}

}  // namespace
}  // namespace megatrain::server

namespace megatrain::server {
namespace {

// Issue 14: a database on a full disk is RESOURCE_EXHAUSTED (the operator's
// to fix), never INTERNAL. A real ENOSPC from a 512 KiB tmpfs: SQLite maps
// it to SQLITE_FULL.
TEST(JobStoreDiskFullTest, InsertOnAFullDiskIsResourceExhausted) {
  std::string why_not;
  std::unique_ptr<megatrain::testing::ScopedTmpfs> disk =
      megatrain::testing::ScopedTmpfs::Mount(512 << 10, &why_not);
  if (disk == nullptr) GTEST_SKIP() << why_not;
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open((std::filesystem::path(disk->path()) / "megatrain.db").string());
  ASSERT_THAT(store, IsOk());
  absl::Status status;
  // Each job carries ~8 KiB of labels: the disk fills within 64 inserts.
  for (int64_t seq = 1; seq <= 64 && status.ok(); ++seq) {
    JobRecord job = MakeJob(seq, "alice");
    for (int l = 0; l < 32; ++l) job.request.labels[absl::StrCat("k", l)] = std::string(250, 'v');
    status =
        (*store)->InsertJob(job, JobEvent::StateChange(job.id, job.state, "submitted")).status();
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("sqlite")));
}

}  // namespace
}  // namespace megatrain::server
