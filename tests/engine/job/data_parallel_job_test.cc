// TrainingJob on several devices (Note [Data-parallel job] in
// engine/job/job_trainer.h), with N CPU ranks over c10d's gloo: a 2-device
// job trains as one device accumulating the same global batch, reports
// tokens/s per device and in total, suspends and resumes exactly on 2
// devices (with the AdamW moments in host memory or on the NVMe tier),
// its checkpoint loads on 1 device, and a job given fewer devices than
// train.devices is refused naming the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/dist/process_group.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/checkpoint_info.h"
#include "engine/data/token_shard.h"
#include "tests/testing/pattern_dataset.h"
#include "engine/job/job_trainer.h"
#include "engine/job/training_job.h"
#include "engine/model/model_config.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/device_info.h"
#include "engine/store/host_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/reference_llama.h"

// Builds whose LibTorch has no gloo (pip's torch on the GPU machines) have
// no CPU ranks (as in tests/engine/dist/data_parallel_test.cc).
#define MEGATRAIN_SKIP_WITHOUT_GLOO() \
  if (!::megatrain::engine::HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// 40 documents of 4 repeated patterns (training_job_test's data).
std::string WriteDataset() { return testing::WritePatternDataset({.prefix = "dp-tokens"}); }

// tiny preset (or the HF model directory `hf_dir`), fp32, global batch 4
// micro-batches of 2 x 16 tokens, with clipping; `devices` ranks share the
// accumulation.
JobSpec Spec(const std::string& tokens, const std::string& output_dir, int64_t devices,
             const std::string& hf_dir = "") {
  JobSpec s;
  s.name = "dp";
  if (hf_dir.empty()) {
    s.model.preset = "tiny";
  } else {
    s.model.hf_dir = hf_dir;
  }
  s.data.tokens = tokens;
  s.data.eval_fraction = 0.1;
  s.train.micro_batch = 2;
  s.train.seq_len = 16;
  s.train.gradient_accumulation_steps = 4;
  s.train.devices = devices;
  s.train.max_grad_norm = 1.0;
  s.train.max_steps = 6;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.eval.every_steps = 3;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 3;
  s.checkpoint.keep_last = 3;
  s.output_dir = output_dir;
  return s;
}

std::vector<std::string> CpuRanks(int n) { return std::vector<std::string>(n, "cpu"); }

class Recorder : public JobObserver {
 public:
  void OnStep(const StepReport& r) override {
    reports.push_back(r);
    losses.push_back(r.loss);
    if (job != nullptr && r.step == stop_at) job->RequestStop(TrainingJob::StopKind::kSuspend);
  }
  void OnEval(int64_t, double loss) override { evals.push_back(loss); }
  std::vector<StepReport> reports;
  std::vector<double> losses, evals;
  TrainingJob* job = nullptr;
  int64_t stop_at = -1;
};

// Runs `spec` on `devices` (resuming from `resume_from`) to its end or
// `stop_at`; returns the observer.
Recorder RunJob(const JobSpec& spec, const std::vector<std::string>& devices,
                const std::optional<std::string>& resume_from = std::nullopt,
                int64_t stop_at = -1) {
  Recorder recorder;
  auto job = TrainingJob::CreateOnDevices(spec, devices, resume_from);
  EXPECT_THAT(job, IsOk());
  if (!job.ok()) return recorder;
  recorder.job = job->get();
  recorder.stop_at = stop_at;
  EXPECT_THAT((*job)->Run(&recorder), IsOk());
  return recorder;
}

// Master weights and AdamW moments of the newest checkpoint under `dir`,
// of the tiny preset or of the model in `hf_dir`.
std::vector<float> LastCheckpointState(const std::string& dir, const std::string& hf_dir = "") {
  auto listed = ListCheckpoints(dir);
  EXPECT_THAT(listed, IsOk());
  if (!listed.ok() || listed->empty()) return {};
  auto config = hf_dir.empty() ? PresetConfig("tiny") : LoadHfConfigFile(hf_dir + "/config.json");
  EXPECT_THAT(config, IsOk());
  auto store = HostStore::Create(*config, {});
  EXPECT_THAT(store, IsOk());
  EXPECT_THAT(ReadCheckpoint(listed->back().dir, store->get()), IsOk());
  std::vector<float> out;
  for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
    for (const float* data : {(*store)->master(b), (*store)->exp_avg(b), (*store)->exp_avg_sq(b)}) {
      out.insert(out.end(), data, data + (*store)->block_numel(b));
    }
  }
  return out;
}

