// Tests of the spec conversions: megatrain.v1.JobSpec -> JobRequest
// (server/rpc/proto_convert.h), its inverse, the store's JSON form
// (server/core/job_request_json.h) and the server-side field checks
// (ValidateJobRequest). One test per invalid case, each naming its field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/job_spec_json.h"
#include "engine/spec/keyword.h"
#include "engine/spec/spec_fields.h"
#include "server/core/job.h"
#include "server/core/job_request_json.h"
#include "server/rpc/proto_convert.h"
#include "tests/testing/spec_rows.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

v1::JobSpec TinySpec() {
  v1::JobSpec spec;
  spec.set_name("tiny");
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_tokens("/repo/examples/jobs/data/tiny");
  spec.mutable_train()->set_micro_batch(8);
  spec.mutable_train()->set_seq_len(128);
  spec.mutable_train()->set_gradient_accumulation_steps(1);
  spec.mutable_train()->set_max_steps(60);
  spec.mutable_train()->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  spec.mutable_optimizer()->set_lr(3.0e-3);
  spec.mutable_optimizer()->set_weight_decay(0.0);
  spec.mutable_optimizer()->set_warmup_steps(5);
  spec.mutable_optimizer()->set_schedule("cosine");
  spec.mutable_checkpoint()->set_every_steps(20);
  spec.mutable_checkpoint()->set_keep_last(2);
  spec.set_priority(3);
  (*spec.mutable_labels())["team"] = "nlp";
  return spec;
}

TEST(SpecConvertTest, ConvertsEveryGivenField) {
  absl::StatusOr<JobRequest> request = JobRequestFromProto(TinySpec());
  ASSERT_THAT(request, IsOk());
  const engine::JobSpec& spec = request->spec;
  EXPECT_EQ(spec.name, "tiny");
  EXPECT_EQ(spec.model.preset, "tiny");
  EXPECT_EQ(spec.data.tokens, "/repo/examples/jobs/data/tiny");
  EXPECT_EQ(spec.train.micro_batch, 8);
  EXPECT_EQ(spec.train.seq_len, 128);
  EXPECT_EQ(spec.train.max_steps, 60);
  EXPECT_EQ(spec.train.compute_dtype, engine::ComputeDtype::kFp32);
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, 3e-3);
  EXPECT_EQ(spec.optimizer.warmup_steps, 5);
  EXPECT_EQ(spec.optimizer.schedule, engine::LrScheduleKind::kCosine);
  EXPECT_EQ(spec.checkpoint.every_steps, 20);
  EXPECT_EQ(spec.checkpoint.keep_last, 2);
  EXPECT_EQ(request->priority, 3);
  EXPECT_EQ(request->labels.at("team"), "nlp");
}

TEST(SpecConvertTest, AbsentOptionalFieldsKeepEngineDefaults) {
  v1::JobSpec minimal;
  minimal.mutable_model()->set_preset("tiny");
  minimal.mutable_train()->set_max_steps(10);
  absl::StatusOr<JobRequest> request = JobRequestFromProto(minimal);
  ASSERT_THAT(request, IsOk());
  const engine::JobSpec defaults;
  const engine::JobSpec& spec = request->spec;
  EXPECT_EQ(spec.train.micro_batch, defaults.train.micro_batch);
  EXPECT_EQ(spec.train.seq_len, defaults.train.seq_len);
  EXPECT_EQ(spec.train.gradient_accumulation_steps, defaults.train.gradient_accumulation_steps);
  EXPECT_DOUBLE_EQ(spec.train.max_grad_norm, defaults.train.max_grad_norm);
  EXPECT_EQ(spec.train.nan_policy, defaults.train.nan_policy);
  EXPECT_FALSE(spec.train.offload_activations);
  EXPECT_EQ(spec.train.offload_activations, defaults.train.offload_activations);
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, defaults.optimizer.lr);
  EXPECT_DOUBLE_EQ(spec.optimizer.beta2, defaults.optimizer.beta2);
  EXPECT_DOUBLE_EQ(spec.optimizer.eps, defaults.optimizer.eps);
  EXPECT_EQ(spec.optimizer.schedule, defaults.optimizer.schedule);
  EXPECT_EQ(spec.eval.batches, defaults.eval.batches);
  EXPECT_EQ(spec.checkpoint.keep_last, defaults.checkpoint.keep_last);
  EXPECT_EQ(spec.data.shuffle_seed, defaults.data.shuffle_seed);
  EXPECT_EQ(spec.train.compute_dtype, engine::ComputeDtype::kFp32);
}

