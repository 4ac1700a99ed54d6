// Tests of the job-spec library (engine/spec/): validation with one bound per
// field, MaxSteps, and the JSON writer and reader, whose bytes must stay what
// checkpoints (state.json "job_spec_json") and the server's job store already
// hold. Torch-free: built with and without the engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/job_spec_json.h"
#include "engine/spec/keyword.h"
#include "engine/spec/lr_schedule_kind.h"
#include "engine/spec/spec_fields.h"
#include "nlohmann/json.hpp"
#include "tests/testing/spec_rows.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

JobSpec TinyJob() {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.tokens = "/data/train.mtt";
  spec.train.max_steps = 10;
  return spec;
}

// Every field away from its default (the values of the golden text below).
JobSpec EveryFieldSet() {
  JobSpec s;
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
  s.train.compute_dtype = ComputeDtype::kBf16;
  s.train.max_grad_norm = 0.3;
  s.train.seed = 42;
  s.train.nan_policy = NanPolicy::kFail;
  s.train.offload_activations = true;
  s.optimizer.lr = 1e-4;
  s.optimizer.beta1 = 0.8;
  s.optimizer.beta2 = 0.99;
  s.optimizer.eps = 1e-6;
  s.optimizer.weight_decay = 0.1;
  s.optimizer.warmup_steps = 7;
  s.optimizer.schedule = LrScheduleKind::kLinear;
  s.optimizer.min_lr_ratio = 0.1;
  s.eval.every_steps = 9;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 4;
  s.checkpoint.keep_last = 3;
  s.checkpoint.keep_every = 8;
  s.output_dir = "/o/ut";
  s.job_id = "job-000001";
  return s;
}

// Written by the two writers this library replaced (engine/job/
// training_job.cc and server/core/job_request_json.cc, identical but for the
// server's priority and labels) at commit 33c2300, for EveryFieldSet() and
// for a default JobSpec. Checkpoints and job stores hold these bytes.
constexpr char kEveryFieldSetJson[] =
    R"({"checkpoint":{"every_steps":4,"keep_every":8,"keep_last":3},)"
    R"("data":{"eval_fraction":0.125,"eval_tokens":"/d/eval","shuffle_seed":18446744073709551615,)"
    R"("text":"/d/t.jsonl","tokenizer":"/d/tok.model","tokens":"/d/tok"},)"
    R"("eval":{"batches":2,"every_steps":9},"model":{"hf_dir":"/m/hf","preset":"tiny"},)"
    "\"name\":\"gold \\\"q\\\" \xc3\xa9\","
    R"("optimizer":{"beta1":0.8,"beta2":0.99,"eps":1e-06,"lr":0.0001,"min_lr_ratio":0.1,)"
    R"("schedule":"linear","warmup_steps":7,"weight_decay":0.1},"output_dir":"/o/ut",)"
    R"("train":{"compute_dtype":"bf16","gradient_accumulation_steps":5,"max_grad_norm":0.3,)"
    R"("max_steps":11,"max_tokens":123456789012,"micro_batch":3,"nan_policy":"fail",)"
    R"("offload_activations":true,"seed":42,"seq_len":77}})";
constexpr char kDefaultJson[] =
    R"({"checkpoint":{"every_steps":0,"keep_every":0,"keep_last":2},)"
    R"("data":{"eval_fraction":0.0,"eval_tokens":"","shuffle_seed":1234,"text":"",)"
    R"("tokenizer":"","tokens":""},"eval":{"batches":4,"every_steps":0},)"
    R"("model":{"hf_dir":"","preset":""},"name":"",)"
    R"("optimizer":{"beta1":0.9,"beta2":0.95,"eps":1e-08,"lr":0.0003,"min_lr_ratio":0.0,)"
    R"("schedule":"cosine","warmup_steps":0,"weight_decay":0.0},"output_dir":"",)"
    R"("train":{"compute_dtype":"fp32","gradient_accumulation_steps":1,"max_grad_norm":1.0,)"
    R"("max_steps":0,"max_tokens":0,"micro_batch":8,"nan_policy":"skip",)"
    R"("offload_activations":false,"seed":0,"seq_len":128}})";