using ::megatrain::testing::RelativeError;  // the L2 measure over flat copies

// `tolerance` relative, 1e-6 on the CPU (L2 over weights and moments;
// losses per step):
// rank r trains micro-batches [2r, 2r+2) of each global batch of 4, in the
// loader's order, so both runs train the same micro-batches; the only
// difference is the order of the fp32 gradient sum ((g0 + g1) + (g2 + g3)
// after the all-reduce against ((g0 + g1) + g2) + g3 on one device: Note
// [Gradient all-reduce] in engine/dist/collective_reducer.h), about 1e-7
// relative per gradient, carried through six AdamW steps. Not bit-identical
// for that reason.
// `hf_dir`: the model (empty: the tiny preset); `data`: its token shards
// (empty: WriteDataset's); `edit`: applied to both specs (with their
// device count) before they run.
void ExpectTwoDevicesTrainAsOne(const std::vector<std::string>& one_device,
                                const std::vector<std::string>& two_devices, double tolerance,
                                const std::string& hf_dir = "", std::string data = "",
                                const std::function<void(JobSpec&, int64_t)>& edit = {}) {
  if (data.empty()) data = WriteDataset();
  const std::string one_dir = testing::MakeTempDir("dp-one");
  const std::string two_dir = testing::MakeTempDir("dp-two");
  JobSpec one_spec = Spec(data, one_dir, 1, hf_dir), two_spec = Spec(data, two_dir, 2, hf_dir);
  if (edit) edit(one_spec, 1), edit(two_spec, 2);
  const Recorder one = RunJob(one_spec, one_device);
  const Recorder two = RunJob(two_spec, two_devices);
  ASSERT_EQ(one.losses.size(), 6u);
  ASSERT_EQ(two.losses.size(), 6u);
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_NEAR(two.losses[s], one.losses[s], tolerance * std::abs(one.losses[s]))
        << "step " << s + 1;
  }
  ASSERT_EQ(two.evals.size(), 2u);
  EXPECT_NEAR(two.evals[1], one.evals[1], tolerance * std::abs(one.evals[1]));
  const std::vector<float> one_state = LastCheckpointState(one_dir, hf_dir);
  const std::vector<float> two_state = LastCheckpointState(two_dir, hf_dir);
  ASSERT_FALSE(one_state.empty());
  const double error = RelativeError(two_state, one_state);
  std::fprintf(stderr, "2 devices (%s) vs 1 accumulating: weights and moments %.3g relative\n",
               two_devices.front().c_str(), error);
  EXPECT_LE(error, tolerance);

  // Tokens/s: each device's share and the job's total.
  const int64_t global_tokens = 4 * 2 * 16;
  for (const StepReport& r : two.reports) {
    EXPECT_EQ(r.devices, 2);
    EXPECT_EQ(r.stats.tokens, global_tokens) << "the global batch's tokens";
    EXPECT_GT(r.device_tokens_per_s, 0);
    EXPECT_DOUBLE_EQ(r.tokens_per_s, 2 * r.device_tokens_per_s);
  }
  for (const StepReport& r : one.reports) {
    EXPECT_EQ(r.devices, 1);
    EXPECT_EQ(r.stats.tokens, global_tokens);
    EXPECT_DOUBLE_EQ(r.tokens_per_s, r.device_tokens_per_s);
  }
}

TEST(DataParallelJobTest, TwoDevicesTrainAsOneDeviceAccumulatingTheGlobalBatch) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  ExpectTwoDevicesTrainAsOne({"cpu"}, CpuRanks(2), 1e-6);
}

// Note [Ring shards] (engine/step/gradient_reducer.h): a 2-device job with
// memory.gradient_landing ring (clipping off; two micro-batches per rank,
// summed on the device) lands each rank's reduced shards in its own ring
// and trains as one device accumulating the global batch in the arena,
// within the 1e-6 above (the ring's AdamW reads the same shards; only the
// summation order differs). Its footprint counts two shard-sized rings
// and no gradient arena but the ranks' embedding landings.
void RingEdit(JobSpec& spec, int64_t devices) {
  spec.train.max_grad_norm = 0;
  if (devices > 1) spec.memory.gradient_landing = GradientLanding::kRing;
}

