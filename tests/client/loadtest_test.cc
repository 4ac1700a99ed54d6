// Tests of client/loadtest.h: the quantile and /proc helpers, and a short
// run of the benchmark against the in-process daemon with the fake engine
// (a job that steps every 5 ms), which must finish with no errors and every
// watch stream freed.
#include "client/loadtest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>

#include "tests/server/daemon_harness.h"

namespace megatrain::client {
namespace {

using ::megatrain::server::testing::DaemonHarness;
using ::megatrain::server::testing::kAliceToken;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(QuantileTest, NearestRank) {
  const std::vector<double> values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(Quantile(values, 0.5), 5);
  EXPECT_EQ(Quantile(values, 0.99), 10);
  EXPECT_EQ(Quantile(values, 0.0), 1);
  EXPECT_EQ(Quantile({}, 0.5), 0);
}

TEST(SampleProcessTest, ReadsThisProcess) {
  absl::StatusOr<ProcessSample> sample = SampleProcess(::getpid());
  ASSERT_THAT(sample, IsOk());
  EXPECT_GT(sample->rss_bytes, 0);
  EXPECT_GE(sample->peak_rss_bytes, sample->rss_bytes);
  EXPECT_GE(sample->threads, 1);
  EXPECT_THAT(SampleProcess(-1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("-1")));
}

class LoadTestRunTest : public DaemonHarness {};

TEST_F(LoadTestRunTest, ShortRunHasNoErrorsAndFreesEveryStream) {
  StartDaemon(/*gated=*/false);
  backend_->step_duration = absl::Milliseconds(5);
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("loaded", 1000000));
  ASSERT_NE(backend_->WaitForCreated(1, absl::Seconds(30)), nullptr);

  LoadTestOptions options;
  options.connection.server = address_;
  options.connection.token = kAliceToken;
  options.clients = 6;
  options.watch_fraction = 0.5;
  options.duration = absl::Seconds(2);
  options.baseline = absl::Milliseconds(500);
  options.watch_hold = absl::Milliseconds(500);
  options.daemon_pid = ::getpid();  // the daemon runs in this process
  std::ostringstream log;
  absl::StatusOr<LoadTestReport> report = RunLoadTest(options, log);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(report->job_id, job_id);  // found as the RUNNING job
  EXPECT_EQ(report->watchers, 3);
  for (const char* method : {"GetJob", "ListJobs", "WatchJob"}) {
    ASSERT_TRUE(report->methods.count(method)) << method;
    EXPECT_GT(report->methods.at(method).calls, 0) << method;
    EXPECT_EQ(report->methods.at(method).errors, 0)
        << method << ": " << report->methods.at(method).first_error;
  }
  EXPECT_GT(report->watch_events, 0);
  EXPECT_GT(report->tokens_per_s_before, 0);
  EXPECT_EQ(report->watch_streams_after, 0);
  EXPECT_TRUE(report->measured_process);
  EXPECT_GT(report->process_after.rss_bytes, 0);
  EXPECT_THAT(FormatLoadTestReport(*report), HasSubstr("WatchJob"));
  EXPECT_EQ(LoadTestReportToJson(*report)["clients"], 6);
}

TEST_F(LoadTestRunTest, WithoutARunningJobIsNotFound) {
  StartDaemon();
  LoadTestOptions options;
  options.connection.server = address_;
  options.connection.token = kAliceToken;
  std::ostringstream log;
  EXPECT_THAT(RunLoadTest(options, log),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no RUNNING job")));
}

}  // namespace
}  // namespace megatrain::client