// Note [Spec field table]: every row's range is checked, naming the field
// and the range, each row's error reported with the others'.
int64_t BelowInt(IntRange range) { return range.min - 1; }
double BelowReal(RealRange range) { return range.min - 1; }

TEST(SpecFieldTableTest, EveryRowBelowItsRangeIsRefusedNamingTheField) {
  JobSpec spec = TinyJob();
#define MEGATRAIN_SET(name, kind, range, json, proto) section.name = Below##kind(range);
  {
    TrainSpec& section = spec.train;
    MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    OptimizerSpec& section = spec.optimizer;
    MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    EvalSpec& section = spec.eval;
    MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_SET)
  }
  {
    CheckpointSpec& section = spec.checkpoint;
    MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_SET)
  }
#undef MEGATRAIN_SET
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
#define MEGATRAIN_EXPECT(section, name) \
  EXPECT_THAT(message, HasSubstr(section #name ": must be in")) << section #name;
#define MEGATRAIN_EXPECT_TRAIN(name, kind, range, json, proto) MEGATRAIN_EXPECT("train.", name)
#define MEGATRAIN_EXPECT_OPTIMIZER(name, kind, range, json, proto) \
  MEGATRAIN_EXPECT("optimizer.", name)
#define MEGATRAIN_EXPECT_EVAL(name, kind, range, json, proto) MEGATRAIN_EXPECT("eval.", name)
#define MEGATRAIN_EXPECT_CHECKPOINT(name, kind, range, json, proto) \
  MEGATRAIN_EXPECT("checkpoint.", name)
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_EXPECT_TRAIN)
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_EXPECT_OPTIMIZER)
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_EXPECT_EVAL)
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_EXPECT_CHECKPOINT)
#undef MEGATRAIN_EXPECT_TRAIN
#undef MEGATRAIN_EXPECT_OPTIMIZER
#undef MEGATRAIN_EXPECT_EVAL
#undef MEGATRAIN_EXPECT_CHECKPOINT
#undef MEGATRAIN_EXPECT
}

// An enum value no keyword stands for (a caller casting an integer).
template <typename Enum>
Enum NoKeyword(Enum) {
  return static_cast<Enum>(99);
}
template <typename Enum>
std::optional<Enum> NoKeyword(std::optional<Enum>) {
  return static_cast<Enum>(99);
}

// Note [Spec field table]: a keyword row's member outside its table is
// refused naming the field.
TEST(SpecFieldTableTest, EveryKeywordRowOutsideItsTableIsRefusedNamingTheField) {
  JobSpec spec = TinyJob();
#define MEGATRAIN_SET(name, keywords, json) section.name = NoKeyword(section.name);
  {
    TrainSpec& section = spec.train;
    MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_SET)
  }
  {
    OptimizerSpec& section = spec.optimizer;
    MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_SET)
  }
  {
    MemorySpec& section = spec.memory;
    MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_SET)
  }
#undef MEGATRAIN_SET
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
#define MEGATRAIN_EXPECT_TRAIN(name, keywords, json) \
  EXPECT_THAT(message, HasSubstr("train." #name ": unknown value 99"));
#define MEGATRAIN_EXPECT_OPTIMIZER(name, keywords, json) \
  EXPECT_THAT(message, HasSubstr("optimizer." #name ": unknown value 99"));
#define MEGATRAIN_EXPECT_MEMORY(name, keywords, json) \
  EXPECT_THAT(message, HasSubstr("memory." #name ": unknown value 99"));
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_EXPECT_TRAIN)
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_EXPECT_OPTIMIZER)
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_EXPECT_MEMORY)
#undef MEGATRAIN_EXPECT_TRAIN
#undef MEGATRAIN_EXPECT_OPTIMIZER
#undef MEGATRAIN_EXPECT_MEMORY
}

// Every keyword of `keywords`, set into a spec by `set`, survives the
// spec's JSON, and the word itself is what the JSON holds under `key`
// when it is written.
template <typename T, size_t N, typename Set, typename Get>
void ExpectEveryKeywordRoundTrips(const Keyword<T> (&keywords)[N], const char* section,
                                  const char* key, Set set, Get get) {
  for (const Keyword<T>& keyword : keywords) {
    JobSpec spec = TinyJob();
    set(spec, keyword.value);
    const nlohmann::json object = JobSpecToJsonObject(spec);
    if (object.contains(section) && object[section].contains(key)) {
      EXPECT_EQ(object[section][key], keyword.word) << section << "." << key;
    }
    const absl::StatusOr<JobSpec> back = JobSpecFromJson(object.dump());
    ASSERT_THAT(back.status(), IsOk()) << keyword.word;
    EXPECT_TRUE(get(*back) == keyword.value) << section << "." << key << ": " << keyword.word;
    EXPECT_THAT(ValidateJobSpec(*back),
                ::testing::Not(StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr(std::string(key) + ": unknown value"))));
  }
  const std::string bad = absl::StrCat(R"({")", section, R"(":{")", key, R"(":"no-such-word"}})");
  EXPECT_THAT(JobSpecFromJson(bad).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat(section, ".", key, ": must be ",
                                              KeywordList(keywords), ", got 'no-such-word'"))));
}

