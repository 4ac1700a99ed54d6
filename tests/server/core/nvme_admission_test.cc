// AdmitNvmeTier (server/core/nvme_admission.h): off stays in host memory,
// moments goes to the tier or is refused without --nvme_dir naming the
// field, auto goes to the tier only when host memory is too small, and a
// tier larger than --nvme_budget is RESOURCE_EXHAUSTED with the bytes per
// tier. SweepStaleNvmeTier removes only the recorded jobs' directories and
// never follows a symbolic link.
#include "server/core/nvme_admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// A model of 1 G parameters: 16 GiB in host memory, or 8 GiB there and
// 8 GiB of moments on the tier (what WithNvmeMoments gives, staging aside).
absl::StatusOr<engine::MemoryFootprint> Estimate(const engine::JobSpec& spec) {
  engine::MemoryFootprint f;
  f.params = kGiB;
  f.host.master = f.host.grad = f.host.exp_avg = f.host.exp_avg_sq = 4 * kGiB;
  if (spec.memory.nvme_tier == engine::NvmeTierMode::kMoments) {
    f.nvme_bytes = 8 * kGiB;
    f.host.exp_avg = f.host.exp_avg_sq = 0;
  }
  f.host_total_bytes = f.host.Total();
  return f;
}

engine::JobSpec Spec(engine::NvmeTierMode tier) {
  engine::JobSpec spec;
  spec.memory.nvme_tier = tier;
  return spec;
}

const NvmeTierOptions kTier{"/mnt/nvme", 100 * kGiB};

TEST(NvmeAdmissionTest, OffStaysInHostMemory) {
  auto admitted = AdmitNvmeTier(Spec(engine::NvmeTierMode::kOff), Estimate, 64 * kGiB, kTier);
  ASSERT_THAT(admitted, IsOk());
  EXPECT_EQ(admitted->tier, engine::NvmeTierMode::kOff);
  EXPECT_EQ(admitted->footprint.nvme_bytes, 0);
}

TEST(NvmeAdmissionTest, MomentsGoToTheTier) {
  auto admitted = AdmitNvmeTier(Spec(engine::NvmeTierMode::kMoments), Estimate, 64 * kGiB, kTier);
  ASSERT_THAT(admitted, IsOk());
  EXPECT_EQ(admitted->tier, engine::NvmeTierMode::kMoments);
  EXPECT_EQ(admitted->footprint.nvme_bytes, 8 * kGiB);
}

TEST(NvmeAdmissionTest, MomentsWithoutADirectoryAreRefusedNamingTheField) {
  EXPECT_THAT(AdmitNvmeTier(Spec(engine::NvmeTierMode::kMoments), Estimate, 64 * kGiB, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("memory.nvme_tier"), HasSubstr("--nvme_dir"))));
}

TEST(NvmeAdmissionTest, AutoUsesTheTierOnlyWhenHostMemoryIsTooSmall) {
  auto fits = AdmitNvmeTier(Spec(engine::NvmeTierMode::kAuto), Estimate, 16 * kGiB, kTier);
  ASSERT_THAT(fits, IsOk());
  EXPECT_EQ(fits->tier, engine::NvmeTierMode::kOff);
  EXPECT_EQ(fits->footprint.host_total_bytes, 16 * kGiB);
  auto tiered = AdmitNvmeTier(Spec(engine::NvmeTierMode::kAuto), Estimate, 12 * kGiB, kTier);
  ASSERT_THAT(tiered, IsOk());
  EXPECT_EQ(tiered->tier, engine::NvmeTierMode::kMoments);
  EXPECT_EQ(tiered->footprint.host_total_bytes, 8 * kGiB);
  // No tier on this daemon: auto stays in host memory (the host check
  // then refuses it).
  auto none = AdmitNvmeTier(Spec(engine::NvmeTierMode::kAuto), Estimate, 12 * kGiB, {});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->tier, engine::NvmeTierMode::kOff);
}

