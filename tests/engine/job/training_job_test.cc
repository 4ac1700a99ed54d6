// TrainingJob: validation of job specs, a job trained to completion with
// checkpoints and eval, suspend + resume continuing exactly, and cancel.
// Faults: a non-finite step skipped or failing per train.nan_policy (through
// the MEGATRAIN_DEBUG_POISON_STEP knob), a model that only yields NaN, a
// full disk while checkpointing (a real ENOSPC on a small tmpfs, as root),
// and the device out-of-memory message.
#include "engine/job/training_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <chrono>

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/text_corpus.h"
#include "engine/runtime/device_info.h"
#include "engine/store/host_store.h"
#include "engine/model/param_layout.h"
#include "engine/data/token_shard.h"
#include "tests/testing/pattern_dataset.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tmpfs.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 40 documents drawn from 4 repeated patterns, so the model can learn.
std::string WriteDataset() { return testing::WritePatternDataset(); }

JobSpec TinySpec(const std::string& tokens, const std::string& output_dir) {
  JobSpec s;
  s.name = "test";
  s.model.preset = "tiny";
  s.data.tokens = tokens;
  s.data.eval_fraction = 0.1;
  s.train.micro_batch = 2;
  s.train.seq_len = 16;
  s.train.max_steps = 8;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.eval.every_steps = 4;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 2;
  s.checkpoint.keep_last = 2;
  s.output_dir = output_dir;
  return s;
}

// Records what the job reports; can ask for a stop at a given step.
class Recorder : public JobObserver {
 public:
  void OnStep(const StepReport& r) override {
    reports.push_back(r);
    if (r.skipped) return;
    losses.push_back(r.loss);
    if (job != nullptr && r.step == stop_at) job->RequestStop(stop_kind);
  }
  void OnEval(int64_t step, double loss) override { evals.push_back(loss); }
  void OnCheckpoint(int64_t step, const std::string& dir, double) override {
    checkpoint_steps.push_back(step);
  }
  std::vector<StepReport> reports;    // every step, skipped ones too
  std::vector<double> losses, evals;  // losses of applied steps
  std::vector<int64_t> checkpoint_steps;
  TrainingJob* job = nullptr;
  int64_t stop_at = -1;
  TrainingJob::StopKind stop_kind = TrainingJob::StopKind::kSuspend;
};

TEST(ValidateJobSpecTest, NamesTheBadField) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.train.micro_batch = 0;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.micro_batch: must be in [1, 4096], got 0")));
  s = TinySpec("x", "/tmp/out");
  s.model.hf_dir = "/models/x";
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("exactly one of model.preset")));
  s = TinySpec("x", "/tmp/out");
  s.model.preset = "gpt-5";
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.preset")));
  s = TinySpec("x", "/tmp/out");
  s.optimizer.schedule = static_cast<LrScheduleKind>(7);
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("optimizer.schedule: unknown value 7")));
  s = TinySpec("x", "/tmp/out");
  s.optimizer.warmup_steps = 100;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.warmup_steps")));
  s = TinySpec("x", "/tmp/out");
  s.data.text = "corpus.txt";
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data")));
  s = TinySpec("x", "/tmp/out");
  s.train.max_steps = 0;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.max_steps")));
  s = TinySpec("x", "/tmp/out");
  s.train.nan_policy = static_cast<NanPolicy>(7);
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("train.nan_policy: unknown value 7")));
  EXPECT_THAT(ValidateJobSpec(TinySpec("x", "/tmp/out")), IsOk());
}

TEST(NanPolicyTest, ParsesItsOwnNames) {
  for (NanPolicy policy : {NanPolicy::kSkip, NanPolicy::kFail}) {
    auto parsed = ParseNanPolicy(NanPolicyName(policy));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, policy);
  }
  EXPECT_THAT(ParseNanPolicy("retry"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.nan_policy: must be skip or fail, got 'retry'")));
}

TEST(EstimateFootprintTest, CountsBytesPerParameter) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-8b";
  s.train.compute_dtype = ComputeDtype::kBf16;
  auto f = EstimateFootprint(s);
  ASSERT_THAT(f, IsOk());
  // 4 (master) + 4 (grad) + 8 (AdamW moments) + 2 (bf16 copy) bytes/param,
  // plus alignment padding and staging (< 3%: the executor's memory plan
  // counts the two fp32 gradient staging buffers of the largest block,
  // 2 x 4 x 525 M bytes for llama-8b's head, Note [Executor memory plan]).
  EXPECT_GT(f->host_total_bytes, 18 * f->params);
  EXPECT_LT(f->host_total_bytes, 18.6 * f->params);
}

// The footprint plans an untied table resident on the GPU (its 16 bytes
// per parameter in device_resident_bytes): then no lookahead buffers
// (Note [Embedding lookahead]: a host-side update only), no row staging,
// and with the gradient ring no host gradient for it.
TEST(EstimateFootprintTest, PlansNoHostBuffersForTheResidentEmbedding) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-1b";  // untied
  s.train.micro_batch = 8;
  s.train.seq_len = 2048;
  s.train.max_grad_norm = 0;
  s.memory.gradient_landing = GradientLanding::kRing;
  auto f = EstimateFootprint(s);
  ASSERT_THAT(f, IsOk());
  const int64_t table = int64_t{128256} * 2048;
  EXPECT_GE(f->device_resident_bytes, 16 * table);
  EXPECT_EQ(f->embedding_lookahead_bytes, 0);
  EXPECT_EQ(f->host.grad, 0);
  EXPECT_EQ(f->host_total_bytes, f->host.Total());
}