// Note [Spec field table]: each keyword of each keyword row goes through
// the JSON and back; an unknown word is DATA_LOSS naming the field and
// listing the keywords.
TEST(SpecFieldTableTest, EveryKeywordOfEveryRowRoundTripsThroughJson) {
#define MEGATRAIN_KEYWORD_ROW(section, name, keywords)                                  \
  ExpectEveryKeywordRoundTrips(                                                         \
      keywords, #section, #name, [](JobSpec& s, const auto& v) { s.section.name = v; }, \
      [](const JobSpec& s) { return s.section.name; });
  MEGATRAIN_EACH_KEYWORD_ROW
#undef MEGATRAIN_KEYWORD_ROW
}

TEST(JobSpecJsonTest, WriterOutputEqualsTheFormerWriters) {
  EXPECT_EQ(JobSpecToJson(EveryFieldSet()), kEveryFieldSetJson);
  EXPECT_EQ(JobSpecToJson(JobSpec()), kDefaultJson);
}

TEST(JobSpecJsonTest, FormerTextReadsBackToTheSameSpec) {
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(kEveryFieldSetJson);
  ASSERT_THAT(spec.status(), IsOk());
  EXPECT_TRUE(spec->job_id.empty());  // never in the JSON
  spec->job_id = "job-000001";
  EXPECT_EQ(JobSpecToJson(*spec), kEveryFieldSetJson);
  EXPECT_EQ(spec->data.shuffle_seed, 18446744073709551615ull);
  EXPECT_EQ(spec->train.compute_dtype, ComputeDtype::kBf16);
  EXPECT_EQ(spec->train.nan_policy, NanPolicy::kFail);
  EXPECT_TRUE(spec->train.offload_activations);
  EXPECT_EQ(spec->optimizer.schedule, LrScheduleKind::kLinear);
  EXPECT_EQ(spec->checkpoint.keep_every, 8);
}

TEST(JobSpecJsonTest, OlderSpellingsKeepTheirMeaning) {
  // Before train.nan_policy: the bool skip_nonfinite_steps; before
  // train.offload_activations: absent, off.
  absl::StatusOr<JobSpec> fail =
      JobSpecFromJson(R"({"train": {"skip_nonfinite_steps": false, "micro_batch": 4}})");
  ASSERT_THAT(fail.status(), IsOk());
  EXPECT_EQ(fail->train.nan_policy, NanPolicy::kFail);
  EXPECT_FALSE(fail->train.offload_activations);
  EXPECT_EQ(fail->train.micro_batch, 4);
  EXPECT_EQ(fail->train.seq_len, TrainSpec().seq_len);  // missing: default
  absl::StatusOr<JobSpec> skip = JobSpecFromJson(R"({"train": {"skip_nonfinite_steps": true}})");
  ASSERT_THAT(skip.status(), IsOk());
  EXPECT_EQ(skip->train.nan_policy, NanPolicy::kSkip);
}

