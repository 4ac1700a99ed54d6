// Tests of server/core/job_scalars.h: a job's step and eval events become
// rows of metrics/steps.csv and metrics/evals.csv and TFRecords of an event
// file; a resumed job appends; a symbolic link in the way is refused.
#include "server/core/job_scalars.h"

#include <gmock/gmock.h>
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "server/core/tfevents.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

JobEvent StepEvent(int64_t step, double loss) {
  JobEvent event;
  event.kind = JobEvent::Kind::kStep;
  event.step = step;
  event.time_unix_ms = 1700000000000 + step;
  event.loss = loss;
  event.grad_norm = 0.75;
  event.lr = 0.001;
  event.tokens_per_s = 4096;
  event.step_seconds = 0.25;
  return event;
}

// The data of every TFRecord in `bytes`, each checked against its framing.
std::vector<std::string> Records(const std::string& bytes) {
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset + 12 <= bytes.size()) {
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
      length = length << 8 | static_cast<unsigned char>(bytes[offset + i]);
    const std::string data = bytes.substr(offset + 12, length);
    EXPECT_EQ(TfRecord(data), bytes.substr(offset, 16 + length));
    records.push_back(data);
    offset += 16 + length;
  }
  EXPECT_EQ(offset, bytes.size());
  return records;
}

TEST(JobScalarWriterTest, WritesStepsAndEvalsAsCsvAndTensorBoardScalars) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  absl::StatusOr<std::unique_ptr<JobScalarWriter>> writer =
      JobScalarWriter::Open(output_dir, 1700000000123);
  ASSERT_THAT(writer, IsOk());
  JobEvent eval;
  eval.kind = JobEvent::Kind::kEval;
  eval.step = 2;
  eval.time_unix_ms = 1700000000500;
  eval.eval_loss = 2.5;

  (*writer)->AddStep(StepEvent(1, 3.25));
  (*writer)->AddStep(StepEvent(2, 3.0));
  (*writer)->AddEval(eval);
  writer->reset();

  EXPECT_EQ(ReadFile(output_dir + "/metrics/steps.csv"),
            "step,time_unix_ms,loss,grad_norm,lr,tokens_per_s,mfu,step_seconds,skipped\n"
            "1,1700000000001,3.25,0.75,0.001,4096,,0.25,0\n"
            "2,1700000000002,3,0.75,0.001,4096,,0.25,0\n");
  EXPECT_EQ(ReadFile(output_dir + "/metrics/evals.csv"),
            "step,time_unix_ms,eval_loss\n2,1700000000500,2.5\n");
  const std::string events =
      ReadFile(output_dir + "/metrics/events.out.tfevents.1700000000.megatraind.123");
  const std::vector<std::string> records = Records(events);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0], FileVersionEvent(1700000000.123));
  EXPECT_EQ(records[1], ScalarsEvent(1700000000.001, 1,
                                     {{"train/loss", 3.25f},
                                      {"train/grad_norm", 0.75f},
                                      {"train/learning_rate", 0.001f},
                                      {"train/tokens_per_s", 4096.0f}}));
  EXPECT_EQ(records[3], ScalarsEvent(1700000000.5, 2, {{"eval/loss", 2.5f}}));
}

TEST(JobScalarWriterTest, ResumedJobAppendsBelowOneHeaderAndStartsANewEventFile) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  {
    auto first = JobScalarWriter::Open(output_dir, 1700000000000);
    ASSERT_THAT(first, IsOk());
    (*first)->AddStep(StepEvent(1, 3.25));
  }

  auto resumed = JobScalarWriter::Open(output_dir, 1700000060000);
  ASSERT_THAT(resumed, IsOk());
  (*resumed)->AddStep(StepEvent(2, 3.0));
  resumed->reset();

  const std::string csv = ReadFile(output_dir + "/metrics/steps.csv");
  EXPECT_EQ(csv.find("step,time_unix_ms"), csv.rfind("step,time_unix_ms"));
  EXPECT_THAT(csv, HasSubstr("\n1,1700000000001,3.25,"));
  EXPECT_THAT(csv, HasSubstr("\n2,1700000000002,3,"));
  EXPECT_TRUE(fs::exists(output_dir + "/metrics/events.out.tfevents.1700000000.megatraind.000"));
  EXPECT_TRUE(fs::exists(output_dir + "/metrics/events.out.tfevents.1700000060.megatraind.000"));
}

TEST(JobScalarWriterTest, SkippedStepHasNoLossScalar) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  auto writer = JobScalarWriter::Open(output_dir, 1700000000000);
  ASSERT_THAT(writer, IsOk());
  JobEvent skipped = StepEvent(3, 0);
  skipped.skipped = true;

  (*writer)->AddStep(skipped);
  writer->reset();

  const std::string events =
      ReadFile(output_dir + "/metrics/events.out.tfevents.1700000000.megatraind.000");
  const std::vector<std::string> records = Records(events);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_THAT(records[1], ::testing::Not(HasSubstr("train/loss")));
  EXPECT_THAT(ReadFile(output_dir + "/metrics/steps.csv"), HasSubstr("\n3,1700000000003,0,"));
}

TEST(JobScalarWriterTest, SymbolicLinkAtAFileIsRefusedAndNotFollowed) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  const std::string victim = testing::MakeTempDir("job_scalars_test") + "/victim";
  std::ofstream(victim) << "keep";
  fs::create_directories(output_dir + "/metrics");
  fs::create_symlink(victim, output_dir + "/metrics/steps.csv");

  EXPECT_THAT(JobScalarWriter::Open(output_dir, 1700000000000),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("steps.csv")));
  EXPECT_EQ(ReadFile(victim), "keep");
}

TEST(JobScalarWriterTest, HardLinkedFileIsRefusedAndNotAppendedTo) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  const std::string victim = testing::MakeTempDir("job_scalars_test") + "/victim";
  std::ofstream(victim) << "keep";
  fs::create_directories(output_dir + "/metrics");
  fs::create_hard_link(victim, output_dir + "/metrics/evals.csv");

  EXPECT_THAT(JobScalarWriter::Open(output_dir, 1700000000000),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 hard links")));
  EXPECT_EQ(ReadFile(victim), "keep");
}

TEST(JobScalarWriterTest, SymbolicLinkAtTheDirectoryIsRefused) {
  const std::string output_dir = testing::MakeTempDir("job_scalars_test");
  const std::string elsewhere = testing::MakeTempDir("job_scalars_test");
  fs::create_directory_symlink(elsewhere, output_dir + "/metrics");

  EXPECT_THAT(JobScalarWriter::Open(output_dir, 1700000000000),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("metrics")));
  EXPECT_TRUE(fs::is_empty(elsewhere));
}

}  // namespace
}  // namespace megatrain::server
