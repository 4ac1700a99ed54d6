// Tests of server/job_store.h: round trips, persistence across reopen,
// idempotency keys, pagination, events and checkpoints.
#include "server/job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
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
  MEGATRAIN_ASSERT_OK(
      store_->UpdateState(running, JobEvent::StateChange(running.id, JobState::kRunning, "started")));
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

}  // namespace
}  // namespace megatrain::server