TEST(JobSpecJsonTest, CorruptTextIsDataLossNamingTheProblem) {
  EXPECT_THAT(JobSpecFromJson("{not json"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job spec JSON: does not parse")));
  EXPECT_THAT(JobSpecFromJson("[1, 2]"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not an object")));
  EXPECT_THAT(JobSpecFromJson(R"({"train": {"compute_dtype": "fp8"}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("train.compute_dtype")));
  EXPECT_THAT(JobSpecFromJson(R"({"train": {"nan_policy": "retry"}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("train.nan_policy")));
  EXPECT_THAT(JobSpecFromJson(R"({"train": {"micro_batch": "eight"}})"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job spec JSON: ")));
}

// memory.weight_stream: every mode's spelling reads back to itself; the
// default (bf16) is not written; an unknown one is DATA_LOSS naming the
// field and the modes.
TEST(JobSpecJsonTest, WeightStreamRoundTripsEveryMode) {
  for (const WeightStream mode :
       {WeightStream::kBf16, WeightStream::kFp32, WeightStream::kHostCast}) {
    JobSpec spec = JobSpec();
    spec.memory.weight_stream = mode;
    const std::string text = JobSpecToJson(spec);
    EXPECT_EQ(text.find("weight_stream") == std::string::npos, mode == WeightStream::kBf16) << text;
    absl::StatusOr<JobSpec> back = JobSpecFromJson(text);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->memory.weight_stream, mode) << WeightStreamName(mode);
  }
  EXPECT_EQ(ParseWeightStream("host_cast").value(), WeightStream::kHostCast);
  EXPECT_THAT(JobSpecFromJson(R"({"memory": {"weight_stream": "fp16"}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("memory.weight_stream: must be bf16, fp32 or host_cast, got "
                                 "'fp16'")));
}

TEST(JobSpecJsonTest, ObjectFormTakesExtraKeysOfTheCaller) {
  nlohmann::json j = JobSpecToJsonObject(TinyJob());
  j["priority"] = 5;
  JobSpec spec;
  ASSERT_THAT(JobSpecFromJsonObject(j, &spec), IsOk());
  EXPECT_EQ(JobSpecToJson(spec), JobSpecToJson(TinyJob()));
}

TEST(ValidateJobSpecTest, AcceptsTheTinyJob) { EXPECT_THAT(ValidateJobSpec(TinyJob()), IsOk()); }

TEST(ValidateJobSpecTest, MicroBatchOutsideItsRangeNamesTheBound) {
  JobSpec spec = TinyJob();
  spec.train.micro_batch = 0;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.micro_batch: must be in [1, 4096], got 0")));
  spec.train.micro_batch = kMicroBatchRange.max + 1;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 4097")));
  spec.train.micro_batch = kMicroBatchRange.max;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(ValidateJobSpecTest, RealBoundsRefuseNanAndNameAnOpenEnd) {
  JobSpec spec = TinyJob();
  spec.optimizer.lr = 0;
  EXPECT_THAT(ValidateJobSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("optimizer.lr: must be in (0, 1], got 0")));
  spec = TinyJob();
  spec.data.eval_fraction = std::nan("");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.eval_fraction: must be in [0, 0.5]")));
}

TEST(ValidateJobSpecTest, WarmupIsBoundedByTheRunsSteps) {
  JobSpec spec = TinyJob();
  spec.optimizer.warmup_steps = 11;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("optimizer.warmup_steps: must be in [0, 10], got 11")));
}

// All errors at once (SpecErrors): each named by its field, in the order of
// the spec, joined by "; ".
TEST(ValidateJobSpecTest, EveryErrorIsReportedAtOnce) {
  JobSpec spec = TinyJob();
  spec.data.text = "/data/corpus.txt";  // with data.tokens: one too many
  spec.data.tokenizer = "/data/spm.model";
  spec.train.micro_batch = 0;
  spec.train.seq_len = 0;
  spec.optimizer.lr = 2;
  spec.eval.batches = 0;
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               HasSubstr("data: set exactly one of data.tokens and data.text; "
                                         "train.micro_batch: must be in [1, 4096], got 0; "
                                         "train.seq_len: must be in")));
  EXPECT_THAT(status.message(), HasSubstr("; optimizer.lr: must be in (0, 1], got 2"));
  EXPECT_THAT(status.message(), HasSubstr("; eval.batches: must be in"));
}

// A bad batch shape leaves the run's length unknown: warmup_steps is not
// checked against it (no second, misleading error).
TEST(ValidateJobSpecTest, WarmupIsNotCheckedAgainstAnUnknownLength) {
  JobSpec spec = TinyJob();
  spec.train.micro_batch = 0;
  spec.optimizer.warmup_steps = 5;
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.micro_batch")));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("warmup_steps")));
}

TEST(SpecErrorsTest, OneErrorKeepsItsCodeAndMessageAndNoneIsOk) {
  SpecErrors errors;
  EXPECT_TRUE(errors.empty());
  EXPECT_THAT(errors.ToStatus(), IsOk());
  errors.Add(absl::OkStatus());
  errors.Add(absl::UnimplementedError("model.hf_dir: architecture X"));
  EXPECT_THAT(errors.ToStatus(),
              StatusIs(absl::StatusCode::kUnimplemented, "model.hf_dir: architecture X"));
  errors.Add(absl::InvalidArgumentError("train.seq_len: bad"));
  EXPECT_THAT(errors.ToStatus(), StatusIs(absl::StatusCode::kUnimplemented,
                                          "model.hf_dir: architecture X; train.seq_len: bad"));
}

TEST(ValidateJobSpecTest, UnknownScheduleAndPresetAreRefused) {
  JobSpec spec = TinyJob();
  spec.optimizer.schedule = static_cast<LrScheduleKind>(3);
  EXPECT_THAT(ValidateJobSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("optimizer.schedule: unknown value 3")));
  spec = TinyJob();
  spec.model.preset = "no-such-model";
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no-such-model")));
}

TEST(ValidateJobSpecTest, DevicesAreBoundedAndDivideTheAccumulation) {
  JobSpec spec = TinyJob();
  spec.train.devices = 65;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.devices: must be in [0, 64], got 65")));
  spec.train.devices = 2;
  spec.train.gradient_accumulation_steps = 3;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.devices: 2 devices need "
                                 "train.gradient_accumulation_steps to be a multiple of 2")));
  spec.train.gradient_accumulation_steps = 4;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  // The gradient ring (clipping off) with several devices: each rank's
  // ring lands its shard (Note [Ring shards]); with clipping still refused.
  spec.memory.gradient_landing = GradientLanding::kRing;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("memory.gradient_landing: ring needs train.max_grad_norm 0")));
  spec.train.max_grad_norm = 0;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  spec.train.devices = 1;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  spec.memory.gradient_landing = GradientLanding::kAuto;
  spec.train.devices = kAllDevices;  // resolved by the daemon at submission
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(JobSpecJsonTest, DevicesRoundTripAndDefaultToOne) {
  JobSpec spec = TinyJob();
  EXPECT_EQ(JobSpecToJson(spec).find("devices"), std::string::npos);
  spec.train.devices = 4;
  auto back = JobSpecFromJson(JobSpecToJson(spec));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->train.devices, 4);
  auto old = JobSpecFromJson(JobSpecToJson(TinyJob()));
  ASSERT_THAT(old, IsOk());
  EXPECT_EQ(old->train.devices, 1);
}

