// JobManagerFixture: a JobManager over a fresh state directory, a real
// JobStore and the fake engine (tests/server/fake_engine_backend.h), with
// the helpers the job manager's tests share: submit, follow a job's events
// to a state, record a checkpoint as the daemon does. Used by
// job_manager_test.cc and checkpoint_ownership_test.cc.
//
// Every wait is bounded by kTimeout: a failure is a hang caught early, not
// flakiness.
#ifndef MEGATRAIN_TESTS_SERVER_CORE_JOB_MANAGER_FIXTURE_H_
#define MEGATRAIN_TESTS_SERVER_CORE_JOB_MANAGER_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/job_manager.h"
#include "server/core/job_store.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server::testing {

// Bound of every wait: far above what any step here takes.
inline constexpr absl::Duration kTimeout = absl::Seconds(30);

inline const Principal kAlice{"alice", Role::kUser};
inline const Principal kBob{"bob", Role::kUser};
inline const Principal kAdmin{"root", Role::kAdmin};

class JobManagerFixture : public ::testing::Test {
 protected:
  // A state directory with an open store on one "cpu" device of 64 MiB;
  // the manager starts in StartManager, after a test has set options_.
  void SetUp() override {
    state_dir_ = MakeTempDir();
    db_path_ = (std::filesystem::path(state_dir_) / "megatrain.db").string();
    options_.jobs_dir = (std::filesystem::path(state_dir_) / "jobs").string();
    options_.devices = {"cpu"};
    options_.host_memory_budget_bytes = 64 << 20;
    OpenStore();
  }

  // Drains the manager: gated jobs are released so that the drain ends.
  void TearDown() override {
    if (manager_ != nullptr) manager_->Drain(kTimeout);
  }

  void OpenStore() {
    auto store = JobStore::Open(db_path_);
    ASSERT_THAT(store, ::megatrain::testing::IsOk());
    store_ = *std::move(store);
  }

  void StartManager() {
    auto manager = JobManager::Create(options_, store_.get(), &backend_, &metrics_);
    ASSERT_THAT(manager, ::megatrain::testing::IsOk());
    manager_ = *std::move(manager);
  }

  // Submits `request` as `who`; fails the test (and returns an empty
  // record) when refused.
  JobRecord Submit(const Principal& who, JobRequest request, const std::string& request_id = "") {
    absl::StatusOr<JobRecord> job = manager_->Submit(who, std::move(request), request_id);
    EXPECT_THAT(job, ::megatrain::testing::IsOk());
    return job.ok() ? *job : JobRecord();
  }

  // Follows `job_id`'s events until `done` holds for one or the watch ends.
  // Returns the events seen. Fails the test on timeout.
  std::vector<JobEvent> WaitFor(const std::string& job_id,
                                const std::function<bool(const JobEvent&)>& done) {
    std::vector<JobEvent> seen;
    int64_t after_seq = 0;
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<EventBatch> batch =
          manager_->WaitEvents(kAdmin, job_id, after_seq, deadline - absl::Now());
      if (!batch.ok()) {
        ADD_FAILURE() << batch.status();
        return seen;
      }
      for (const JobEvent& event : batch->events) {
        seen.push_back(event);
        after_seq = event.seq;
        if (done(event)) return seen;
      }
      if (batch->finished) return seen;
    }
    ADD_FAILURE() << "timed out waiting on " << job_id;
    return seen;
  }

  static std::function<bool(const JobEvent&)> StateIs(JobState state) {
    return [state](const JobEvent& event) {
      return event.kind == JobEvent::Kind::kStateChange && event.state == state;
    };
  }

  // A checkpoint of `job` at `step` as the daemon records one it saw written
  // (Note [Checkpoint ownership]): a fake checkpoint directory under the
  // job's output directory plus its record.
  CheckpointRecord RecordFakeCheckpoint(const JobRecord& job, int64_t step) {
    const engine::CheckpointInfo info = WriteFakeCheckpoint(
        absl::StrCat(job.request.spec.output_dir, "/step-", step), step, job.id);
    CheckpointRecord record;
    record.job_id = job.id;
    record.step = step;
    record.dir = info.dir;
    record.owner = job.owner;
    record.manifest_xxh64 = info.manifest_xxh64;
    EXPECT_THAT(store_->RecordCheckpoint(record), ::megatrain::testing::IsOk());
    return record;
  }

  // The job's state as an admin sees it (kFailed, and a test failure, when
  // it cannot be read).
  JobState StateOf(const std::string& job_id) {
    absl::StatusOr<JobRecord> job = manager_->Get(kAdmin, job_id);
    EXPECT_THAT(job, ::megatrain::testing::IsOk());
    return job.ok() ? job->state : JobState::kFailed;
  }

  std::string state_dir_;
  std::string db_path_;  // <state_dir_>/megatrain.db
  JobManagerOptions options_;
  FakeEngineBackend backend_;
  ServerMetrics metrics_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace megatrain::server::testing

#endif  // MEGATRAIN_TESTS_SERVER_CORE_JOB_MANAGER_FIXTURE_H_