// What the auto settings keep on a GPU: two resident decoder layers (16 B
// of fp32 state + 2 B bf16 per parameter), the untied embedding (16 B per
// parameter) and, with gradient accumulation, the streamed blocks' fp32
// gradients (4 B per parameter).
TEST(EstimateFootprintTest, CountsTheResidentDeviceState) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-1b";  // untied, 16 layers of 60,821,504 parameters
  s.train.compute_dtype = ComputeDtype::kBf16;
  auto one = EstimateFootprint(s);
  ASSERT_THAT(one, IsOk());
  const int64_t layer = 60821504, table = int64_t{128256} * 2048;
  EXPECT_EQ(one->device_resident_bytes, 2 * layer * 18 + table * 16);
  s.train.gradient_accumulation_steps = 4;
  s.train.schedule = StepSchedule::kMicroBatchMajor;
  auto four = EstimateFootprint(s);
  ASSERT_THAT(four, IsOk());
  // 14 streamed layers and the head (final norm + lm_head).
  EXPECT_EQ(four->device_resident_bytes - one->device_resident_bytes,
            4 * (14 * layer + 2048 + table));
  EXPECT_EQ(four->device_estimate_bytes - one->device_estimate_bytes,
            four->device_resident_bytes - one->device_resident_bytes);
  // Layer-major (auto's choice with accumulation on a GPU) keeps the
  // saved inputs of all 4 micro-batches: 3 x 16 more [2, 16, 2048] fp32.
  s.train.schedule = std::nullopt;  // auto
  auto layer_major = EstimateFootprint(s);
  ASSERT_THAT(layer_major, IsOk());
  EXPECT_EQ(layer_major->device_estimate_bytes - four->device_estimate_bytes,
            3 * 16 * 2 * 16 * 2048 * 4);
}

// train.resident_layers replaces auto's count in the device estimate
// (18 bytes per parameter of a resident layer under bf16).
TEST(EstimateFootprintTest, CountsTheResidentLayersAsked) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-1b";
  s.train.compute_dtype = ComputeDtype::kBf16;
  const int64_t layer = 60821504, table = int64_t{128256} * 2048;
  for (const int64_t layers : {int64_t{0}, int64_t{5}, int64_t{16}}) {
    s.train.resident_layers = layers;
    auto f = EstimateFootprint(s);
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->device_resident_bytes, layers * layer * 18 + table * 16) << layers;
  }
}

TEST(EstimateFootprintTest, ActivationOffloadAddsItsPinnedBuffers) {
  // The long-context case: llama-1b, one sequence of 262144 tokens.
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-1b";
  s.train.micro_batch = 1;
  s.train.seq_len = 262144;
  s.train.compute_dtype = ComputeDtype::kBf16;
  auto without = EstimateFootprint(s);
  ASSERT_THAT(without, IsOk());
  EXPECT_EQ(without->activation_offload_bytes, 0);
  s.train.offload_activations = true;
  auto with = EstimateFootprint(s);
  ASSERT_THAT(with, IsOk());
  // (L-1) x B x T x C x 4 bytes: 15 x 1 x 262144 x 2048 x 4 = 30 GiB.
  const int64_t offload = int64_t{15} * 262144 * 2048 * 4;
  EXPECT_EQ(with->activation_offload_bytes, offload);
  EXPECT_EQ(with->host.staging, without->host.staging + offload);
  EXPECT_EQ(with->host_total_bytes, without->host_total_bytes + offload);
  // On the device 3 saved inputs (the last layer's and the ring of two)
  // remain of 16.
  EXPECT_EQ(without->device_estimate_bytes - with->device_estimate_bytes,
            int64_t{13} * 262144 * 2048 * 4);
}

TEST(JobSpecToJsonTest, RecordsOffloadActivations) {
  JobSpec s = TinySpec("x", "/tmp/out");
  EXPECT_THAT(JobSpecToJson(s), HasSubstr("\"offload_activations\":false"));
  s.train.offload_activations = true;
  EXPECT_THAT(JobSpecToJson(s), HasSubstr("\"offload_activations\":true"));
}

TEST(TrainingJobTest, TrainsToCompletionWithCheckpointsAndEval) {
  const std::string out = testing::MakeTempDir("job");
  auto job = TrainingJob::Create(TinySpec(WriteDataset(), out), "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
  ASSERT_EQ(rec.losses.size(), 8u);
  EXPECT_LT(rec.losses.back(), rec.losses.front());
  EXPECT_EQ(rec.evals.size(), 2u);  // steps 4 and 8
  EXPECT_EQ(rec.checkpoint_steps, (std::vector<int64_t>{2, 4, 6, 8}));
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);  // keep_last 2
  EXPECT_EQ((*listed)[1].step, 8);
}