TEST(SpecConvertTest, ExplicitZeroOfOptionalFieldIsKept) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_max_grad_norm(0);  // clipping off
  spec.mutable_checkpoint()->set_keep_last(0);
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_DOUBLE_EQ(request->spec.train.max_grad_norm, 0);
  EXPECT_EQ(request->spec.checkpoint.keep_last, 0);
}

TEST(SpecConvertTest, GlobalBatchSetsGradientAccumulation) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->clear_gradient_accumulation_steps();
  spec.mutable_train()->set_global_batch(32);
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.train.gradient_accumulation_steps, 4);
}

TEST(SpecConvertTest, GlobalBatchNotMultipleOfMicroBatchIsInvalid) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->clear_gradient_accumulation_steps();
  spec.mutable_train()->set_global_batch(20);
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.global_batch: must be a positive multiple of "
                                 "train.micro_batch (8), got 20")));
}

TEST(SpecConvertTest, GlobalBatchDisagreeingWithAccumulationIsInvalid) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_gradient_accumulation_steps(3);
  spec.mutable_train()->set_global_batch(32);
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.gradient_accumulation_steps: 3 disagrees")));
}

TEST(SpecConvertTest, UnknownComputeDtypeIsInvalid) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_compute_dtype(static_cast<v1::ComputeDtype>(42));
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.compute_dtype: unknown value 42")));
}

TEST(SpecConvertTest, NanPolicyConvertsBothWays) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_nan_policy(v1::NAN_POLICY_FAIL);
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.train.nan_policy, engine::NanPolicy::kFail);
  v1::JobSpec back;
  JobRequestToProto(*request, &back);
  EXPECT_EQ(back.train().nan_policy(), v1::NAN_POLICY_FAIL);
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(JobRequestToJson(*request));
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->spec.train.nan_policy, engine::NanPolicy::kFail);

  spec.mutable_train()->set_nan_policy(static_cast<v1::NanPolicy>(7));
  EXPECT_THAT(JobRequestFromProto(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("train.nan_policy: unknown value 7")));
}

// model.init_from goes through the proto both ways (the optimizer's word
// parsed at the door), and through the stored JSON with the directory the
// daemon resolved; a job stored without it has none.
TEST(SpecConvertTest, InitFromConvertsBothWays) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->mutable_init_from()->set_checkpoint("job-000012/step-400");
  spec.mutable_model()->mutable_init_from()->set_optimizer("restore");
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.model.init_from.checkpoint, "job-000012/step-400");
  EXPECT_EQ(request->spec.model.init_from.optimizer, engine::InitOptimizer::kRestore);
  EXPECT_EQ(request->spec.model.init_from.checkpoint_dir, "");
  v1::JobSpec back;
  JobRequestToProto(*request, &back);
  EXPECT_EQ(back.model().init_from().checkpoint(), "job-000012/step-400");
  EXPECT_EQ(back.model().init_from().optimizer(), "restore");
  request->spec.model.init_from.checkpoint_dir = "/state/jobs/job-000012/step-00000400";
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(JobRequestToJson(*request));
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->spec.model.init_from.checkpoint_dir, "/state/jobs/job-000012/step-00000400");
  EXPECT_EQ(parsed->spec.model.init_from.optimizer, engine::InitOptimizer::kRestore);
  absl::StatusOr<JobRequest> none = JobRequestFromProto(TinySpec());
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->spec.model.init_from.checkpoint, "");
  EXPECT_EQ(JobRequestToJson(*none).find("init_from"), std::string::npos);

  spec.mutable_model()->mutable_init_from()->set_optimizer("keep");
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.init_from.optimizer: must be fresh or restore")));
}