// data.packing.document_attention: written only when not auto (a default
// spec keeps its bytes), read back, auto when absent; an unknown spelling
// in the store is DATA_LOSS, an out-of-range value at validation
// INVALID_ARGUMENT, both naming the field.
TEST(JobSpecJsonTest, DocumentAttentionRoundTripsAndDefaultsToAuto) {
  JobSpec spec = TinyJob();
  EXPECT_EQ(JobSpecToJson(spec).find("packing"), std::string::npos);
  spec.data.packing.document_attention = DocumentAttention::kIsolated;
  EXPECT_NE(JobSpecToJson(spec).find(R"("packing":{"document_attention":"isolated"})"),
            std::string::npos);
  absl::StatusOr<JobSpec> back = JobSpecFromJson(JobSpecToJson(spec));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->data.packing.document_attention, DocumentAttention::kIsolated);
  absl::StatusOr<JobSpec> old = JobSpecFromJson(JobSpecToJson(TinyJob()));
  ASSERT_THAT(old, IsOk());
  EXPECT_EQ(old->data.packing.document_attention, DocumentAttention::kAuto);
  EXPECT_THAT(JobSpecFromJson(R"({"data": {"packing": {"document_attention": "sometimes"}}})"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("data.packing.document_attention: must be auto, isolated or "
                                 "shared, got 'sometimes'")));
  spec.data.packing.document_attention = static_cast<DocumentAttention>(7);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.packing.document_attention: unknown value 7")));
}