// Issue 20, Note [Long conversations]: SFT shards from `megatrain tokenize`
// with a long-document rule; the job's data description (an event in the
// daemon) counts what the rule truncated and what is still longer than
// seq_len.
TEST(TrainingJobTest, DataDescriptionCountsLongConversations) {
  const std::string dir = testing::MakeTempDir("sft");
  {
    std::ofstream jsonl(dir + "/sft.jsonl");
    const auto line = [&jsonl](int tokens, int first) {
      jsonl << "{\"input_ids\": [";
      for (int i = 0; i < tokens; ++i) jsonl << (i ? ", " : "") << 3 + (first + i) % 500;
      jsonl << "], \"loss_mask\": [";
      for (int i = 0; i < tokens; ++i) jsonl << (i ? ", " : "") << (i >= tokens / 2 ? 1 : 0);
      jsonl << "]}\n";
    };
    for (int d = 0; d < 30; ++d) line(12, d);  // fit seq_len 16
    for (int d = 0; d < 5; ++d) line(18, d);   // longer than 16, within the rule's 20
    for (int d = 0; d < 4; ++d) line(30, d);   // truncated to 20 by the rule
  }
  TokenizeOptions tokenize;
  tokenize.input_paths = {dir + "/sft.jsonl"};
  tokenize.format = CorpusFormat::kSftJsonl;
  tokenize.vocab_size = 512;
  tokenize.output_dir = dir + "/shards";
  tokenize.max_document_tokens = 20;
  tokenize.long_documents = LongDocumentRule::kTruncate;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(tokenize);
  ASSERT_THAT(report, IsOk());
  ASSERT_EQ(report->truncated_documents, 4u);

  JobSpec spec = TinySpec(dir + "/shards", testing::MakeTempDir("job"));
  spec.data.eval_fraction = 0;
  spec.eval.every_steps = 0;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());

  EXPECT_EQ((*job)->data_description(),
            "data: 39 training documents with loss masks, 9 longer than train.seq_len 16 "
            "(trained across windows); megatrain tokenize --max_document_tokens 20 "
            "--long_documents truncate: 4 truncated, 0 dropped; packed documents attend only "
            "to themselves (data.packing.document_attention: auto)");
  // Unmasked data without a tokenize report: nothing to say.
  auto plain = TrainingJob::Create(TinySpec(WriteDataset(), testing::MakeTempDir("job")), "cpu",
                                   std::nullopt);
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ((*plain)->data_description(), "");
}

// Issue 14: a data.text job writes its shards below output_dir through
// directory descriptors; a link swapped in at output_dir/data fails the job
// and nothing is written through it.
TEST(TrainingJobTest, TextShardsNeverGoThroughALinkBelowOutputDir) {
  const std::string dir = testing::MakeTempDir("text_job");
  const std::string outside = testing::MakeTempDir("text_job");
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int d = 0; d < 40; ++d) {
      corpus << "the cat sat on the mat " << d % 4 << " and the dog ran far away\n\n";
    }
  }
  JobSpec spec = TinySpec("", dir + "/out");
  spec.data.text = dir + "/corpus.txt";
  spec.data.tokenizer = "examples/data/tiny-spm.model";  // ctest runs in the source tree
  std::filesystem::create_directories(dir + "/out");
  std::filesystem::create_directory_symlink(outside, dir + "/out/data");

  EXPECT_THAT(TrainingJob::Create(spec, "cpu", std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("data.text"), HasSubstr("symbolic link"))));
  EXPECT_THAT(testing::ListDir(outside), ::testing::IsEmpty());

  std::filesystem::remove(dir + "/out/data");
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  EXPECT_THAT(testing::ListDir(dir + "/out/data"), ElementsAre("eval", "tokenize.json", "train"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/data/train/train-00000.mtt"));
}

TEST(TrainingJobTest, ResumeRefusesACheckpointOfAnotherJob) {
  const std::string data = WriteDataset();
  const std::string out = testing::MakeTempDir("owned");
  JobSpec spec = TinySpec(data, out);
  spec.job_id = "job-000001";
  {
    auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    Recorder rec;
    rec.job = job->get();
    rec.stop_at = 2;
    ASSERT_THAT((*job)->Run(&rec), IsOk());
  }
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  const std::string dir = listed->back().dir;
  absl::StatusOr<CheckpointInfo> verified = VerifyCheckpoint(dir, /*check_data=*/false);
  ASSERT_THAT(verified, IsOk());
  EXPECT_EQ(verified->job_id, "job-000001");

  JobSpec other = TinySpec(data, testing::MakeTempDir("intruder"));
  other.job_id = "job-000002";
  EXPECT_THAT(
      TrainingJob::Create(other, "cpu", dir),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("belongs to job job-000001"), HasSubstr("not to job job-000002"))));
  // Its own job and a standalone run (no id) may resume from it.
  EXPECT_THAT(TrainingJob::Create(spec, "cpu", dir), IsOk());
  EXPECT_THAT(TrainingJob::Create(TinySpec(data, out), "cpu", dir), IsOk());
}

TEST(TrainingJobTest, SuspendThenResumeContinuesExactly) {
  const std::string data = WriteDataset();
  Recorder straight;
  {
    auto job =
        TrainingJob::Create(TinySpec(data, testing::MakeTempDir("straight")), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(&straight), IsOk());
  }
  const std::string out = testing::MakeTempDir("suspended");
  Recorder first;
  {
    auto job = TrainingJob::Create(TinySpec(data, out), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    first.job = job->get();
    first.stop_at = 3;  // not a checkpoint step: suspend writes one
    auto outcome = (*job)->Run(&first);
    ASSERT_THAT(outcome, IsOk());
    EXPECT_EQ(*outcome, JobOutcome::kSuspended);
  }
  ASSERT_EQ(first.losses.size(), 3u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  EXPECT_EQ(listed->back().step, 3);
  Recorder second;
  auto job = TrainingJob::Create(TinySpec(data, out), "cpu", listed->back().dir);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->step(), 3);
  ASSERT_THAT((*job)->Run(&second), IsOk());
  ASSERT_EQ(second.losses.size(), 5u);
  // Same weights, optimizer state, schedule and data cursor: the losses of
  // steps 4..8 are bit-identical to the uninterrupted run's.
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << i;
}

// model.init_from. The data is one 31-token document, so with seq_len 16
// and micro_batch 2 every micro-batch is the same (Note [Packing rule]: the
// stream repeats every 32 tokens, two windows) and a step's loss depends on the weights and AdamW
// state only, not on where the data cursor stands. Losses are compared bit for bit: the same
// weights, moments, step count and batch on the CPU give the same bits.
JobSpec OneWindowSpec(const std::string& tokens, const std::string& output_dir) {
  JobSpec s = TinySpec(tokens, output_dir);
  s.data.eval_fraction = 0;
  s.eval.every_steps = 0;
  s.train.max_steps = 6;
  s.checkpoint.keep_last = 3;
  return s;
}

std::string WriteOneWindowDataset() {
  testing::PatternDataset d;
  d.documents = 1;
  d.pattern_length = 31;  // + EOS = 2 x seq_len = one micro-batch
  return testing::WritePatternDataset(d);
}

// The original job: 6 steps straight, checkpoints at 2, 4 and 6; returns
// the directory of step 4.
std::string RunOriginal(const std::string& data, Recorder* straight) {
  const std::string out = testing::MakeTempDir("original");
  auto job = TrainingJob::Create(OneWindowSpec(data, out), "cpu", std::nullopt);
  EXPECT_THAT(job, IsOk());
  if (!job.ok()) return "";
  EXPECT_THAT((*job)->Run(straight), IsOk());
  return (fs::path(out) / "checkpoints" / CheckpointDirName(4)).string();
}

TEST(TrainingJobInitFromTest, FreshOptimizerStartsFromTheCheckpointWeights) {
  const std::string data = WriteOneWindowDataset();
  Recorder straight;
  const std::string step4 = RunOriginal(data, &straight);
  ASSERT_EQ(straight.losses.size(), 6u);
  JobSpec spec = OneWindowSpec(data, testing::MakeTempDir("fresh"));
  spec.model.init_from = {.checkpoint = "job-000001/step-4", .checkpoint_dir = step4};
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->step(), 0);  // a fresh schedule
  Recorder rec;
  ASSERT_THAT((*job)->Run(&rec), IsOk());
  ASSERT_EQ(rec.losses.size(), 6u);
  // The first loss is computed with the weights before any update: the
  // checkpoint's weights give step 5's loss of the original, bit for bit.
  EXPECT_EQ(rec.losses[0], straight.losses[4]);
  // Then zero moments and warm-up: not the original's step 6.
  EXPECT_NE(rec.losses[1], straight.losses[5]);
}