// Issue 16: train.schedule, train.wave, train.activations and
// train.cuda_graphs go through the proto and the stored JSON both ways,
// parsed into the spec's enums at the door (their length first); unset is
// auto, as is a job stored before them.
TEST(SpecConvertTest, StepScheduleConvertsBothWays) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_schedule("layer-major");
  spec.mutable_train()->set_wave(3);
  spec.mutable_train()->set_activations("host");
  spec.mutable_train()->set_cuda_graphs("off");
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.train.schedule, engine::StepSchedule::kLayerMajor);
  EXPECT_EQ(request->spec.train.wave, 3);
  EXPECT_EQ(request->spec.train.activations, engine::ActivationPlacement::kHost);
  EXPECT_EQ(request->spec.train.cuda_graphs, engine::CudaGraphs::kOff);
  v1::JobSpec back;
  JobRequestToProto(*request, &back);
  EXPECT_EQ(back.train().schedule(), "layer-major");
  EXPECT_EQ(back.train().wave(), 3);
  EXPECT_EQ(back.train().activations(), "host");
  EXPECT_EQ(back.train().cuda_graphs(), "off");
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(JobRequestToJson(*request));
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->spec.train.schedule, engine::StepSchedule::kLayerMajor);
  EXPECT_EQ(parsed->spec.train.wave, 3);
  EXPECT_EQ(parsed->spec.train.activations, engine::ActivationPlacement::kHost);
  EXPECT_EQ(parsed->spec.train.cuda_graphs, engine::CudaGraphs::kOff);
  absl::StatusOr<JobRequest> plain = JobRequestFromProto(TinySpec());
  ASSERT_THAT(plain, IsOk());
  EXPECT_FALSE(plain->spec.train.schedule.has_value());
  EXPECT_EQ(plain->spec.train.wave, 0);
  EXPECT_EQ(plain->spec.train.activations, engine::ActivationPlacement::kAuto);
  EXPECT_EQ(plain->spec.train.cuda_graphs, engine::CudaGraphs::kAuto);
  JobRequestToProto(*plain, &back);
  EXPECT_EQ(back.train().schedule(), "auto");
  EXPECT_EQ(back.train().activations(), "auto");
  EXPECT_EQ(back.train().cuda_graphs(), "auto");
  // The words are bounded at the door (Note [String caps]).
  v1::JobSpec long_word = TinySpec();
  long_word.mutable_train()->set_cuda_graphs(std::string(100, 'o'));
  EXPECT_THAT(JobRequestFromProto(long_word),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.cuda_graphs")));
  long_word = TinySpec();
  long_word.mutable_train()->set_schedule(std::string(100, 'l'));
  EXPECT_THAT(JobRequestFromProto(long_word),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.schedule")));
}

// An unknown word is INVALID_ARGUMENT at the door naming the field and the
// word, every bad one of the section at once (the messages ValidateJobSpec
// gave when the spec carried the words).
TEST(SpecConvertTest, UnknownScheduleWordsAreRefusedAtTheDoor) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_schedule("layer_major");
  spec.mutable_train()->set_activations("gpu");
  spec.mutable_train()->set_cuda_graphs("yes");
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  EXPECT_THAT(request, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("train.schedule: must be auto, micro-batch-major or "
                                          "layer-major, got 'layer_major'")));
  EXPECT_THAT(request, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("train.activations: must be auto, device or host, got "
                                          "'gpu'")));
  EXPECT_THAT(request, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("train.cuda_graphs: must be auto, off or on, got "
                                          "'yes'")));
  spec = TinySpec();
  spec.mutable_optimizer()->set_schedule("exponential");
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("optimizer.schedule: must be cosine, linear or constant, got "
                                 "'exponential'")));
}

// train.resident_layers: a count goes through the proto and the stored
// JSON both ways, unset is auto (and stays unset), a negative count is
// INVALID_ARGUMENT naming the field.
TEST(SpecConvertTest, ResidentLayersConvertBothWays) {
  for (const int32_t layers : {0, 5}) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_train()->set_resident_layers(layers);
    absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
    ASSERT_THAT(request, IsOk());
    EXPECT_EQ(request->spec.train.resident_layers, layers);
    v1::JobSpec back;
    JobRequestToProto(*request, &back);
    EXPECT_TRUE(back.train().has_resident_layers());
    EXPECT_EQ(back.train().resident_layers(), layers);
    absl::StatusOr<JobRequest> parsed = JobRequestFromJson(JobRequestToJson(*request));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(parsed->spec.train.resident_layers, layers);
  }
  absl::StatusOr<JobRequest> plain = JobRequestFromProto(TinySpec());
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ(plain->spec.train.resident_layers, engine::kAutoResidentLayers);
  v1::JobSpec back;
  JobRequestToProto(*plain, &back);
  EXPECT_FALSE(back.train().has_resident_layers());
  v1::JobSpec negative = TinySpec();
  negative.mutable_train()->set_resident_layers(-1);
  EXPECT_THAT(JobRequestFromProto(negative),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.resident_layers: must be >= 0 (leave it unset for auto), "
                                 "got -1")));
}

