// Issue 36: a config.json of absurd size submitted through the job manager
// over the real engine (NewEngineBackend) is refused at submission with
// INVALID_ARGUMENT naming the field and the limit (Note [Model bounds] in
// engine/model/model_config.h), at once and without allocating by it; the
// daemon then admits the next job as before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/engine_backend.h"
#include "server/core/job_manager.h"
#include "server/core/job_store.h"
#include "server/core/metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

const Principal kMallory{"mallory", Role::kUser};

class ModelBoundsAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = ::megatrain::testing::MakeTempDir("bounds");
    auto store = JobStore::Open(state_dir_ + "/megatrain.db");
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
    backend_ = NewEngineBackend();
    JobManagerOptions options;
    options.jobs_dir = state_dir_ + "/jobs";
    options.devices = {"cpu"};
    options.host_memory_budget_bytes = int64_t{1} << 30;
    auto manager = JobManager::Create(options, store_.get(), backend_.get(), &metrics_);
    ASSERT_THAT(manager, IsOk());
    manager_ = *std::move(manager);
  }

  // A model directory whose config.json has `layers` decoder layers.
  std::string HfDir(const std::string& layers) {
    const std::string dir = state_dir_ + "/model-" + layers;
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 128,
               "intermediate_size": 384, "num_attention_heads": 4,
               "num_hidden_layers": )"
        << layers << "}";
    return dir;
  }

  JobRequest Request(const std::string& hf_dir) {
    JobRequest request;
    request.spec.name = "hostile";
    request.spec.model.hf_dir = hf_dir;
    request.spec.data.tokens = state_dir_ + "/no-such-shard";
    request.spec.train.max_steps = 1;
    return request;
  }

  std::string state_dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<EngineBackend> backend_;
  ServerMetrics metrics_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(ModelBoundsAdmissionTest, TwoToTheThirtyOneLayersIsInvalidArgumentAtSubmit) {
  EXPECT_THAT(manager_->Submit(kMallory, Request(HfDir("2147483648")), ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.hf_dir"),
                             HasSubstr("num_hidden_layers: must be <= 4096, got 2147483648"))));
}

TEST_F(ModelBoundsAdmissionTest, AMillionLayersIsRefusedAndTheNextSubmissionIsJudgedOnItsOwn) {
  EXPECT_THAT(manager_->Submit(kMallory, Request(HfDir("1000000")), ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_hidden_layers: must be <= 4096, got 1000000")));
  // The next one gets past the model checks to its own (missing) data.
  EXPECT_THAT(manager_->Submit(kMallory, Request(HfDir("4")), ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.tokens"), HasSubstr("no such file"))));
}

TEST_F(ModelBoundsAdmissionTest, PlanThroughTheBackendRefusesAHostileHfConfig) {
  engine::PlanModel model;
  model.hf_config_json = R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 128,
      "intermediate_size": 384, "num_attention_heads": 4, "num_hidden_layers": 2147483648})";
  EXPECT_THAT(backend_->PlanJob(model, engine::JobSpec(), engine::DefaultPlanMachine(),
                                engine::Cancellation()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_hidden_layers: must be <= 4096, got 2147483648")));
}

// Note [Cancelled engine calls]: SubmitJob's admission estimate of a
// 4,096-layer model stops with the status of its cancellation.
TEST_F(ModelBoundsAdmissionTest, ACancelledAdmissionEstimateReturnsCancelled) {
  engine::JobSpec spec;
  spec.model.hf_dir = state_dir_ + "/model";
  const std::string json = R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 128,
      "intermediate_size": 384, "num_attention_heads": 4, "num_hidden_layers": 4096})";
  int checks = 0;
  const engine::Cancellation cancel([&checks] {
    return ++checks >= 2 ? absl::CancelledError("test: the client went") : absl::OkStatus();
  });
  EXPECT_THAT(backend_->EstimateFootprintFromHfConfig(spec, json, cancel),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("test: the client went")));
  EXPECT_EQ(checks, 2);
}

}  // namespace
}  // namespace megatrain::server
