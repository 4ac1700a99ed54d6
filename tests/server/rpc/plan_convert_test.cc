// PlanJob's conversions (server/rpc/plan_convert.h) and the machine it
// plans for (server/core/plan_machine.h): request fields reach the engine's
// plan inputs, bad ones are INVALID_ARGUMENT naming the field, the daemon's
// facts fill what the caller left unset, and the plan comes back whole.
#include "server/rpc/plan_convert.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PlanInputsFromProtoTest, CarriesModelShapeTierAndMachine) {
  v1::PlanJobRequest request;
  request.set_family("llama");
  request.set_param_count(120e9);
  request.mutable_train()->set_micro_batch(4);
  request.mutable_train()->set_seq_len(4096);
  request.mutable_train()->set_global_batch(32);
  request.mutable_train()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  request.set_nvme_tier("auto");
  request.mutable_machine()->set_host_memory_bytes(1'500'000'000'000);
  request.mutable_machine()->set_nvme_read_bytes_per_second(7e9);
  const absl::StatusOr<PlanInputs> in = PlanInputsFromProto(request);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_EQ(in->model.family, "llama");
  EXPECT_EQ(in->model.param_count, 120e9);
  EXPECT_EQ(in->spec.train.micro_batch, 4);
  EXPECT_EQ(in->spec.train.seq_len, 4096);
  EXPECT_EQ(in->spec.train.gradient_accumulation_steps, 8);  // global_batch / micro_batch
  EXPECT_EQ(in->spec.train.compute_dtype, engine::ComputeDtype::kBf16);
  EXPECT_EQ(in->spec.memory.nvme_tier, engine::NvmeTierMode::kAuto);
  EXPECT_EQ(in->machine.host_memory_bytes, 1'500'000'000'000);
  EXPECT_EQ(in->machine.nvme_read_bytes_per_second, 7e9);
  EXPECT_FALSE(in->machine.gpu_memory_bytes.has_value());
}

TEST(PlanInputsFromProtoTest, RefusesBadFieldsNamingThem) {
  v1::PlanJobRequest hf_dir;
  hf_dir.mutable_model()->set_hf_dir("/models/x");
  EXPECT_THAT(PlanInputsFromProto(hf_dir).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hf_config_json")));
  v1::PlanJobRequest tier;
  tier.set_nvme_tier("everything");
  EXPECT_THAT(PlanInputsFromProto(tier).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory.nvme_tier")));
  v1::PlanJobRequest negative;
  negative.mutable_machine()->set_h2d_bytes_per_second(-1);
  EXPECT_THAT(
      PlanInputsFromProto(negative).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("machine.h2d_bytes_per_second")));
  v1::PlanJobRequest huge;
  huge.set_hf_config_json(std::string(kMaxPlanConfigBytes + 1, ' '));
  EXPECT_THAT(PlanInputsFromProto(huge).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hf_config_json")));
  v1::PlanJobRequest batch;
  batch.mutable_train()->set_micro_batch(8);
  batch.mutable_train()->set_global_batch(12);
  EXPECT_THAT(PlanInputsFromProto(batch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.global_batch")));
}

TEST(ResolvePlanMachineTest, RequestThenDaemonThenDefault) {
  PlanMachineOverrides request;
  request.host_memory_bytes = 100;
  DaemonMachine daemon;
  daemon.host_memory_budget_bytes = 200;
  daemon.nvme_budget_bytes = 300;
  daemon.h2d_bytes_per_second = 40e9;
  const engine::PlanMachine m = ResolvePlanMachine(request, daemon);
  const engine::PlanMachine d = engine::DefaultPlanMachine();
  EXPECT_EQ(m.host_memory_bytes, 100);
  EXPECT_EQ(m.nvme_bytes, 300);
  EXPECT_EQ(m.h2d_bytes_per_second, 40e9);
  EXPECT_EQ(m.d2h_bytes_per_second, d.d2h_bytes_per_second);
  EXPECT_EQ(m.gpu_memory_bytes, d.gpu_memory_bytes);
  EXPECT_THAT(m.description, HasSubstr("host (request)"));
  EXPECT_THAT(m.description, HasSubstr("nvme (daemon)"));
  EXPECT_THAT(m.description, HasSubstr("gpu (default)"));
}

TEST(JobPlanToProtoTest, CopiesEveryTierAndTerm) {
  engine::JobPlan plan;
  plan.params = 7;
  plan.devices = 4;
  plan.nvme_tier = engine::NvmeTierMode::kMoments;
  plan.tiers = {10, 4, 5, 6};
  plan.fits = true;
  plan.verdict = "fits: ...";
  plan.projection.step_seconds = 1.5;
  plan.projection.bound = "nvme";
  engine::PlanMachine machine = engine::DefaultPlanMachine();
  machine.nvme_bytes = 99;
  v1::PlanJobResponse out;
  JobPlanToProto(plan, machine, &out);
  EXPECT_EQ(out.params(), 7);
  EXPECT_EQ(out.devices(), 4);
  EXPECT_EQ(out.nvme_tier(), "moments");
  EXPECT_EQ(out.host_bytes(), 10);
  EXPECT_EQ(out.pinned_bytes(), 4);
  EXPECT_EQ(out.device_bytes(), 5);
  EXPECT_EQ(out.nvme_bytes(), 6);
  EXPECT_TRUE(out.fits());
  EXPECT_EQ(out.projection().step_seconds(), 1.5);
  EXPECT_EQ(out.projection().bound(), "nvme");
  EXPECT_EQ(out.machine().nvme_bytes(), 99);
}

}  // namespace
}  // namespace megatrain::server