// memory.weight_stream and memory.gradient_landing (issue 19) go through
// the proto and the stored JSON; bad values are INVALID_ARGUMENT naming the
// field; a ring with clipping is refused by validation; a job stored
// before them reads back as bf16 / arena.
TEST(SpecConvertTest, MemoryModesConvertBothWays) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_train()->set_max_grad_norm(0);
  spec.mutable_memory()->set_weight_stream("fp32");
  spec.mutable_memory()->set_gradient_landing("ring");
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.memory.weight_stream, engine::WeightStream::kFp32);
  EXPECT_EQ(request->spec.memory.gradient_landing, engine::GradientLanding::kRing);
  EXPECT_THAT(engine::ValidateJobSpec(request->spec), IsOk());
  v1::JobSpec back;
  JobRequestToProto(*request, &back);
  EXPECT_EQ(back.memory().weight_stream(), "fp32");
  EXPECT_EQ(back.memory().gradient_landing(), "ring");
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(JobRequestToJson(*request));
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->spec.memory.weight_stream, engine::WeightStream::kFp32);
  EXPECT_EQ(parsed->spec.memory.gradient_landing, engine::GradientLanding::kRing);
  absl::StatusOr<JobRequest> plain = JobRequestFromProto(TinySpec());
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ(plain->spec.memory.weight_stream, engine::WeightStream::kBf16);
  EXPECT_EQ(plain->spec.memory.gradient_landing, engine::GradientLanding::kArena);

  spec.mutable_train()->set_max_grad_norm(1.0);
  request = JobRequestFromProto(spec);
  ASSERT_THAT(request, IsOk());
  EXPECT_THAT(engine::ValidateJobSpec(request->spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("memory.gradient_landing: ring needs train.max_grad_norm 0")));
  spec.mutable_memory()->set_weight_stream("fp16");
  EXPECT_THAT(
      JobRequestFromProto(spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("memory.weight_stream: must be bf16, fp32 or host_cast, got 'fp16'")));
  spec.mutable_memory()->set_weight_stream("fp32");
  spec.mutable_memory()->set_gradient_landing(std::string(100, 'x'));
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("memory.gradient_landing: must be arena, ring or auto")));
}

TEST(SpecConvertTest, OffloadActivationsConvertsBothWays) {
  for (bool offload : {true, false}) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_train()->set_offload_activations(offload);
    absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
    ASSERT_THAT(request, IsOk());
    EXPECT_EQ(request->spec.train.offload_activations, offload);
    v1::JobSpec back;
    JobRequestToProto(*request, &back);
    EXPECT_TRUE(back.train().has_offload_activations());
    EXPECT_EQ(back.train().offload_activations(), offload);
    const std::string json = JobRequestToJson(*request);
    EXPECT_THAT(json,
                HasSubstr(absl::StrCat("\"offload_activations\":", offload ? "true" : "false")));
    absl::StatusOr<JobRequest> parsed = JobRequestFromJson(json);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(parsed->spec.train.offload_activations, offload);
  }
}