TEST(TrainingJobInitFromTest, RestoredOptimizerContinuesAsTheOriginalJob) {
  const std::string data = WriteOneWindowDataset();
  Recorder straight;
  const std::string step4 = RunOriginal(data, &straight);
  ASSERT_EQ(straight.losses.size(), 6u);
  JobSpec spec = OneWindowSpec(data, testing::MakeTempDir("restore"));
  spec.model.init_from = {.checkpoint = "job-000001/step-4",
                          .optimizer = InitOptimizer::kRestore,
                          .checkpoint_dir = step4};
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->step(), 4);
  Recorder rec;
  ASSERT_THAT((*job)->Run(&rec), IsOk());
  // Steps 5 and 6 with the checkpoint's moments and step count (bias
  // correction, learning rate): the original's, bit for bit.
  ASSERT_EQ(rec.losses.size(), 2u);
  EXPECT_EQ(rec.losses[0], straight.losses[4]);
  EXPECT_EQ(rec.losses[1], straight.losses[5]);
}

// InitFrom::manifest_xxh64: a directory whose manifest is not the one the
// daemon recorded at submission (replaced while the job was queued) is
// refused with DATA_LOSS when the job starts, before its weights are read.
TEST(TrainingJobInitFromTest, CheckpointReplacedSinceSubmissionIsDataLoss) {
  const std::string data = WriteOneWindowDataset();
  Recorder straight;
  const std::string step4 = RunOriginal(data, &straight);
  auto info = VerifyCheckpoint(step4, false);
  ASSERT_THAT(info, IsOk());
  JobSpec spec = OneWindowSpec(data, testing::MakeTempDir("replaced"));
  spec.model.init_from = {.checkpoint = "job-000001/step-4",
                          .checkpoint_dir = step4,
                          .manifest_xxh64 = info->manifest_xxh64 ^ 1};
  absl::Status status;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  if (!job.ok()) {
    status = job.status();
  } else {
    Recorder rec;
    status = (*job)->Run(&rec).status();
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss,
                               HasSubstr("not the checkpoint recorded at submission")));
  spec.model.init_from.manifest_xxh64 = info->manifest_xxh64;  // the recorded one: it starts
  auto ok = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(ok, IsOk());
  Recorder rec;
  EXPECT_THAT((*ok)->Run(&rec), IsOk());
}