TEST(DataParallelJobTest, TwoDevicesWithTheGradientRingTrainAsOneDeviceWithTheArena) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  JobSpec spec = Spec(WriteDataset(), testing::MakeTempDir("dp-ring-plan"), 2);
  RingEdit(spec, 2);
  auto job = TrainingJob::CreateOnDevices(spec, CpuRanks(2), std::nullopt);
  ASSERT_THAT(job, IsOk());
  const MemoryFootprint f = (*job)->footprint();
  auto config = PresetConfig("tiny");
  ASSERT_THAT(config, IsOk());
  const ModelLayout layout = ModelLayout::Create(*config);
  const int64_t layer = layout.blocks[layout.layer_block(0)].numel;
  EXPECT_EQ(f.gradient_ring_bytes, 2 * 3 * 4 * ((layer + 1) / 2)) << "two rings of half layers";
  ExpectTwoDevicesTrainAsOne({"cpu"}, CpuRanks(2), 1e-6, "", "", RingEdit);
}

// The same for a mixture of experts with the ring (the MoE layers' shards
// in the ring).
TEST(DataParallelJobTest, TwoDevicesWithTheGradientRingTrainAMixtureOfExpertsAsOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const std::string data = testing::WritePatternDataset(
      {.prefix = "dp-moe-ring-tokens", .vocab_size = 128, .id_span = 120});
  ExpectTwoDevicesTrainAsOne({"cpu"}, CpuRanks(2), 1e-6,
                             std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/mixtral", data, RingEdit);
}

// A mixture of experts (transformers' tiny Mixtral fixture, its
// load-balancing loss on): the job's ranks sum to one device's objective
// (Note [Data-parallel step] in engine/step/gradient_reducer.h).
TEST(DataParallelJobTest, TwoDevicesTrainAMixtureOfExpertsAsOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  const std::string data =
      testing::WritePatternDataset({.prefix = "dp-moe-tokens", .vocab_size = 128, .id_span = 120});
  ExpectTwoDevicesTrainAsOne({"cpu"}, CpuRanks(2), 1e-6,
                             std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/mixtral", data);
}

// Suspended at step 4 (a suspend checkpoints), resumed on the same
// devices: steps 5..6 and the final weights and moments bit-identical to
// the uninterrupted run (same ranks, same reduction order). The same
// checkpoint on 1 device continues within `tolerance` (a checkpoint has no
// device count).
void ExpectSuspendResumesExactly(const std::vector<std::string>& two_devices,
                                 const std::vector<std::string>& one_device, double tolerance) {
  const std::string data = WriteDataset();
  const std::string straight_dir = testing::MakeTempDir("dp-straight");
  const Recorder straight = RunJob(Spec(data, straight_dir, 2), two_devices);
  ASSERT_EQ(straight.losses.size(), 6u);

  const std::string out = testing::MakeTempDir("dp-suspended");
  const Recorder first = RunJob(Spec(data, out, 2), two_devices, std::nullopt, /*stop_at=*/4);
  ASSERT_EQ(first.losses.size(), 4u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  ASSERT_EQ(listed->back().step, 4);
  const std::string checkpoint = listed->back().dir;

  const Recorder second = RunJob(Spec(data, out, 2), two_devices, checkpoint);
  ASSERT_EQ(second.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(second.losses[i], straight.losses[4 + i]) << "step " << 5 + i;
  }
  const std::vector<float> straight_state = LastCheckpointState(straight_dir);
  ASSERT_FALSE(straight_state.empty());
  EXPECT_TRUE(LastCheckpointState(out) == straight_state) << "weights and moments at step 6";

  // 2 -> 1 device: the checkpoint's own copy (the resumed job above wrote
  // newer ones in `out`).
  const std::string single_out = testing::MakeTempDir("dp-to-one");
  const Recorder single = RunJob(Spec(data, single_out, 1), one_device, checkpoint);
  ASSERT_EQ(single.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(single.losses[i], straight.losses[4 + i],
                tolerance * std::abs(straight.losses[4 + i]))
        << "step " << 5 + i;
  }
  EXPECT_LE(RelativeError(LastCheckpointState(single_out), straight_state), tolerance);
}

TEST(DataParallelJobTest, SuspendResumesExactlyAndTheCheckpointLoadsOnOneDevice) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  ExpectSuspendResumesExactly(CpuRanks(2), {"cpu"}, 1e-6);
}

// Spec with the AdamW moments on the NVMe tier, under `nvme_dir` (the
// daemon's directory, memory.nvme_dir).
JobSpec TieredSpec(const std::string& tokens, const std::string& output_dir, int64_t devices,
                   const std::string& nvme_dir) {
  JobSpec s = Spec(tokens, output_dir, devices);
  s.memory.nvme_tier = NvmeTierMode::kMoments;
  s.memory.nvme_dir = nvme_dir;
  return s;
}

// Note [Tier shards] (engine/store/nvme_tier.h): a 2-device job with its
// moments on the NVMe tier, each rank's shard in files of its own,
// suspended at step 4 and resumed, ends bit for bit where the
// uninterrupted tiered job ends (its checkpoints hold the moments read
// back from both ranks' files, and the resume writes them back). The same
// job with the moments in host memory ends within `ram_tolerance` (0: bit
// for bit, the CPU: the tier changes no bit) and the one-device tiered
// job within `tolerance` (the reduction order, ExpectTwoDevicesTrainAsOne).
void ExpectTieredSuspendResumesExactly(const std::vector<std::string>& two_devices,
                                       const std::vector<std::string>& one_device,
                                       double ram_tolerance, double tolerance) {
  const std::string data = WriteDataset();
  const std::string nvme = testing::MakeTempDir("dp-nvme");
  const std::string straight_dir = testing::MakeTempDir("dp-tier-straight");
  const Recorder straight = RunJob(TieredSpec(data, straight_dir, 2, nvme), two_devices);
  ASSERT_EQ(straight.losses.size(), 6u);
  // Both ranks' tier writes reach the reports (a step reports the updates
  // that finished since the previous one: they run behind it).
  int64_t written = 0;
  for (const StepReport& r : straight.reports) written += r.stats.nvme_written_bytes;
  EXPECT_GT(written, 0);

  const std::string out = testing::MakeTempDir("dp-tier-suspended");
  const Recorder first =
      RunJob(TieredSpec(data, out, 2, nvme), two_devices, std::nullopt, /*stop_at=*/4);
  ASSERT_EQ(first.losses.size(), 4u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  ASSERT_EQ(listed->back().step, 4);
  const Recorder second = RunJob(TieredSpec(data, out, 2, nvme), two_devices, listed->back().dir);
  ASSERT_EQ(second.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(second.losses[i], straight.losses[4 + i]) << "step " << 5 + i;
  }
  const std::vector<float> straight_state = LastCheckpointState(straight_dir);
  ASSERT_FALSE(straight_state.empty());
  EXPECT_TRUE(LastCheckpointState(out) == straight_state) << "weights and moments at step 6";

  const std::string ram_dir = testing::MakeTempDir("dp-tier-ram");
  const Recorder in_ram = RunJob(Spec(data, ram_dir, 2), two_devices);
  if (ram_tolerance == 0) {
    EXPECT_EQ(in_ram.losses, straight.losses);
    EXPECT_TRUE(LastCheckpointState(ram_dir) == straight_state) << "the tier changed a bit";
  } else {
    EXPECT_LE(RelativeError(LastCheckpointState(ram_dir), straight_state), ram_tolerance);
  }
  const std::string one_dir = testing::MakeTempDir("dp-tier-one");
  const Recorder one = RunJob(TieredSpec(data, one_dir, 1, nvme), one_device);
  ASSERT_EQ(one.losses.size(), 6u);
  EXPECT_LE(RelativeError(LastCheckpointState(one_dir), straight_state), tolerance);
}

TEST(DataParallelJobTest, TieredTwoDeviceJobSuspendsAndResumesExactly) {
  MEGATRAIN_SKIP_WITHOUT_GLOO();
  ExpectTieredSuspendResumesExactly(CpuRanks(2), {"cpu"}, 0, 1e-6);
}

// The same on two GPUs over NCCL (run on a multi-GPU machine:
// deploy/gpu-dp-check.sh). Tolerance 1e-5 (the fp32 standard): besides the
// summation order, the one-device run keeps its embedding and some layers
// resident on the GPU (auto), updated by the device AdamW, where the
// data-parallel ranks update everything with the CPU AdamW.
#define MEGATRAIN_SKIP_WITHOUT_TWO_NCCL_GPUS()                           \
  if (CudaDeviceCount() < 2 || !HasCollectiveBackend("cuda"))            \
  GTEST_SKIP() << "needs 2 CUDA devices and NCCL (" << CudaDeviceCount() \
               << " devices in this process)"

TEST(DataParallelJobTest, TwoGpusTrainAsOneGpuAccumulatingTheGlobalBatch) {
  MEGATRAIN_SKIP_WITHOUT_TWO_NCCL_GPUS();
  ExpectTwoDevicesTrainAsOne({"cuda:0"}, {"cuda:0", "cuda:1"}, 1e-5);
}

// The gradient ring on two GPUs (NCCL's reduce-scatter; 1e-5 as above).
TEST(DataParallelJobTest, TwoGpusWithTheGradientRingTrainAsOneGpu) {
  MEGATRAIN_SKIP_WITHOUT_TWO_NCCL_GPUS();
  ExpectTwoDevicesTrainAsOne({"cuda:0"}, {"cuda:0", "cuda:1"}, 1e-5, "", "", RingEdit);
}

TEST(DataParallelJobTest, SuspendResumesExactlyOnTwoGpus) {
  MEGATRAIN_SKIP_WITHOUT_TWO_NCCL_GPUS();
  ExpectSuspendResumesExactly({"cuda:0", "cuda:1"}, {"cuda:0"}, 1e-5);
}

// The tiered job on two GPUs (NCCL, the device reduce-scatter). Tolerance
// 1e-5 against the in-RAM 2-GPU job and the tiered 1-GPU job (the fp32
// standard of the GPU tests above): the in-RAM job keeps its embedding
// and some layers resident on the GPUs (auto), updated by the device
// AdamW, where the tier keeps nothing resident.
TEST(DataParallelJobTest, TieredJobSuspendsAndResumesExactlyOnTwoGpus) {
  MEGATRAIN_SKIP_WITHOUT_TWO_NCCL_GPUS();
  ExpectTieredSuspendResumesExactly({"cuda:0", "cuda:1"}, {"cuda:0"}, 1e-5, 1e-5);
}

// A job is given exactly its train.devices; anything else is refused
// before anything is built, naming the field.
TEST(DataParallelJobTest, RefusesDevicesThatDoNotMatchTrainDevices) {
  const std::string data = WriteDataset();
  const JobSpec spec = Spec(data, testing::MakeTempDir("dp-refused"), 2);
  EXPECT_THAT(TrainingJob::CreateOnDevices(spec, {"cpu"}, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.devices: 2 requested, the job was given 1 device(s)")));
  EXPECT_THAT(TrainingJob::CreateOnDevices(spec, {"cuda:0", "cuda:0"}, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.devices: device cuda:0 given twice")));
  EXPECT_THAT(TrainingJob::CreateOnDevices(spec, {"cpu", "cuda:0"}, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix the CPU and CUDA")));
  JobSpec odd = spec;
  odd.train.gradient_accumulation_steps = 3;
  EXPECT_THAT(TrainingJob::CreateOnDevices(odd, CpuRanks(2), std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.gradient_accumulation_steps to be a multiple of 2")));
}

// "cpu:K" names are CPU ranks (how a daemon lists CPU "devices" apart).
TEST(DataParallelJobTest, CpuDeviceNamesAreCpuRanks) {
  auto ranks = JobRankDevices({"cpu:0", "cpu:1"}, 2);
  ASSERT_THAT(ranks, IsOk());
  EXPECT_THAT(*ranks, ::testing::ElementsAre("cpu", "cpu"));
  auto cuda = JobRankDevices({"cuda:1", "cuda:0"}, 2);
  ASSERT_THAT(cuda, IsOk());
  EXPECT_THAT(*cuda, ::testing::ElementsAre("cuda:1", "cuda:0"));
}

}  // namespace
}  // namespace megatrain::engine