TEST(SpecConvertTest, StoredJsonWithoutOffloadActivationsIsOff) {
  // Jobs stored before train.offload_activations existed ran without it.
  absl::StatusOr<JobRequest> old = JobRequestFromJson(R"({"train": {"micro_batch": 4}})");
  ASSERT_THAT(old, IsOk());
  EXPECT_FALSE(old->spec.train.offload_activations);
  // Not a bool: the stored form is corrupt (nlohmann's type error).
  EXPECT_THAT(JobRequestFromJson(R"({"train": {"offload_activations": 3}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("type must be boolean")));
}

TEST(SpecConvertTest, StoredJsonWithTheOldBoolKeepsItsMeaning) {
  // Jobs stored before nan_policy replaced train.skip_nonfinite_steps.
  absl::StatusOr<JobRequest> old_fail =
      JobRequestFromJson(R"({"train": {"skip_nonfinite_steps": false}})");
  ASSERT_THAT(old_fail, IsOk());
  EXPECT_EQ(old_fail->spec.train.nan_policy, engine::NanPolicy::kFail);
  absl::StatusOr<JobRequest> old_skip =
      JobRequestFromJson(R"({"train": {"skip_nonfinite_steps": true}})");
  ASSERT_THAT(old_skip, IsOk());
  EXPECT_EQ(old_skip->spec.train.nan_policy, engine::NanPolicy::kSkip);
  EXPECT_THAT(JobRequestFromJson(R"({"train": {"nan_policy": "retry"}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("train.nan_policy")));
}

class RelativePathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RelativePathTest, IsInvalidNamingTheField) {
  v1::JobSpec spec = TinySpec();
  const std::string& field = GetParam();
  if (field == "model.hf_dir") {
    spec.mutable_model()->clear_preset();
    spec.mutable_model()->set_hf_dir("models/llama");
  } else if (field == "data.tokens") {
    spec.mutable_data()->set_tokens("data/tiny");
  } else if (field == "data.text") {
    spec.mutable_data()->set_text("corpus.txt");
  } else if (field == "data.tokenizer") {
    spec.mutable_data()->set_tokenizer("spm.model");
  } else {
    spec.set_output_dir("out");
  }
  EXPECT_THAT(JobRequestFromProto(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr(field + ": must be an absolute path")));
}

INSTANTIATE_TEST_SUITE_P(Fields, RelativePathTest,
                         ::testing::Values("model.hf_dir", "data.tokens", "data.text",
                                           "data.tokenizer", "output_dir"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '.') c = '_';
                           }
                           return name;
                         });

TEST(SpecConvertTest, ToProtoAndBackIsIdentity) {
  absl::StatusOr<JobRequest> request = JobRequestFromProto(TinySpec());
  ASSERT_THAT(request, IsOk());
  v1::JobSpec proto;
  JobRequestToProto(*request, &proto);
  absl::StatusOr<JobRequest> again = JobRequestFromProto(proto);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(JobRequestToJson(*again), JobRequestToJson(*request));
}

TEST(SpecConvertTest, JsonRoundTripKeepsEveryField) {
  absl::StatusOr<JobRequest> request = JobRequestFromProto(TinySpec());
  ASSERT_THAT(request, IsOk());
  request->spec.train.compute_dtype = engine::ComputeDtype::kBf16;
  request->spec.data.eval_fraction = 0.1;
  request->spec.train.seed = 77;
  request->spec.train.offload_activations = true;
  const std::string json = JobRequestToJson(*request);
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(json);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(JobRequestToJson(*parsed), json);
  EXPECT_EQ(parsed->spec.train.compute_dtype, engine::ComputeDtype::kBf16);
  EXPECT_TRUE(parsed->spec.train.offload_activations);
}

// Written by JobRequestToJson at commit 33c2300 (before the spec's JSON
// moved to engine/spec/job_spec_json.cc) for the request below: the job
// store holds these bytes, so they must not change.
TEST(SpecConvertTest, StoreJsonEqualsTheFormerWriter) {
  JobRequest r;
  engine::JobSpec& s = r.spec;
  s.name = "gold \"q\" \xc3\xa9";
  s.model.preset = "tiny";
  s.model.hf_dir = "/m/hf";
  s.data.tokens = "/d/tok";
  s.data.eval_tokens = "/d/eval";
  s.data.text = "/d/t.jsonl";
  s.data.tokenizer = "/d/tok.model";
  s.data.eval_fraction = 0.125;
  s.data.shuffle_seed = 18446744073709551615ull;
  s.train.micro_batch = 3;
  s.train.seq_len = 77;
  s.train.gradient_accumulation_steps = 5;
  s.train.max_steps = 11;
  s.train.max_tokens = 123456789012;
  s.train.compute_dtype = engine::ComputeDtype::kBf16;
  s.train.max_grad_norm = 0.3;
  s.train.seed = 42;
  s.train.nan_policy = engine::NanPolicy::kFail;
  s.train.offload_activations = true;
  s.optimizer.lr = 1e-4;
  s.optimizer.beta1 = 0.8;
  s.optimizer.beta2 = 0.99;
  s.optimizer.eps = 1e-6;
  s.optimizer.weight_decay = 0.1;
  s.optimizer.warmup_steps = 7;
  s.optimizer.schedule = engine::LrScheduleKind::kLinear;
  s.optimizer.min_lr_ratio = 0.1;
  s.eval.every_steps = 9;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 4;
  s.checkpoint.keep_last = 3;
  s.checkpoint.keep_every = 8;
  s.output_dir = "/o/ut";
  s.job_id = "job-000001";  // not stored
  r.priority = -5;
  r.labels = {{"team", "a"}, {"b", "x\ny"}};
  const std::string former =
      "{\"checkpoint\":{\"every_steps\":4,\"keep_every\":8,\"keep_last\":3},\"data\":{"
      "\"eval_fraction\":0.125,\"eval_tokens\":\"/d/eval\",\"shuffle_seed\":18446744073"
      "709551615,\"text\":\"/d/t.jsonl\",\"tokenizer\":\"/d/tok.model\",\"tokens\":\"/d"
      "/tok\"},\"eval\":{\"batches\":2,\"every_steps\":9},\"labels\":{\"b\":\"x\\ny\","
      "\"team\":\"a\"},\"model\":{\"hf_dir\":\"/m/hf\",\"preset\":\"tiny\"},\"name\":\""
      "gold \\\"q\\\" \xc3\xa9\",\"optimizer\":{\"beta1\":0.8,\"beta2\":0.99,\"eps\":1e"
      "-06,\"lr\":0.0001,\"min_lr_ratio\":0.1,\"schedule\":\"linear\",\"warmup_steps\":"
      "7,\"weight_decay\":0.1},\"output_dir\":\"/o/ut\",\"priority\":-5,\"train\":{\"co"
      "mpute_dtype\":\"bf16\",\"gradient_accumulation_steps\":5,\"max_grad_norm\":0.3,"
      "\"max_steps\":11,\"max_tokens\":123456789012,\"micro_batch\":3,\"nan_policy\":\""
      "fail\",\"offload_activations\":true,\"seed\":42,\"seq_len\":77}}";
  EXPECT_EQ(JobRequestToJson(r), former);
  absl::StatusOr<JobRequest> parsed = JobRequestFromJson(former);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->priority, -5);
  EXPECT_EQ(parsed->labels, r.labels);
  parsed->spec.job_id = s.job_id;
  EXPECT_EQ(JobRequestToJson(*parsed), former);
}