// train.resident_layers: auto (-1) or a count in [0, 4096] (the model's
// layers bound it at submission); none resident with the NVMe tier or
// data parallelism.
TEST(ValidateJobSpecTest, ResidentLayersAreBoundedAndNeedStateOnTheDevice) {
  JobSpec spec = TinyJob();
  EXPECT_EQ(spec.train.resident_layers, kAutoResidentLayers);
  for (const int64_t bad : {int64_t{-2}, int64_t{4097}}) {
    spec.train.resident_layers = bad;
    EXPECT_THAT(ValidateJobSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("train.resident_layers: must be auto or in [0, "
                                                "4096], got ",
                                                bad))));
  }
  spec.train.resident_layers = 3;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  spec.memory.nvme_tier = NvmeTierMode::kAuto;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.resident_layers: 3 resident layers need "
                                 "memory.nvme_tier: off (the tier keeps the AdamW moments in "
                                 "files), got auto")));
  spec.memory.nvme_tier = NvmeTierMode::kOff;
  spec.train.devices = 2;
  spec.train.gradient_accumulation_steps = 2;
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.resident_layers: must be 0 or auto with train.devices "
                                 "> 1")));
  // None resident is allowed everywhere.
  spec.train.resident_layers = 0;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  spec.train.devices = 1;
  spec.memory.nvme_tier = NvmeTierMode::kMoments;
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(JobSpecJsonTest, ResidentLayersRoundTripAndDefaultToAuto) {
  JobSpec spec = TinyJob();
  EXPECT_EQ(JobSpecToJson(spec).find("resident_layers"), std::string::npos);
  for (const int64_t layers : {int64_t{0}, int64_t{7}}) {
    spec.train.resident_layers = layers;
    EXPECT_THAT(JobSpecToJson(spec), HasSubstr(absl::StrCat("\"resident_layers\":", layers)));
    auto back = JobSpecFromJson(JobSpecToJson(spec));
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->train.resident_layers, layers);
  }
  // Written before the field existed: auto.
  auto old = JobSpecFromJson(JobSpecToJson(TinyJob()));
  ASSERT_THAT(old, IsOk());
  EXPECT_EQ(old->train.resident_layers, kAutoResidentLayers);
}

TEST(MaxStepsTest, MaxStepsWinsElseTokensRoundUpToWholeSteps) {
  JobSpec spec = TinyJob();
  EXPECT_EQ(MaxSteps(spec), 10);
  spec.train.max_steps = 0;
  spec.train.micro_batch = 2;
  spec.train.seq_len = 8;
  spec.train.gradient_accumulation_steps = 3;  // 48 tokens per step
  spec.train.max_tokens = 96;
  EXPECT_EQ(MaxSteps(spec), 2);
  spec.train.max_tokens = 97;
  EXPECT_EQ(MaxSteps(spec), 3);
}

TEST(MaxStepsTest, NothingToRunOrABadShapeIsZero) {
  JobSpec spec = TinyJob();
  spec.train.max_steps = 0;
  EXPECT_EQ(MaxSteps(spec), 0);  // neither max_steps nor max_tokens
  spec.train.max_tokens = 100;
  spec.train.micro_batch = 0;
  EXPECT_EQ(MaxSteps(spec), 0);
  spec.train.micro_batch = int64_t{1} << 40;
  spec.train.seq_len = int64_t{1} << 30;  // the product overflows int64
  EXPECT_EQ(MaxSteps(spec), 0);
}

TEST(LrScheduleKindTest, NamesParseBack) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant}) {
    absl::StatusOr<LrScheduleKind> parsed = ParseLrScheduleKind(LrScheduleKindName(kind));
    ASSERT_THAT(parsed.status(), IsOk());
    EXPECT_EQ(*parsed, kind);
  }
}

