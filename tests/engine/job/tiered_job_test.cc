// A job with memory.nvme_tier moments (Note [Tiered trainer] in
// engine/step/trainer.h): its checkpoints hold the same tensor bytes as the
// all-in-RAM job's, a suspend + resume through them continues bit for bit,
// the tier's files are removed with the job, a truncated or unwritable
// moment file fails the job naming the file and leaves the last checkpoint
// intact, and a job asking for the tier without a directory is refused
// naming the field.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/token_shard.h"
#include "tests/testing/pattern_dataset.h"
#include "engine/job/training_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// 40 documents of 4 repeated patterns.
std::string WriteDataset() { return testing::WritePatternDataset(); }

// The tiny preset, accumulation 2, clipping on, checkpoints every 2 steps;
// with `nvme_dir`, the moments on the tier there.
JobSpec Spec(const std::string& tokens, const std::string& output_dir,
             const std::string& nvme_dir) {
  JobSpec s;
  s.name = "tiered";
  s.job_id = "job-000001";
  s.model.preset = "tiny";
  s.data.tokens = tokens;
  s.train.micro_batch = 2;
  s.train.seq_len = 16;
  s.train.gradient_accumulation_steps = 2;
  s.train.max_steps = 6;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.checkpoint.every_steps = 2;
  s.checkpoint.keep_last = 4;
  s.output_dir = output_dir;
  if (!nvme_dir.empty()) {
    s.memory.nvme_tier = NvmeTierMode::kMoments;
    s.memory.nvme_dir = nvme_dir;
  }
  return s;
}

class Recorder : public JobObserver {
 public:
  void OnStep(const StepReport& r) override {
    if (!r.skipped) losses.push_back(r.loss);
    written += r.stats.nvme_written_bytes;
    if (r.step == stop_at && on_stop) on_stop();
  }
  std::vector<double> losses;
  int64_t written = 0;
  int64_t stop_at = -1;
  std::function<void()> on_stop;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string CheckpointDir(const std::string& output_dir, int64_t step) {
  return output_dir + "/checkpoints/" + CheckpointDirName(step);
}

TEST(TieredJobTest, CheckpointsMatchTheAllInRamJobAndResumeIsExact) {
  const std::string data = WriteDataset();
  const std::string ram_out = MakeTempDir("ram");
  Recorder ram;
  {
    auto job = TrainingJob::Create(Spec(data, ram_out, ""), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(&ram), IsOk());
  }
  const std::string nvme = MakeTempDir("nvme");
  const std::string out = MakeTempDir("tiered");
  Recorder first;
  {
    auto job = TrainingJob::Create(Spec(data, out, nvme), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->footprint().host.exp_avg, 0);
    EXPECT_GT((*job)->footprint().nvme_bytes, 0);
    EXPECT_EQ(ListDir(nvme), std::vector<std::string>{"job-000001"});
    TrainingJob* raw = job->get();
    first.stop_at = 3;  // not a checkpoint step: the suspend writes one
    first.on_stop = [raw] { raw->RequestStop(TrainingJob::StopKind::kSuspend); };
    auto outcome = (*job)->Run(&first);
    ASSERT_THAT(outcome, IsOk());
    EXPECT_EQ(*outcome, JobOutcome::kSuspended);
  }
  EXPECT_TRUE(ListDir(nvme).empty()) << "the tier's files outlived the job";
  EXPECT_GT(first.written, 0);
  Recorder second;
  {
    auto job = TrainingJob::Create(Spec(data, out, nvme), "cpu", CheckpointDir(out, 3));
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(&second), IsOk());
  }
  EXPECT_TRUE(ListDir(nvme).empty());
  std::vector<double> tiered = first.losses;
  tiered.insert(tiered.end(), second.losses.begin(), second.losses.end());
  ASSERT_EQ(tiered.size(), ram.losses.size());
  for (size_t i = 0; i < tiered.size(); ++i) EXPECT_EQ(tiered[i], ram.losses[i]) << "step " << i;
  // The checkpoints hold the same bytes: master weights and both moments
  // (read back from the tier) of steps 2 (before the suspend) and 6.
  for (const int64_t step : {2, 6}) {
    for (const char* file : {"master.bin", "exp_avg.bin", "exp_avg_sq.bin"}) {
      const std::string a = ReadFile(CheckpointDir(ram_out, step) + "/" + file);
      EXPECT_FALSE(a.empty());
      EXPECT_TRUE(a == ReadFile(CheckpointDir(out, step) + "/" + file))
          << file << " of step " << step << " differs";
    }
  }
}

TEST(TieredJobTest, TruncatedMomentFileFailsTheJobAndKeepsTheLastCheckpoint) {
  const std::string data = WriteDataset();
  const std::string nvme = MakeTempDir("nvme");
  const std::string out = MakeTempDir("tiered");
  const std::string victim = nvme + "/job-000001/exp_avg_sq.bin";
  auto job = TrainingJob::Create(Spec(data, out, nvme), "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder recorder;
  // After step 3 (step 2's checkpoint is written): step 3's or 4's update
  // meets the short file, and the job fails at the next step or at step
  // 4's checkpoint, which waits for the updates first.
  recorder.stop_at = 3;
  recorder.on_stop = [&victim] { ASSERT_EQ(::truncate(victim.c_str(), 4096), 0); };
  absl::StatusOr<JobOutcome> outcome = (*job)->Run(&recorder);
  EXPECT_THAT(outcome.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(victim)));
  EXPECT_LT(recorder.losses.size(), 6u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().step, 2);
  for (const CheckpointInfo& info : *listed) {
    EXPECT_THAT(VerifyCheckpoint(info.dir, /*check_data=*/true).status(), IsOk()) << info.dir;
  }
  job->reset();
  EXPECT_TRUE(ListDir(nvme).empty());
}

// A moment file that can no longer be written: after step 3 the process's
// file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) drops below the files'
// size, so the next write-behind fails with EFBIG.
TEST(TieredJobTest, UnwritableMomentFileFailsTheJobNamingItAndKeepsTheLastCheckpoint) {
  const std::string data = WriteDataset();
  const std::string nvme = MakeTempDir("nvme");
  const std::string out = MakeTempDir("tiered");
  auto job = TrainingJob::Create(Spec(data, out, nvme), "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const sighandler_t saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  Recorder recorder;
  recorder.stop_at = 3;
  recorder.on_stop = [] {
    struct rlimit limit {};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 4096;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  };
  absl::StatusOr<JobOutcome> outcome = (*job)->Run(&recorder);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_THAT(outcome.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                         HasSubstr(nvme + "/job-000001/exp_avg")));
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().step, 2);
  EXPECT_THAT(VerifyCheckpoint(listed->front().dir, /*check_data=*/true).status(), IsOk());
}

TEST(TieredJobTest, MomentsWithoutTheDaemonsDirectoryFailNamingTheField) {
  JobSpec spec = Spec(WriteDataset(), MakeTempDir("tiered"), "");
  spec.memory.nvme_tier = NvmeTierMode::kMoments;
  EXPECT_THAT(TrainingJob::Create(spec, "cpu", std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("memory.nvme_tier")));
}

TEST(TieredJobTest, AutoWithoutADirectoryRunsInHostMemory) {
  JobSpec spec = Spec(WriteDataset(), MakeTempDir("tiered"), "");
  spec.memory.nvme_tier = NvmeTierMode::kAuto;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->footprint().nvme_bytes, 0);
  EXPECT_GT((*job)->footprint().host.exp_avg, 0);
}

}  // namespace
}  // namespace megatrain::engine