TEST(SpecConvertTest, CorruptJsonIsDataLoss) {
  EXPECT_THAT(JobRequestFromJson("{not json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("")));
  EXPECT_THAT(JobRequestFromJson(R"({"train": {"compute_dtype": "fp8"}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("train.compute_dtype")));
}

TEST(ValidateJobRequestTest, AcceptsTheTinyJob) {
  absl::StatusOr<JobRequest> request = JobRequestFromProto(TinySpec());
  ASSERT_THAT(request, IsOk());
  EXPECT_THAT(ValidateJobRequest(*request), IsOk());
}

TEST(ValidateJobRequestTest, PriorityOutOfRangeIsInvalid) {
  JobRequest request;
  request.priority = 5000;
  EXPECT_THAT(ValidateJobRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("priority: must be in [-1000, 1000], got 5000")));
}

TEST(ValidateJobRequestTest, TooManyLabelsIsInvalid) {
  JobRequest request;
  for (int label_idx = 0; label_idx <= kMaxLabels; ++label_idx) {
    request.labels[absl::StrCat("k", label_idx)] = "v";
  }
  EXPECT_THAT(ValidateJobRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels: at most 32")));
}

TEST(ValidateJobRequestTest, BadLabelKeyIsInvalid) {
  JobRequest request;
  request.labels["Team Name"] = "v";
  EXPECT_THAT(ValidateJobRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels: key 'Team Name'")));
}

TEST(ValidateJobRequestTest, LongLabelValueIsInvalid) {
  JobRequest request;
  request.labels["team"] = std::string(300, 'x');
  EXPECT_THAT(ValidateJobRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels.team: value")));
}

TEST(JobStatesFromProtoTest, RejectsUnspecifiedState) {
  google::protobuf::RepeatedField<int> states;
  states.Add(v1::JOB_STATE_UNSPECIFIED);
  EXPECT_THAT(JobStatesFromProto(states), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("states: unknown job state 0")));
}

TEST(CheckpointIdTest, RoundTripsAndRejectsMalformedIds) {
  EXPECT_EQ(CheckpointId("job-000001", 20), "job-000001/step-20");
  auto parsed = ParseCheckpointId("job-000001/step-20");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->first, "job-000001");
  EXPECT_EQ(parsed->second, 20);
  for (const char* bad : {"job-000001", "job-000001/20", "/step-3", "job-1/step-x"}) {
    EXPECT_THAT(ParseCheckpointId(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint_id")))
        << bad;
  }
}

TEST(GrpcStatusTest, KeepsCodeAndMessage) {
  grpc::Status status = ToGrpcStatus(absl::ResourceExhaustedError("too big"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "too big");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

// The fuzz seeds (tests/fuzz/make_corpus.py, an independent encoder of the
// wire format): valid_* convert and pass ValidateJobRequest; invalid_* fail
// to parse or are refused with INVALID_ARGUMENT.
TEST(SpecConvertCorpusTest, SeedsConvertAsTheirNamesSay) {
  const std::string dir = std::string(MEGATRAIN_FUZZ_CORPUS_DIR) + "/jobspec_proto_fuzz";
  const std::vector<std::string> names = megatrain::testing::ListDir(dir);
  ASSERT_FALSE(names.empty()) << dir;
  int valid = 0;
  for (const std::string& name : names) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    v1::JobSpec spec;
    const bool parsed = spec.ParseFromString(bytes);
    absl::Status status = absl::InvalidArgumentError("does not parse");
    if (parsed) {
      absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
      status = request.ok() ? ValidateJobRequest(*request) : request.status();
    }
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_TRUE(parsed) << name;
      EXPECT_THAT(status, IsOk()) << name;
      ++valid;
    } else {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_)) << name;
    }
  }
  EXPECT_GT(valid, 0);
}

// Issue 36: a NUL in any request string is refused at the boundary naming
// the field (it would cut a name or path for every C API below).
TEST(SpecConvertTest, NulInAStringIsInvalidArgumentNamingTheField) {
  v1::JobSpec in = TinySpec();
  in.set_name(std::string("job\0name", 8));
  EXPECT_THAT(JobRequestFromProto(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.name: contains a NUL byte (at byte 3)")));
  v1::GetJobRequest get;
  get.set_job_id(std::string("job-000001\0", 11));
  EXPECT_THAT(CheckRequestBounds(get),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id: contains a NUL")));
}

// JobSpec.memory.nvme_tier (issue 19): parsed, written back, and a bad
// value names the field.
TEST(SpecConvertTest, MemoryNvmeTierRoundTrips) {
  v1::JobSpec in = TinySpec();
  in.mutable_memory()->set_nvme_tier("auto");
  absl::StatusOr<JobRequest> request = JobRequestFromProto(in);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.memory.nvme_tier, engine::NvmeTierMode::kAuto);
  v1::JobSpec out;
  JobRequestToProto(*request, &out);
  EXPECT_EQ(out.memory().nvme_tier(), "auto");
  // The resolved "off" (an auto that fit in host memory) is shown, not "".
  request->spec.memory.nvme_tier = engine::NvmeTierMode::kOff;
  JobRequestToProto(*request, &out);
  EXPECT_EQ(out.memory().nvme_tier(), "off");
  in.mutable_memory()->set_nvme_tier("ssd");
  EXPECT_THAT(JobRequestFromProto(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory.nvme_tier")));
}

// JobSpec.data.packing.document_attention: empty is auto, the spellings
// are parsed once here and written back; a bad one names the field.
TEST(SpecConvertTest, DocumentAttentionRoundTrips) {
  v1::JobSpec in = TinySpec();
  absl::StatusOr<JobRequest> request = JobRequestFromProto(in);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.data.packing.document_attention, engine::DocumentAttention::kAuto);
  in.mutable_data()->mutable_packing()->set_document_attention("isolated");
  request = JobRequestFromProto(in);
  ASSERT_THAT(request, IsOk());
  EXPECT_EQ(request->spec.data.packing.document_attention, engine::DocumentAttention::kIsolated);
  v1::JobSpec out;
  JobRequestToProto(*request, &out);
  EXPECT_EQ(out.data().packing().document_attention(), "isolated");
  in.mutable_data()->mutable_packing()->set_document_attention("cross");
  EXPECT_THAT(JobRequestFromProto(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.packing.document_attention: must be auto, isolated or "
                                 "shared, got 'cross'")));
}

// A value inside `range` and off every default: the next integer above
// the minimum, the middle of a real range.
int64_t InsideInt(engine::IntRange range) { return range.min + 1; }
double InsideReal(engine::RealRange range) { return (range.min + range.max) / 2; }

// Note [Spec field table]: every number row goes from the proto to the
// spec, back to the proto and through the spec's JSON with its value, so
// that a new row is covered without a test of its own.
TEST(SpecFieldTableTest, EveryRowRoundTripsThroughProtoAndJson) {
  v1::JobSpec proto = TinySpec();
  proto.mutable_optimizer()->set_warmup_steps(0);  // within max_steps' row value (1)
#define MEGATRAIN_SET(name, kind, range, json, proto) \
  section->set_##name(Inside##kind(engine::range));
  {
    v1::TrainSpec* section = proto.mutable_train();
    MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    v1::OptimizerSpec* section = proto.mutable_optimizer();
    MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    v1::EvalSpec* section = proto.mutable_eval();
    MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    v1::CheckpointSpec* section = proto.mutable_checkpoint();
    MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_SET)
  }
#undef MEGATRAIN_SET
  const absl::StatusOr<JobRequest> request = JobRequestFromProto(proto);
  ASSERT_THAT(request.status(), IsOk());
  EXPECT_THAT(engine::ValidateJobSpec(request->spec), IsOk());
  v1::JobSpec back;
  JobRequestToProto(*request, &back);
  const absl::StatusOr<engine::JobSpec> read =
      engine::JobSpecFromJson(engine::JobSpecToJson(request->spec));
  ASSERT_THAT(read.status(), IsOk());
#define MEGATRAIN_EXPECT(section, name)                                            \
  EXPECT_EQ(request->spec.section.name, proto.section().name()) << #section #name; \
  EXPECT_EQ(back.section().name(), proto.section().name()) << #section #name;      \
  EXPECT_EQ(read->section.name, request->spec.section.name) << #section #name;
#define MEGATRAIN_NUMBER_ROW(section, name, kind, range) MEGATRAIN_EXPECT(section, name)
  MEGATRAIN_EACH_NUMBER_ROW
#undef MEGATRAIN_NUMBER_ROW
#undef MEGATRAIN_EXPECT
}

// Every keyword of `keywords` goes from the proto (`set` writes the word)
// to the spec (`get` reads the member), back to the same word in the proto
// (`word` reads it) and through the spec's JSON; an unknown word is
// INVALID_ARGUMENT naming `field` and listing the keywords, and an empty
// one keeps the default.
template <typename T, size_t N, typename Set, typename Get, typename Word>
void ExpectEveryKeywordConverts(const engine::Keyword<T> (&keywords)[N], const std::string& field,
                                Set set, Get get, Word word) {
  for (const engine::Keyword<T>& keyword : keywords) {
    v1::JobSpec proto = TinySpec();
    set(proto, keyword.word);
    const absl::StatusOr<JobRequest> request = JobRequestFromProto(proto);
    ASSERT_THAT(request.status(), IsOk()) << field << ": " << keyword.word;
    EXPECT_TRUE(get(request->spec) == keyword.value) << field << ": " << keyword.word;
    v1::JobSpec back;
    JobRequestToProto(*request, &back);
    EXPECT_EQ(word(back), keyword.word) << field;
    const absl::StatusOr<engine::JobSpec> read =
        engine::JobSpecFromJson(engine::JobSpecToJson(request->spec));
    ASSERT_THAT(read.status(), IsOk());
    EXPECT_TRUE(get(*read) == keyword.value) << field << ": " << keyword.word;
  }
  v1::JobSpec proto = TinySpec();
  set(proto, "");
  const absl::StatusOr<JobRequest> empty = JobRequestFromProto(proto);
  ASSERT_THAT(empty.status(), IsOk()) << field;
  EXPECT_TRUE(get(empty->spec) == get(engine::JobSpec())) << field;
  set(proto, "no-such-word");
  EXPECT_THAT(JobRequestFromProto(proto).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(field, ": must be ", engine::KeywordList(keywords),
                                              ", got 'no-such-word'"))));
}

// Note [Spec field table]: each keyword of each keyword row converts both
// ways and through the JSON; an unknown one is refused naming the field.
TEST(SpecFieldTableTest, EveryKeywordOfEveryRowConvertsBothWays) {
#define MEGATRAIN_CONVERTS(section, name, keywords)                                       \
  ExpectEveryKeywordConverts(                                                             \
      engine::keywords, #section "." #name,                                               \
      [](v1::JobSpec& p, const std::string& w) { p.mutable_##section()->set_##name(w); }, \
      [](const engine::JobSpec& s) { return s.section.name; },                            \
      [](const v1::JobSpec& p) { return p.section().name(); });
#define MEGATRAIN_KEYWORD_ROW(section, name, keywords) MEGATRAIN_CONVERTS(section, name, keywords)
  MEGATRAIN_EACH_KEYWORD_ROW
#undef MEGATRAIN_KEYWORD_ROW
#undef MEGATRAIN_CONVERTS
}

}  // namespace
}  // namespace megatrain::server