TEST(CheckInitFromModelTest, OtherModelIsInvalidArgumentNamingTheField) {
  const std::string data = WriteOneWindowDataset();
  Recorder straight;
  const std::string step4 = RunOriginal(data, &straight);
  JobSpec spec = OneWindowSpec(data, testing::MakeTempDir("mismatch"));
  spec.model.init_from.checkpoint = "job-000001/step-4";
  EXPECT_THAT(CheckInitFromModel(spec, step4), IsOk());
  spec.model.preset = "llama-1b";  // layouts only: nothing is allocated
  EXPECT_THAT(CheckInitFromModel(spec, step4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.init_from.checkpoint job-000001/step-4: the "
                                       "checkpoint's model is not the job's model (model.preset)"),
                             HasSubstr("blocks"))));
  EXPECT_THAT(CheckInitFromModel(spec, step4 + "-gone"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.init_from.checkpoint")));
}

TEST(ValidateJobSpecTest, HostileInitFromCheckpointIsRefusedNamingTheField) {
  for (const char* hostile : {"../job-000001/step-4", "/etc/step-4", "job-000001/../step-4",
                              "job-000001/step-4/..", "job-1/step-x", "job-000001"}) {
    JobSpec spec = TinySpec("/data", "/out");
    spec.model.init_from.checkpoint = hostile;
    EXPECT_THAT(ValidateJobSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("model.init_from.checkpoint: expected '<job id>/step-<step>'")))
        << hostile;
  }
  JobSpec spec = TinySpec("/data", "/out");
  spec.model.init_from.checkpoint = "job-000012/step-400";
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

// data.packing.document_attention reaches the loader and the executor: an
// isolated job says so in its data event and trains to other losses than
// the shared job on the same data (its windows hold 24-token documents
// that no longer see each other), and a suspended isolated job resumes to
// the uninterrupted run's losses exactly (the cursor is the same in every
// mode; Note [Packing rule] in engine/data/data_loader.h).
TEST(TrainingJobTest, IsolatedDocumentsTrainAndResumeExactly) {
  const std::string data = WriteDataset();
  const auto spec = [&data](const std::string& out, DocumentAttention mode) {
    JobSpec s = TinySpec(data, out);
    s.data.packing.document_attention = mode;
    return s;
  };
  Recorder shared, straight;
  {
    auto job = TrainingJob::Create(spec(testing::MakeTempDir("shared"), DocumentAttention::kShared),
                                   "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->data_description(), "");
    ASSERT_THAT((*job)->Run(&shared), IsOk());
  }
  {
    auto job = TrainingJob::Create(
        spec(testing::MakeTempDir("straight"), DocumentAttention::kIsolated), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->data_description(),
              "data: packed documents attend only to themselves "
              "(data.packing.document_attention: isolated)");
    ASSERT_THAT((*job)->Run(&straight), IsOk());
  }
  ASSERT_EQ(straight.losses.size(), 8u);
  ASSERT_EQ(shared.losses.size(), 8u);
  EXPECT_LT(straight.losses.back(), straight.losses.front());
  EXPECT_NE(straight.losses.front(), shared.losses.front());
  const std::string out = testing::MakeTempDir("suspended");
  Recorder first;
  {
    auto job = TrainingJob::Create(spec(out, DocumentAttention::kIsolated), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    first.job = job->get();
    first.stop_at = 3;
    ASSERT_THAT((*job)->Run(&first), IsOk());
  }
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  Recorder second;
  auto job =
      TrainingJob::Create(spec(out, DocumentAttention::kIsolated), "cpu", listed->back().dir);
  ASSERT_THAT(job, IsOk());
  ASSERT_THAT((*job)->Run(&second), IsOk());
  ASSERT_EQ(second.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << i;
}

// train.offload_activations reaches the executor and changes nothing but
// where the saved layer inputs live: on the CPU the offloaded values come
// back bit-identical (Note [Activation offload] in engine/step/executor.h), so
// every step's loss and eval loss match the job without it exactly.
TEST(TrainingJobTest, OffloadActivationsTrainsToTheSameLosses) {
  const std::string data = WriteDataset();
  Recorder plain;
  {
    auto job =
        TrainingJob::Create(TinySpec(data, testing::MakeTempDir("plain")), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->footprint().activation_offload_bytes, 0);
    ASSERT_THAT((*job)->Run(&plain), IsOk());
  }
  JobSpec spec = TinySpec(data, testing::MakeTempDir("offload"));
  spec.train.offload_activations = true;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  // tiny: 4 layers, hidden 128; the inputs of layers 0..2 go to the host.
  EXPECT_EQ((*job)->footprint().activation_offload_bytes, 3 * 2 * 16 * 128 * 4);
  Recorder offloaded;
  auto outcome = (*job)->Run(&offloaded);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
  ASSERT_EQ(offloaded.losses.size(), 8u);
  EXPECT_EQ(offloaded.losses, plain.losses);
  EXPECT_EQ(offloaded.evals, plain.evals);
  // The offload traffic shows in the step stats: 3 layer inputs each way
  // per micro-batch on top of the plain job's bytes.
  ASSERT_EQ(offloaded.reports.size(), plain.reports.size());
  const int64_t moved = 3 * 2 * 16 * 128 * 4;
  EXPECT_EQ(offloaded.reports[0].stats.d2h_bytes, plain.reports[0].stats.d2h_bytes + moved);
  EXPECT_EQ(offloaded.reports[0].stats.h2d_bytes, plain.reports[0].stats.h2d_bytes + moved);
}

// Issue 16: a layer-major job (waves of 2 of 3 micro-batches, activations
// in pinned host memory) suspended mid-run and resumed from its checkpoint
// gives, bit for bit, the losses of an uninterrupted micro-batch-major job
// (Note [Layer-major schedule] in engine/step/step_plan.h).
TEST(TrainingJobTest, LayerMajorSuspendThenResumeMatchesMicroBatchMajor) {
  const std::string data = WriteDataset();
  auto spec_for = [&](const std::string& out, StepSchedule schedule) {
    JobSpec spec = TinySpec(data, out);
    spec.train.gradient_accumulation_steps = 3;
    spec.train.max_steps = 4;
    spec.train.schedule = schedule;
    if (schedule == StepSchedule::kLayerMajor) {
      spec.train.wave = 2;
      spec.train.activations = ActivationPlacement::kHost;
    }
    return spec;
  };
  Recorder straight;
  {
    auto job = TrainingJob::Create(
        spec_for(testing::MakeTempDir("lm-straight"), StepSchedule::kMicroBatchMajor), "cpu",
        std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->schedule_description(), "micro-batch-major, activations on the device");
    ASSERT_THAT((*job)->Run(&straight), IsOk());
  }
  ASSERT_EQ(straight.losses.size(), 4u);
  const std::string out = testing::MakeTempDir("lm-suspended");
  Recorder first;
  {
    auto job = TrainingJob::Create(spec_for(out, StepSchedule::kLayerMajor), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ((*job)->schedule_description(),
              "layer-major, wave 2, activations in pinned host memory");
    // tiny: 4 layers, hidden 128; 2 micro-batches x 3 offloaded inputs.
    EXPECT_EQ((*job)->footprint().activation_offload_bytes, 2 * 3 * 2 * 16 * 128 * 4);
    first.job = job->get();
    first.stop_at = 3;  // not a checkpoint step: suspend writes one
    auto outcome = (*job)->Run(&first);
    ASSERT_THAT(outcome, IsOk());
    EXPECT_EQ(*outcome, JobOutcome::kSuspended);
  }
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  EXPECT_EQ(listed->back().step, 3);
  Recorder second;
  auto job =
      TrainingJob::Create(spec_for(out, StepSchedule::kLayerMajor), "cpu", listed->back().dir);
  ASSERT_THAT(job, IsOk());
  ASSERT_THAT((*job)->Run(&second), IsOk());
  std::vector<double> resumed = first.losses;
  resumed.insert(resumed.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(resumed, straight.losses);
  ASSERT_LE(second.evals.size(), straight.evals.size());
  EXPECT_EQ(second.evals,
            std::vector<double>(straight.evals.end() - second.evals.size(), straight.evals.end()));
}

// The schedule's fields are enums (their words are parsed at the edges:
// spec_convert_test, job_spec_test); the spec checks the rules between
// them and the enums' range.
TEST(ValidateJobSpecTest, NamesTheBadScheduleField) {
  JobSpec s = TinySpec("/tmp/tokens", "/tmp/out");
  s.train.schedule = StepSchedule::kMicroBatchMajor;
  s.train.wave = 4;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.wave: 4 micro-batches per wave needs train.schedule: "
                                 "layer-major")));
  s.train.schedule = std::nullopt;
  s.train.wave = 5000;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.wave")));
  s.train.wave = 0;
  s.train.activations = static_cast<ActivationPlacement>(9);
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("train.activations: unknown value 9")));
  s.train.activations = ActivationPlacement::kDevice;
  s.train.offload_activations = true;
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("train.activations: 'device' contradicts")));
  s.train.activations = ActivationPlacement::kHost;
  EXPECT_THAT(ValidateJobSpec(s), IsOk());
  EXPECT_THAT(JobSpecToJson(s), HasSubstr("\"activations\":\"host\""));
  s.train.cuda_graphs = static_cast<CudaGraphs>(-1);
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("train.cuda_graphs: unknown value -1")));
  s.train.cuda_graphs = CudaGraphs::kOff;
  EXPECT_THAT(ValidateJobSpec(s), IsOk());
  EXPECT_THAT(JobSpecToJson(s), HasSubstr("\"cuda_graphs\":\"off\""));
}