// The schedule's words are parsed once, at the edges (step_schedule.h):
// the spec's JSON reader turns them into the enums and back, and refuses an
// unknown one as a corrupt store (DATA_LOSS naming the field).
TEST(JobSpecJsonTest, ScheduleWordsReadIntoTheEnums) {
  JobSpec s = TinyJob();
  s.train.schedule = StepSchedule::kLayerMajor;
  s.train.wave = 3;
  s.train.activations = ActivationPlacement::kHost;
  s.train.cuda_graphs = CudaGraphs::kOn;
  s.train.fused_kernels = FusedKernels::kOff;
  s.train.activation_checkpointing = ActivationCheckpointing::kAll;
  const std::string text = JobSpecToJson(s);
  EXPECT_THAT(text, HasSubstr(R"("schedule":"layer-major")"));
  EXPECT_THAT(text, HasSubstr(R"("cuda_graphs":"on")"));
  absl::StatusOr<JobSpec> back = JobSpecFromJson(text);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->train.schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(back->train.wave, 3);
  EXPECT_EQ(back->train.activations, ActivationPlacement::kHost);
  EXPECT_EQ(back->train.cuda_graphs, CudaGraphs::kOn);
  EXPECT_EQ(back->train.fused_kernels, FusedKernels::kOff);
  EXPECT_THAT(text, HasSubstr(R"("activation_checkpointing":"all")"));
  EXPECT_EQ(back->train.activation_checkpointing, ActivationCheckpointing::kAll);
  // Absent words are auto.
  absl::StatusOr<JobSpec> plain = JobSpecFromJson(JobSpecToJson(TinyJob()));
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_FALSE(plain->train.schedule.has_value());
  EXPECT_EQ(plain->train.activations, ActivationPlacement::kAuto);
  EXPECT_EQ(plain->train.cuda_graphs, CudaGraphs::kAuto);
  EXPECT_EQ(plain->train.fused_kernels, FusedKernels::kAuto);
  EXPECT_EQ(plain->train.activation_checkpointing, ActivationCheckpointing::kAuto);
  EXPECT_THAT(JobSpecFromJson(R"({"train":{"activation_checkpointing":"none"}})").status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("train.activation_checkpointing: must be auto or all, got "
                                 "'none'")));
  EXPECT_THAT(JobSpecFromJson(R"({"train":{"schedule":"layer_major"}})").status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("train.schedule: must be auto, micro-batch-major or "
                                 "layer-major, got 'layer_major'")));
  EXPECT_THAT(JobSpecFromJson(R"({"train":{"cuda_graphs":"yes"}})").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("train.cuda_graphs")));
  EXPECT_THAT(
      JobSpecFromJson(R"({"optimizer":{"schedule":"step"}})").status(),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("optimizer.schedule: must be cosine, linear or constant, got 'step'")));
}

// The words' parsers name the field and quote the value (at most 32 bytes
// of it: the value may be as long as the proto allows).
TEST(StepScheduleTest, ParsersNameTheFieldAndTheValue) {
  EXPECT_THAT(ParseStepSchedule("layer_major", "train.schedule").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.schedule: must be auto, micro-batch-major or "
                                 "layer-major, got 'layer_major'")));
  EXPECT_THAT(ParseActivationPlacement("gpu", "train.activations").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.activations: must be auto, device or host, got 'gpu'")));
  EXPECT_THAT(ParseCudaGraphs("yes", "train.cuda_graphs").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.cuda_graphs: must be auto, off or on, got 'yes'")));
  EXPECT_THAT(ParseCudaGraphs(std::string(1000, 'x'), "train.cuda_graphs").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("got '" + std::string(32, 'x') + "...'")));
  absl::StatusOr<CudaGraphs> off = ParseCudaGraphs("off", "train.cuda_graphs");
  ASSERT_THAT(off.status(), IsOk());
  EXPECT_EQ(CudaGraphsOption(*off), 0);
  EXPECT_EQ(CudaGraphsFromOption(CudaGraphsOption(CudaGraphs::kOn)), CudaGraphs::kOn);
  EXPECT_STREQ(StepScheduleRequestName(std::nullopt), "auto");
  EXPECT_TRUE(WaveContradictsSchedule(StepSchedule::kMicroBatchMajor, 2));
  EXPECT_FALSE(WaveContradictsSchedule(std::nullopt, 2));
  EXPECT_EQ(RequestedActivations(true, ActivationPlacement::kAuto), ActivationPlacement::kHost);
}

}  // namespace
}  // namespace megatrain::engine