TEST(NvmeAdmissionTest, TierLargerThanTheBudgetIsResourceExhaustedWithTheBytesPerTier) {
  const NvmeTierOptions small{"/mnt/nvme", 4 * kGiB};
  EXPECT_THAT(AdmitNvmeTier(Spec(engine::NvmeTierMode::kMoments), Estimate, 64 * kGiB, small),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("8.00 GiB (8589934592 bytes) on the NVMe tier"),
                             HasSubstr("of host memory"), HasSubstr("--nvme_budget is 4.00 GiB"))));
}

TEST(NvmeAdmissionTest, DirectoryNeedsAnAbsolutePathAndABudget) {
  EXPECT_THAT(ValidateNvmeTierOptions({"nvme", kGiB}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nvme_dir")));
  EXPECT_THAT(ValidateNvmeTierOptions({"/mnt/nvme", 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nvme_budget")));
  EXPECT_THAT(ValidateNvmeTierOptions({"", 0}), IsOk());
  EXPECT_THAT(ValidateNvmeTierOptions(kTier), IsOk());
}

// Note [Stale NVMe tier directories]: a recorded job's directory goes with
// its files (and a subdirectory); a name no tiered job has stays, and so
// does a symbolic link named like a recorded job, and the directory it
// points to is untouched.
TEST(NvmeSweepTest, RemovesOnlyRecordedJobDirectoriesAndNeverFollowsALink) {
  namespace fs = std::filesystem;
  const std::string tier = ::megatrain::testing::MakeTempDir("tier");
  const std::string victim = ::megatrain::testing::MakeTempDir("victim");
  fs::create_directories(tier + "/job-000001/nested");
  std::ofstream(tier + "/job-000001/exp_avg.bin") << "moments";
  std::ofstream(tier + "/job-000001/nested/x") << "x";
  fs::create_directory(tier + "/job-000002");
  fs::create_directory(tier + "/someone-elses");
  std::ofstream(tier + "/someone-elses/keep") << "keep";
  std::ofstream(victim + "/precious") << "precious";
  fs::create_directory_symlink(victim, tier + "/job-000003");
  const std::set<std::string> recorded = {"job-000001", "job-000002", "job-000003"};
  absl::StatusOr<NvmeSweep> sweep =
      SweepStaleNvmeTier(tier, [&](const std::string& name) { return recorded.count(name) > 0; });
  ASSERT_THAT(sweep, IsOk());
  EXPECT_THAT(sweep->removed, ::testing::UnorderedElementsAre("job-000001", "job-000002"));
  EXPECT_THAT(sweep->left,
              ::testing::UnorderedElementsAre(HasSubstr("someone-elses: no tiered job"),
                                              HasSubstr("job-000003: not a directory")));
  EXPECT_FALSE(fs::exists(tier + "/job-000001"));
  EXPECT_FALSE(fs::exists(tier + "/job-000002"));
  EXPECT_TRUE(fs::exists(tier + "/someone-elses/keep"));
  EXPECT_TRUE(fs::is_symlink(tier + "/job-000003"));
  EXPECT_TRUE(fs::exists(victim + "/precious"));
}

TEST(NvmeSweepTest, MissingOrLinkedDirectoryIsAnErrorNamingIt) {
  namespace fs = std::filesystem;
  const std::string base = ::megatrain::testing::MakeTempDir("tier");
  EXPECT_THAT(SweepStaleNvmeTier(base + "/missing", [](const std::string&) { return true; }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(base + "/missing")));
  fs::create_directory(base + "/real");
  std::ofstream(base + "/real/job-000001") << "x";
  fs::create_directory_symlink(base + "/real", base + "/link");
  EXPECT_THAT(SweepStaleNvmeTier(base + "/link", [](const std::string&) { return true; }),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(base + "/link")));
  EXPECT_TRUE(fs::exists(base + "/real/job-000001"));
}

}  // namespace
}  // namespace megatrain::server