TEST(TrainingJobTest, CancelStopsWithoutFinishing) {
  auto job = TrainingJob::Create(TinySpec(WriteDataset(), testing::MakeTempDir("cancel")), "cpu",
                                 std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  rec.job = job->get();
  rec.stop_at = 1;
  rec.stop_kind = TrainingJob::StopKind::kCancel;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kCancelled);
  EXPECT_EQ(rec.losses.size(), 1u);
}

// A forced cancel (Note [Abandoned steps] in executor.h) from another
// thread while steps run: the job ends kCancelled, whichever step it hit.
TEST(TrainingJobTest, ForcedCancelEndsTheJobCancelled) {
  JobSpec spec = TinySpec(WriteDataset(), testing::MakeTempDir("force-cancel"));
  spec.train.max_steps = 1000;
  spec.checkpoint.every_steps = 0;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  rec.job = job->get();
  rec.stop_at = 2;
  rec.stop_kind = TrainingJob::StopKind::kForceCancel;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kCancelled);
  EXPECT_EQ(rec.losses.size(), 2u);

  auto racing = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(racing, IsOk());
  Recorder quiet;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*racing)->RequestStop(TrainingJob::StopKind::kForceCancel);
  });
  auto raced = (*racing)->Run(&quiet);
  canceller.join();
  ASSERT_THAT(raced, IsOk());
  EXPECT_EQ(*raced, JobOutcome::kCancelled);
  EXPECT_LT(quiet.losses.size(), 1000u);
}

// The daemon's GPU path without the daemon: the tiny example's shapes in
// bf16 on CUDA with eval and checkpoints every few steps. Skipped without a
// CUDA device.
TEST(TrainingJobTest, TrainsOnCudaWithEvalAndCheckpoints) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  JobSpec spec = TinySpec(WriteDataset(), testing::MakeTempDir("cuda"));
  spec.train.micro_batch = 8;
  spec.train.seq_len = 128;
  spec.train.max_steps = 60;
  spec.train.compute_dtype = ComputeDtype::kBf16;
  spec.eval.every_steps = 20;
  spec.checkpoint.every_steps = 20;
  auto job = TrainingJob::Create(spec, "cuda:0", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
  EXPECT_EQ(rec.losses.size(), 60u);
  EXPECT_LT(rec.losses.back(), rec.losses.front());
  EXPECT_EQ(rec.evals.size(), 3u);
}

