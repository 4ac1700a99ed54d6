// Tests for engine/optim/lr_schedule.h: warmup, cosine/linear/constant shapes,
// the floor, the ends of the range and option validation.
#include "engine/optim/lr_schedule.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

// LrAt returns fp32: compare with a relative fp32 tolerance (a few ulp of
// the double formula rounded once).
constexpr double kFloatTolerance = 1e-6;

LrSchedule MakeSchedule(LrScheduleKind kind, double peak, int64_t warmup, int64_t total,
                        double min_ratio = 0.0) {
  LrScheduleOptions options;
  options.kind = kind;
  options.peak_lr = peak;
  options.warmup_steps = warmup;
  options.total_steps = total;
  options.min_lr_ratio = min_ratio;
  absl::StatusOr<LrSchedule> schedule = LrSchedule::Create(options);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return *schedule;
}

TEST(LrScheduleTest, WarmupRisesLinearlyToPeak) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kCosine, 1e-3, /*warmup=*/10, 100);
  EXPECT_NEAR(schedule.LrAt(1), 1e-4, 1e-4 * kFloatTolerance);
  EXPECT_NEAR(schedule.LrAt(5), 5e-4, 5e-4 * kFloatTolerance);
  EXPECT_NEAR(schedule.LrAt(10), 1e-3, 1e-3 * kFloatTolerance);
}

TEST(LrScheduleTest, CosineDecaysFromPeakToFloor) {
  const double peak = 2e-3, min_ratio = 0.1, min_lr = peak * min_ratio;
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kCosine, peak, 10, 110, min_ratio);
  // Step 60 is halfway through the 100 decay steps: midpoint of the cosine.
  EXPECT_NEAR(schedule.LrAt(60), 0.5 * (peak + min_lr), peak * kFloatTolerance);
  // A quarter of the way: min + (peak - min) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(schedule.LrAt(35),
              min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi / 4.0)),
              peak * kFloatTolerance);
  EXPECT_NEAR(schedule.LrAt(110), min_lr, peak * kFloatTolerance);
  // Monotone non-increasing after warmup.
  for (int64_t step = 11; step <= 110; ++step) {
    EXPECT_LE(schedule.LrAt(step + 1), schedule.LrAt(step)) << step;
  }
}

TEST(LrScheduleTest, LinearDecaysFromPeakToFloor) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kLinear, 1.0, 0, 100, 0.0);
  EXPECT_NEAR(schedule.LrAt(1), 0.99, kFloatTolerance);
  EXPECT_NEAR(schedule.LrAt(50), 0.5, kFloatTolerance);
  EXPECT_NEAR(schedule.LrAt(100), 0.0, kFloatTolerance);
}

TEST(LrScheduleTest, ConstantStaysAtPeakAfterWarmup) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kConstant, 3e-4, 4, 100);
  EXPECT_NEAR(schedule.LrAt(2), 1.5e-4, 1.5e-4 * kFloatTolerance);
  for (int64_t step : {4, 5, 50, 100, 1000}) {
    EXPECT_EQ(schedule.LrAt(step), static_cast<float>(3e-4)) << step;
  }
}

TEST(LrScheduleTest, StaysAtFloorWhenStepIsPastTotal) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kCosine, 1.0, 0, 10, 0.25);
  EXPECT_EQ(schedule.LrAt(10), 0.25f);
  EXPECT_EQ(schedule.LrAt(11), 0.25f);
  EXPECT_EQ(schedule.LrAt(1'000'000), 0.25f);
}

TEST(LrScheduleTest, TreatsStepBelowOneAsOne) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kLinear, 1.0, 10, 20);
  EXPECT_EQ(schedule.LrAt(0), schedule.LrAt(1));
  EXPECT_EQ(schedule.LrAt(-3), schedule.LrAt(1));
}

TEST(LrScheduleTest, GoesToFloorAfterWarmupWhenWarmupEqualsTotal) {
  const LrSchedule schedule = MakeSchedule(LrScheduleKind::kCosine, 1.0, 10, 10, 0.5);
  EXPECT_NEAR(schedule.LrAt(10), 1.0, kFloatTolerance);
  EXPECT_EQ(schedule.LrAt(11), 0.5f);
}

TEST(LrScheduleTest, ParseAcceptsKnownKindsAndRejectsOthers) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant}) {
    absl::StatusOr<LrScheduleKind> parsed = ParseLrScheduleKind(LrScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  absl::StatusOr<LrScheduleKind> bad = ParseLrScheduleKind("step");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "optimizer.schedule: must be cosine, linear or constant, got 'step'");
}

TEST(LrScheduleTest, CreateReturnsInvalidArgumentNamingFieldWhenOptionIsBad) {
  struct Case {
    LrScheduleOptions options;
    std::string message;
  };
  std::vector<Case> cases;
  LrScheduleOptions options;
  options.total_steps = 100;
  options.warmup_steps = 200;
  cases.push_back({options, "optimizer.warmup_steps: must be in [0, total_steps=100], got 200"});
  options = {};
  options.warmup_steps = -1;
  cases.push_back({options, "optimizer.warmup_steps: must be in [0, "});
  options = {};
  options.total_steps = 0;
  cases.push_back({options, "optimizer.total_steps: must be >= 1, got 0"});
  options = {};
  options.peak_lr = -1.0;
  cases.push_back({options, "optimizer.lr: must be finite and >= 0"});
  options = {};
  options.peak_lr = std::numeric_limits<double>::infinity();
  cases.push_back({options, "optimizer.lr: must be finite and >= 0"});
  options = {};
  options.min_lr_ratio = 1.5;
  cases.push_back({options, "optimizer.min_lr_ratio: must be in [0, 1], got 1.5"});
  for (const Case& bad : cases) {
    absl::StatusOr<LrSchedule> schedule = LrSchedule::Create(bad.options);
    EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_THAT(std::string(schedule.status().message()), HasSubstr(bad.message));
  }
}

}  // namespace
}  // namespace megatrain::engine
