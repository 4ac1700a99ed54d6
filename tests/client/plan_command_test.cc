// `megatrain plan`'s flag parsing (client/plan_command.h): sizes and counts
// with units, the request built from the flags (config.json read for
// --hf_dir), and usage errors naming the flag.
#include "client/plan_command.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::client {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PlanCommandTest, ParsesSizesAndCountsWithUnits) {
  EXPECT_EQ(*ParseByteSize("--host_memory", "1.5TB"), 1'500'000'000'000);
  EXPECT_EQ(*ParseByteSize("--host_memory", "125GiB"), int64_t{125} << 30);
  EXPECT_EQ(*ParseByteSize("--nvme", "4e12"), 4'000'000'000'000);
  EXPECT_THAT(ParseByteSize("--nvme", "4 parsecs").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nvme")));
  EXPECT_THAT(ParseByteSize("--nvme", "-1TB").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nvme")));
  EXPECT_EQ(*ParseParamCount("--params", "120B"), 120e9);
  EXPECT_EQ(*ParseParamCount("--params", "70e9"), 70e9);
  EXPECT_THAT(ParseParamCount("--params", "big").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--params")));
}

TEST(PlanCommandTest, BuildsTheRequestFromFlags) {
  PlanArgs args;
  args.family = "llama";
  args.params = "120B";
  args.micro_batch = 8;
  args.gradient_accumulation_steps = 8;
  args.dtype = "bf16";
  args.nvme_tier = "auto";
  args.host_memory = "1.5TB";
  args.nvme = "8TB";
  args.nvme_write_gb_per_s = 3.5;
  const absl::StatusOr<v1::PlanJobRequest> request = PlanRequestFromArgs(args);
  ASSERT_THAT(request.status(), IsOk());
  EXPECT_EQ(request->family(), "llama");
  EXPECT_EQ(request->param_count(), 120e9);
  EXPECT_EQ(request->train().micro_batch(), 8);
  EXPECT_FALSE(request->train().has_seq_len());  // the job file's default
  EXPECT_EQ(request->train().compute_dtype(), v1::COMPUTE_DTYPE_BF16);
  EXPECT_EQ(request->nvme_tier(), "auto");
  EXPECT_EQ(request->machine().host_memory_bytes(), 1'500'000'000'000);
  EXPECT_EQ(request->machine().nvme_bytes(), 8'000'000'000'000);
  EXPECT_EQ(request->machine().nvme_write_bytes_per_second(), 3.5e9);
  EXPECT_FALSE(request->machine().has_gpu_memory_bytes());
}

TEST(PlanCommandTest, SendsTheConfigOfAnHfDir) {
  const std::string dir = testing::MakeTempDir("plan");
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama"})";
  PlanArgs args;
  args.hf_dir = dir;
  const absl::StatusOr<v1::PlanJobRequest> request = PlanRequestFromArgs(args);
  ASSERT_THAT(request.status(), IsOk());
  EXPECT_EQ(request->hf_config_json(), R"({"model_type": "llama"})");
  EXPECT_TRUE(request->model().hf_dir().empty());  // the daemon opens no file
  args.hf_dir = dir + "/missing";
  EXPECT_THAT(PlanRequestFromArgs(args).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing/config.json")));
}

TEST(PlanCommandTest, NeedsExactlyOneModel) {
  PlanArgs args;
  EXPECT_THAT(PlanRequestFromArgs(args).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one of --preset")));
  args.preset = "llama-8b";
  args.params = "8B";
  args.family = "llama";
  EXPECT_THAT(PlanRequestFromArgs(args).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one")));
  PlanArgs dtype;
  dtype.preset = "llama-8b";
  dtype.dtype = "fp8";
  EXPECT_THAT(PlanRequestFromArgs(dtype).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--dtype")));
}

}  // namespace
}  // namespace megatrain::client