// train.resident_layers on the CPU (where auto keeps nothing resident):
// the trainer keeps layers 0..N-1 on the device with their AdamW state,
// the schedule description (the job's schedule event) says how many and
// that the option set them, and the losses follow the all-streamed run to
// rounding (the device AdamW differs from the CPU kernel by a few ulp per
// update: Note [Fused device AdamW]).
TEST(TrainingJobTest, ResidentLayersOptionOverridesTheAutoChoice) {
  const std::string data = WriteDataset();
  auto run = [&](int64_t resident_layers, const std::string& description) {
    JobSpec spec = TinySpec(data, testing::MakeTempDir("resident"));
    spec.train.max_steps = 4;
    spec.train.resident_layers = resident_layers;
    Recorder rec;
    auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
    EXPECT_THAT(job, IsOk());
    if (!job.ok()) return rec;
    EXPECT_EQ((*job)->schedule_description(), description);
    auto outcome = (*job)->Run(&rec);
    EXPECT_THAT(outcome, IsOk());
    return rec;
  };
  const Recorder streamed =
      run(kAutoResidentLayers, "micro-batch-major, activations on the device");
  const Recorder resident =
      run(2, "micro-batch-major, activations on the device; resident: 2 layers (resident_layers)");
  const Recorder none = run(0, "micro-batch-major, activations on the device");
  ASSERT_EQ(streamed.losses.size(), 4u);
  ASSERT_EQ(resident.losses.size(), 4u);
  EXPECT_EQ(none.losses, streamed.losses);  // the same plan: bit for bit
  for (size_t i = 0; i < streamed.losses.size(); ++i) {
    EXPECT_NEAR(resident.losses[i], streamed.losses[i], 1e-5 * std::abs(streamed.losses[i]))
        << "step " << i;
  }
  // A count above the model's 4 layers is the trainer's INVALID_ARGUMENT
  // (the daemon refuses it at submission, server/core/submit_checks.h).
  JobSpec spec = TinySpec(data, testing::MakeTempDir("resident-bad"));
  spec.train.resident_layers = 5;
  EXPECT_THAT(TrainingJob::Create(spec, "cpu", std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resident_layers")));
}

TEST(TrainingJobTest, MissingDataIsAnErrorNamingTheField) {
  EXPECT_THAT(TrainingJob::Create(TinySpec("/nonexistent/tokens", testing::MakeTempDir("missing")),
                                  "cpu", std::nullopt),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("data")));
}

// Sets MEGATRAIN_DEBUG_POISON_STEP (training_job.h) for one scope.
class ScopedPoisonStep {
 public:
  explicit ScopedPoisonStep(const char* value) { setenv("MEGATRAIN_DEBUG_POISON_STEP", value, 1); }
  ~ScopedPoisonStep() { unsetenv("MEGATRAIN_DEBUG_POISON_STEP"); }
};

TEST(TrainingJobNanTest, SkipPolicySkipsThePoisonedStepAndFinishes) {
  for (const char* knob : {"3", "3:grad"}) {
    ScopedPoisonStep poison(knob);
    JobSpec spec = TinySpec(WriteDataset(), testing::MakeTempDir("nan-skip"));
    spec.train.max_steps = 6;
    ASSERT_EQ(spec.train.nan_policy, NanPolicy::kSkip);  // the default
    auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    Recorder rec;
    auto outcome = (*job)->Run(&rec);
    ASSERT_THAT(outcome, IsOk()) << knob;
    EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
    EXPECT_EQ((*job)->step(), 6);
    // 7 attempts: the third was skipped and reported with the last applied
    // step's number; skipped steps do not count towards max_steps.
    ASSERT_EQ(rec.reports.size(), 7u) << knob;
    std::vector<int64_t> steps;
    for (const StepReport& r : rec.reports) steps.push_back(r.skipped ? -r.step : r.step);
    EXPECT_THAT(steps, ElementsAre(1, 2, -2, 3, 4, 5, 6)) << knob;
    for (double loss : rec.losses) EXPECT_TRUE(std::isfinite(loss)) << knob;
    EXPECT_EQ(rec.checkpoint_steps, (std::vector<int64_t>{2, 4, 6})) << knob;
  }
}

TEST(TrainingJobNanTest, FailPolicyFailsNamingTheStep) {
  ScopedPoisonStep poison("3");
  JobSpec spec = TinySpec(WriteDataset(), testing::MakeTempDir("nan-fail"));
  spec.train.nan_policy = NanPolicy::kFail;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  EXPECT_THAT((*job)->Run(&rec),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step 3: loss nan"), HasSubstr("not finite"),
                             HasSubstr("train.nan_policy: fail"))));
  EXPECT_EQ(rec.losses.size(), 2u);
  EXPECT_EQ((*job)->step(), 2);
}

TEST(TrainingJobNanTest, MalformedDebugKnobIsInvalidArgument) {
  ScopedPoisonStep poison("soon");
  EXPECT_THAT(TrainingJob::Create(TinySpec(WriteDataset(), testing::MakeTempDir("knob")), "cpu",
                                  std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MEGATRAIN_DEBUG_POISON_STEP: expected <step>[:loss|:grad]")));
}

// A model whose weights hold a NaN (here: a checkpoint written from a
// poisoned store) yields NaN at every step: skipping would never advance,
// so the job fails after kMaxConsecutiveSkippedSteps.
TEST(TrainingJobNanTest, EndlessNonFiniteStepsFailAfterTheLimit) {
  const std::string data = WriteDataset();
  JobSpec spec = TinySpec(data, testing::MakeTempDir("nan-endless"));
  spec.train.max_steps = 2;
  {
    auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(nullptr), IsOk());
  }
  auto listed = ListCheckpoints(spec.output_dir);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  auto config = ReadCheckpointConfig(listed->back().dir);
  ASSERT_THAT(config, IsOk());
  auto store = HostStore::Create(*config, {});
  ASSERT_THAT(store, IsOk());
  auto state = ReadCheckpoint(listed->back().dir, store->get());
  ASSERT_THAT(state, IsOk());
  (*store)->master((*store)->layout().head_block())[0] = NAN;
  const std::string poisoned_dir = testing::MakeTempDir("nan-poisoned");
  auto poisoned = WriteCheckpoint(**store, *state, poisoned_dir, spec.checkpoint);
  ASSERT_THAT(poisoned, IsOk());

  spec.train.max_steps = 100;
  auto job = TrainingJob::Create(spec, "cpu", poisoned->dir);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  EXPECT_THAT((*job)->Run(&rec),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("20 steps in a row"), HasSubstr("last applied step is 2"))));
  EXPECT_EQ(rec.reports.size(), static_cast<size_t>(kMaxConsecutiveSkippedSteps));
  EXPECT_TRUE(rec.losses.empty());
}

