// Tests for engine/tools/optimizer_bench.h: a small run fills every field
// consistently; bad options are rejected. (The real measurement is
// `megatrain-bench --optimizer_only`.)
#include "engine/tools/optimizer_bench.h"

#include <string>

#include "engine/optim/adamw.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

TEST(OptimizerBenchTest, SmallRunFillsEveryField) {
  OptimizerBenchOptions options;
  options.params = 200'003;
  options.threads = 2;
  options.iterations = 3;
  options.warmup = 1;
  absl::StatusOr<OptimizerBenchResult> result = RunOptimizerBenchmark(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->params, options.params);
  EXPECT_EQ(result->threads, 2);
  EXPECT_GE(result->torch_threads, 1);
  EXPECT_EQ(result->kernel_variant, CpuKernelName(ActiveCpuKernel()));
  EXPECT_GT(result->adamw_seconds_per_step, 0.0);
  EXPECT_GT(result->torch_adamw_seconds_per_step, 0.0);
  EXPECT_DOUBLE_EQ(result->adamw_params_per_s, options.params / result->adamw_seconds_per_step);
  EXPECT_DOUBLE_EQ(result->speedup, result->adamw_params_per_s / result->torch_adamw_params_per_s);
}

TEST(OptimizerBenchTest, ReturnsInvalidArgumentWhenOptionIsBad) {
  OptimizerBenchOptions options;
  options.params = 0;
  absl::StatusOr<OptimizerBenchResult> result = RunOptimizerBenchmark(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("bench.params: must be >= 1, got 0"));

  options = {};
  options.params = 10;
  options.iterations = 0;
  result = RunOptimizerBenchmark(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("bench.iterations"));
}

}  // namespace
}  // namespace megatrain::engine