// Bytes of one checkpoint of `config`: three tensor files (the 64-byte
// header, the block table and fp32 data each) plus JSON files (< 64 KiB).
int64_t CheckpointBytes(const ModelConfig& config) {
  const ModelLayout layout = ModelLayout::Create(config);
  int64_t numel = 0;
  for (const BlockLayout& block : layout.blocks) numel += block.numel;
  return 3 * (64 + 8 * static_cast<int64_t>(layout.blocks.size()) + 4 * numel) + (64 << 10);
}

// A real ENOSPC: output_dir on a tmpfs with room for one checkpoint and a
// half. The checkpoint of step 2 fits; step 4's does not. The job fails
// with RESOURCE_EXHAUSTED naming the file and ENOSPC, the partial directory
// is gone, and step 2's checkpoint still verifies (XXH64 manifest).
TEST(TrainingJobDiskFullTest, CheckpointOnAFullDiskFailsAndKeepsTheEarlierOne) {
  auto config = PresetConfig("tiny");
  ASSERT_THAT(config, IsOk());
  std::string why_not;
  std::unique_ptr<testing::ScopedTmpfs> disk =
      testing::ScopedTmpfs::Mount(CheckpointBytes(*config) * 3 / 2, &why_not);
  if (disk == nullptr) GTEST_SKIP() << why_not;
  JobSpec spec = TinySpec(WriteDataset(), disk->path() + "/out");
  spec.checkpoint.keep_last = 1;
  auto job = TrainingJob::Create(spec, "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  const std::string root = spec.output_dir + "/checkpoints";
  const absl::StatusOr<JobOutcome> outcome = (*job)->Run(&rec);
  std::cout << outcome.status() << "\n";  // what the job's FAILED state shows
  EXPECT_THAT(
      outcome,
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          AllOf(HasSubstr("writing checkpoint step-00000004: " + root + "/.tmp-step-00000004."),
                HasSubstr("No space left on device (ENOSPC)"), HasSubstr("was removed"),
                HasSubstr("earlier checkpoints are intact (newest: " + root + "/step-00000002)"))));
  EXPECT_EQ(rec.checkpoint_steps, (std::vector<int64_t>{2}));
  EXPECT_THAT(testing::ListDir(root), ElementsAre(".ledger.json", "step-00000002"));
  auto store = HostStore::Create(*config, {});
  ASSERT_THAT(store, IsOk());
  auto state = ReadCheckpoint(root + "/step-00000002", store->get());
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->step, 2);
}

TEST(ExplainDeviceOutOfMemoryTest, AddsTheShapeTheActivationsAndASmallerMicroBatch) {
  // The job of the GPU check in docs/operations.md ("Faults and recovery").
  JobSpec spec = TinySpec("/data", "/out");
  spec.model.preset = "llama-1b";
  spec.train.micro_batch = 64;
  spec.train.seq_len = 8192;
  spec.train.compute_dtype = ComputeDtype::kBf16;
  auto config = PresetConfig("llama-1b");
  ASSERT_THAT(config, IsOk());
  const absl::Status oom = absl::ResourceExhaustedError(
      "device out of memory (try a smaller train.micro_batch or train.seq_len): CUDA out of "
      "memory. Tried to allocate 64.00 GiB");
  const absl::Status explained = ExplainDeviceOutOfMemory(oom, spec, *config);
  EXPECT_THAT(explained,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(std::string(oom.message())),
                             HasSubstr("train.micro_batch 64 x train.seq_len 8192 = 524288 tokens"),
                             HasSubstr("with train.activation_checkpointing: auto resident "
                                       "layers may also keep their forward graph"),
                             HasSubstr("or train.activation_checkpointing: all"),
                             HasSubstr("try train.micro_batch: 32 with "
                                       "train.gradient_accumulation_steps: 2"),
                             HasSubstr("or train.offload_activations: true (15 x 524288 x 2048 "
                                       "x 4 B = 60.00 GiB of them in pinned host memory "
                                       "instead)"))));
  std::cout << explained.message() << "\n";  // the expected message of the GPU check

  // With offload on, 3 saved inputs stay on the device and it is not
  // suggested again.
  spec.train.offload_activations = true;
  const absl::Status offloaded = ExplainDeviceOutOfMemory(oom, spec, *config);
  EXPECT_THAT(offloaded,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("train.offload_activations keeps 15 in pinned host memory"),
                             HasSubstr(") 3 x 524288 x 2048 x 4 B = 12.00 GiB"))));
  EXPECT_THAT(offloaded.message(), ::testing::Not(HasSubstr("or train.offload_activations: true")));
  spec.train.offload_activations = false;
  // With every layer recomputed already, `all` is not suggested.
  spec.train.activation_checkpointing = ActivationCheckpointing::kAll;
  EXPECT_THAT(ExplainDeviceOutOfMemory(oom, spec, *config).message(),
              ::testing::Not(HasSubstr("or train.activation_checkpointing: all")));
  spec.train.activation_checkpointing = ActivationCheckpointing::kAuto;

  spec.train.micro_batch = 1;
  EXPECT_THAT(ExplainDeviceOutOfMemory(oom, spec, *config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("train.micro_batch is already 1: try a shorter train.seq_len")));
  // Anything else is returned as it was: other codes, host memory, a full disk.
  for (const absl::Status& other :
       {absl::OkStatus(), absl::InternalError("engine: device out of memory"),
        absl::ResourceExhaustedError("/out/x: write: No space left on device (ENOSPC)")}) {
    EXPECT_EQ(ExplainDeviceOutOfMemory(other, spec, *config), other);
  }
}

}  // namespace
}  // namespace megatrain::engine
