// Data parallelism over several processes (Note [Replica processes] in
// engine/dist/data_parallel.h): this test binary starts itself twice with
// torchrun's variables (MASTER_ADDR 127.0.0.1, a free port, WORLD_SIZE 2,
// RANK 0/1), each process one CPU rank with its own replica of the host
// store, gloo over the TCPStore rendezvous. The two replicas end bit-
// identical, equal to two ranks as threads of one process bit for bit, and
// to one process accumulating the whole global batch (twice each
// process's micro-batches) within 1e-6 L2-relative; a checkpoint written by
// process 0 only resumes on two processes bit for bit. With the NVMe tier
// (both processes given one directory; Note [Tier shards]) two processes
// equal two without it bit for bit, clipping on and off, and resume bit
// for bit from process 0's checkpoint. A child that hangs
// is killed at a deadline and fails the test. Bad torchrun variables fail
// with the variable named, and an unreachable master within a bounded
// timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/dist/data_parallel.h"
#include "engine/dist/process_group.h"
#include "engine/checkpoint/checkpoint.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/reference_llama.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::BitIdentical;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallDataParallelOptions;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;
constexpr int kMicroBatches = 4;  // per global batch: 2 per process
constexpr int kSteps = 4;
constexpr int kCheckpointStep = 2;
constexpr uint64_t kSeed = 5;
// Child environment: the directory to write to, and what to run.
constexpr char kChildDir[] = "MEGATRAIN_TEST_DIST_CHILD_DIR";
constexpr char kChildMode[] = "MEGATRAIN_TEST_DIST_CHILD_MODE";
// Optional: the NVMe tier's directory (absent: moments in host memory),
// and max_grad_norm (absent: 1.0).
constexpr char kChildTier[] = "MEGATRAIN_TEST_DIST_CHILD_TIER";
constexpr char kChildClip[] = "MEGATRAIN_TEST_DIST_CHILD_CLIP";

TrainerOptions Options(double max_grad_norm = 1.0) {
  return SmallDataParallelOptions(kB, kT, max_grad_norm, kMicroBatches);
}

// The AdamW moments on the NVMe tier in `dir`, in small chunks and slices
// (several per block, as in tiered_data_parallel_test.cc).
void UseTier(const std::string& dir, TrainerOptions* o) {
  o->nvme_dir = dir;
  o->nvme_chunk_elements = 1024;
  o->optimizer_slice_elements = 2000;
}

std::vector<MicroBatch> Batch(const ModelConfig& config, int step) {
  return MakeBatches(kMicroBatches, kB, kT, config.vocab_size, 100 + step);
}

void WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

using ::megatrain::testing::RelativeError;  // the L2 measure over flat copies

// One process of the job (run by MultiProcessTest through the variables
// above; skipped otherwise). "train": steps 1..kSteps, process 0 writes
// the checkpoint after kCheckpointStep; "resume": reads it, runs the rest.
// With kChildTier set, the AdamW moments on the NVMe tier in that
// directory, the same one for both processes (Note [Tier shards] in
// engine/store/nvme_tier.h); kChildClip: max_grad_norm (default 1.0).
// Writes its replica's state (weights and moments, from its tier files
// with the tier) to <dir>/<mode>.<RANK>.bin and whether the replicas agree
// to <dir>/<mode>.<RANK>.agree.
TEST(MultiProcessChild, Run) {
  const char* dir = std::getenv(kChildDir);
  const char* mode_env = std::getenv(kChildMode);
  if (dir == nullptr || mode_env == nullptr) {
    GTEST_SKIP() << "one process of MultiProcessTest.*; started by it";
  }
  const std::string mode = mode_env;
  const ModelConfig config = SmallLlama();
  DataParallelOptions dp;
  dp.devices = {"cpu"};
  dp.timeout = std::chrono::seconds(60);
  ASSERT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(60), &dp), IsOk());
  const char* clip = std::getenv(kChildClip);
  const char* tier_dir = std::getenv(kChildTier);
  TrainerOptions options = Options(clip != nullptr ? std::atof(clip) : 1.0);
  if (tier_dir != nullptr) UseTier(tier_dir, &options);
  auto trainer = DataParallelTrainer::Create(config, options, kSeed, dp);
  ASSERT_THAT(trainer, IsOk());
  DataParallelTrainer& t = **trainer;
  ASSERT_EQ(t.num_processes(), 2);
  std::optional<NvmeMomentTier> tier;  // this process's files
  if (tier_dir != nullptr) {
    auto made = t.nvme_tier();
    ASSERT_THAT(made, IsOk());
    tier = *made;
  }
  const NvmeMomentTier* moments = tier.has_value() ? &*tier : nullptr;
  // WriteCheckpoint's output_dir: the checkpoints go to <it>/checkpoints/step-*.
  const std::string output_dir = std::string(dir) + "/job";
  int first = 0;
  if (mode == "resume") {
    std::string path;
    for (const auto& entry : std::filesystem::directory_iterator(output_dir + "/checkpoints")) {
      if (entry.path().filename().string().rfind("step-", 0) == 0) path = entry.path().string();
    }
    ASSERT_FALSE(path.empty());
    auto read = ReadCheckpoint(path, &t.store(), moments);
    ASSERT_THAT(read, IsOk());
    t.set_step(read->step);
    first = static_cast<int>(read->step);
  }
  for (int s = first; s < kSteps; ++s) {
    auto r = t.Step(Batch(config, s));
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->step, s + 1);
    if (mode == "train" && r->step == kCheckpointStep && t.writes_checkpoints()) {
      ASSERT_THAT(t.WaitForOptimizer(), IsOk());
      CheckpointState state;
      state.step = t.step();
      ASSERT_THAT(WriteCheckpoint(t.store(), state, output_dir, CheckpointSpec{}, moments), IsOk());
    }
  }
  auto agree = t.ReplicasAgree();
  ASSERT_THAT(agree, IsOk());
  const std::string base = std::string(dir) + "/" + mode + "." + std::to_string(t.process_rank());
  WriteFloats(base + ".bin",
              moments != nullptr ? AllState(t.store(), *moments) : AllState(t.store()));
  std::ofstream(base + ".agree") << (*agree ? "yes" : "no");
}

// One process of MultiProcessTierTest.OneProcessTruncatedFile... (mode
// "fail", the tier in kChildTier): after step 1 process 1 truncates its
// exp_avg file; both then step until a step fails and write that step's
// code, the seconds from the truncation to the failure and the message to
// <dir>/fail.<RANK>.status. The collective timeout is 60 s.
TEST(MultiProcessChild, Fail) {
  const char* dir = std::getenv(kChildDir);
  const char* tier_dir = std::getenv(kChildTier);
  if (dir == nullptr || tier_dir == nullptr) {
    GTEST_SKIP() << "one process of MultiProcessTierTest.*; started by it";
  }
  const ModelConfig config = SmallLlama();
  DataParallelOptions dp;
  dp.devices = {"cpu"};
  dp.timeout = std::chrono::seconds(60);
  ASSERT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(60), &dp), IsOk());
  TrainerOptions options = Options();
  UseTier(tier_dir, &options);
  auto trainer = DataParallelTrainer::Create(config, options, kSeed, dp);
  ASSERT_THAT(trainer, IsOk());
  DataParallelTrainer& t = **trainer;
  ASSERT_THAT(t.Step(Batch(config, 0)), IsOk());
  ASSERT_THAT(t.WaitForOptimizer(), IsOk());
  // Both processes' updates of step 1 are done before process 1 truncates:
  // the comparison is a collective.
  ASSERT_THAT(t.ReplicasAgree(), IsOk());
  if (t.process_rank() == 1) {
    std::filesystem::resize_file(std::string(tier_dir) + "/exp_avg.rank-1-of-2.bin", 4096);
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status failed;
  for (int s = 1; s < kSteps + 2 && failed.ok(); ++s) failed = t.Step(Batch(config, s)).status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ofstream(std::string(dir) + "/fail." + std::to_string(t.process_rank()) + ".status")
      << static_cast<int>(failed.code()) << " " << seconds << "\n"
      << failed.message();
}

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Starts this binary twice as RANK 0 and 1 of a 2-process job in `mode`,
// waits up to `deadline`; kills both (by pid) at the deadline. True when
// both exited 0.
// `env`: more variables for both (kChildTier, kChildClip).
bool RunJob(const std::string& dir, const std::string& mode, std::chrono::seconds deadline,
            const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const int port = FreePort();
  EXPECT_GT(port, 0);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", "0", 1);
      setenv(kChildDir, dir.c_str(), 1);
      setenv(kChildMode, mode.c_str(), 1);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      const std::string filter =
          std::string("--gtest_filter=MultiProcessChild.") + (mode == "fail" ? "Fail" : "Run");
      execl("/proc/self/exe", "multi_process_child", filter.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::vector<int> status(2, -1);
  std::vector<bool> done(2, false);
  while ((!done[0] || !done[1]) && std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < 2; ++i) {
      if (!done[i] && waitpid(pids[i], &status[i], WNOHANG) == pids[i]) done[i] = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  bool ok = true;
  for (size_t i = 0; i < 2; ++i) {
    if (!done[i]) {
      ADD_FAILURE() << mode << ": process " << i << " still running after " << deadline.count()
                    << " s (a hung rendezvous or collective); killed";
      kill(pids[i], SIGKILL);
      waitpid(pids[i], &status[i], 0);
      ok = false;
    } else if (!WIFEXITED(status[i]) || WEXITSTATUS(status[i]) != 0) {
      ADD_FAILURE() << mode << ": process " << i << " failed (status " << status[i] << ")";
      ok = false;
    }
  }
  return ok;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  in >> s;
  return s;
}

TEST(MultiProcessTest, TwoProcessesMatchOneAccumulatingAndResumeExactly) {
  if (!HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build";
  const std::string dir = testing::MakeTempDir("dist-mp");
  ASSERT_TRUE(RunJob(dir, "train", std::chrono::seconds(240)));
  const std::vector<float> p0 = ReadFloats(dir + "/train.0.bin");
  const std::vector<float> p1 = ReadFloats(dir + "/train.1.bin");
  ASSERT_FALSE(p0.empty());
  // The replicas: bit-identical, and each process saw it (ReplicasAgree).
  EXPECT_TRUE(BitIdentical(p0, p1));
  EXPECT_EQ(ReadText(dir + "/train.0.agree"), "yes");
  EXPECT_EQ(ReadText(dir + "/train.1.agree"), "yes");
  // Checkpoints written once: process 0's only.
  int checkpoints = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/job/checkpoints")) {
    checkpoints += entry.path().filename().string().rfind("step-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(checkpoints, 1);

  const ModelConfig config = SmallLlama();
  // Two ranks as threads of one process: the same all-reduce (two fp32
  // addends), the same bits.
  DataParallelOptions threads;
  threads.devices = {"cpu", "cpu"};
  threads.timeout = std::chrono::seconds(60);
  auto dp = DataParallelTrainer::Create(config, Options(), kSeed, threads);
  ASSERT_THAT(dp, IsOk());
  for (int s = 0; s < kSteps; ++s) ASSERT_THAT((*dp)->Step(Batch(config, s)), IsOk());
  ASSERT_THAT((*dp)->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(BitIdentical(AllState((*dp)->store()), p0));

  // One process, one device, accumulating all 4 micro-batches (twice each
  // process's 2): the fp32 summation order differs (Note [Gradient
  // all-reduce]), hence 1e-6 relative, not bits.
  auto single = Trainer::Create(config, Options(), kSeed);
  ASSERT_THAT(single, IsOk());
  for (int s = 0; s < kSteps; ++s) ASSERT_THAT((*single)->Step(Batch(config, s)), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  const double err = RelativeError(p0, AllState((*single)->store()));
  EXPECT_LE(err, 1e-6);
  std::fprintf(stderr, "2 processes vs 1 accumulating: %.3g relative\n", err);

  // Resume from process 0's checkpoint on two processes: bit for bit.
  ASSERT_TRUE(RunJob(dir, "resume", std::chrono::seconds(240)));
  EXPECT_TRUE(BitIdentical(ReadFloats(dir + "/resume.0.bin"), p0));
  EXPECT_TRUE(BitIdentical(ReadFloats(dir + "/resume.1.bin"), p0));
}

// Note [Tier shards] in engine/store/nvme_tier.h, parameterised by
// max_grad_norm: two processes given one NVMe directory keep their
// replicas' moments in files of their own, named by global rank (one
// device each: exp_avg.rank-0-of-2.bin and exp_avg.rank-1-of-2.bin, each
// the whole store's layout), and train bit for bit as two processes
// without the tier (the same AdamW on the same values: Note [Tiered
// trainer] in engine/step/trainer.h); their replicas agree, the moments
// read back from the files. Process 0's checkpoint (its moments read from
// its files) resumes on two tiered processes bit for bit, and loads on one
// device without the tier, which continues within 1e-6 L2-relative (the
// fp32 summation order of one device's accumulation; Note [Gradient
// all-reduce]).
class MultiProcessTierTest : public ::testing::TestWithParam<double> {};

TEST_P(MultiProcessTierTest, TwoTieredProcessesEqualTwoWithoutTheTierAndResumeExactly) {
  if (!HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build";
  const double clip = GetParam();
  const std::string dir = testing::MakeTempDir("dist-mp-tier");
  const std::string plain = dir + "/plain", tiered = dir + "/tier", nvme = dir + "/nvme";
  for (const std::string& d : {plain, tiered, nvme}) std::filesystem::create_directories(d);
  const std::pair<std::string, std::string> clip_env{kChildClip, std::to_string(clip)};
  const std::pair<std::string, std::string> tier_env{kChildTier, nvme};
  ASSERT_TRUE(RunJob(plain, "train", std::chrono::seconds(240), {clip_env}));
  ASSERT_TRUE(RunJob(tiered, "train", std::chrono::seconds(240), {clip_env, tier_env}));
  const std::vector<float> reference = ReadFloats(plain + "/train.0.bin");
  ASSERT_FALSE(reference.empty());
  for (const char* p : {"0", "1"}) {
    EXPECT_TRUE(BitIdentical(ReadFloats(tiered + "/train." + p + ".bin"), reference))
        << "process " << p << ", tier vs none";
    EXPECT_EQ(ReadText(tiered + "/train." + p + ".agree"), "yes") << "process " << p;
  }
  for (const char* name : {"exp_avg.rank-0-of-2.bin", "exp_avg.rank-1-of-2.bin",
                           "exp_avg_sq.rank-0-of-2.bin", "exp_avg_sq.rank-1-of-2.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(nvme + "/" + name)) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(nvme + "/exp_avg.bin"));

  ASSERT_TRUE(RunJob(tiered, "resume", std::chrono::seconds(240), {clip_env, tier_env}));
  for (const char* p : {"0", "1"}) {
    EXPECT_TRUE(BitIdentical(ReadFloats(tiered + "/resume." + p + ".bin"), reference))
        << "process " << p << ", resumed";
  }
  std::string checkpoint;
  for (const auto& entry : std::filesystem::directory_iterator(tiered + "/job/checkpoints")) {
    if (entry.path().filename().string().rfind("step-", 0) == 0) checkpoint = entry.path();
  }
  ASSERT_FALSE(checkpoint.empty());
  const ModelConfig config = SmallLlama();
  auto single = Trainer::Create(config, Options(clip), kSeed);
  ASSERT_THAT(single, IsOk());
  auto read = ReadCheckpoint(checkpoint, &(*single)->store());
  ASSERT_THAT(read, IsOk());
  (*single)->set_step(read->step);
  for (int s = static_cast<int>(read->step); s < kSteps; ++s) {
    ASSERT_THAT((*single)->Step(Batch(config, s)), IsOk());
  }
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  EXPECT_LE(RelativeError(AllState((*single)->store()), reference), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Clipping, MultiProcessTierTest, ::testing::Values(1.0, 0.0),
                         [](const auto& info) { return info.param > 0 ? "Clip" : "NoClip"; });

// An I/O error in process 1's tier files (its exp_avg truncated between
// steps) fails a later step there with DATA_LOSS naming the file; process
// 1 still meets process 0 in that step's first collective
// (GradientReducer::BeginStep), so process 0 fails the same step with
// UNAVAILABLE at once, not at the 60 s collective timeout: both within
// half of it (a step of this model takes well under a second).
TEST(MultiProcessTierTest, OneProcessTruncatedFileFailsBothBeforeTheTimeout) {
  if (!HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build";
  const std::string dir = testing::MakeTempDir("dist-mp-tier-fail");
  const std::string nvme = dir + "/nvme";
  std::filesystem::create_directories(nvme);
  ASSERT_TRUE(RunJob(dir, "fail", std::chrono::seconds(240), {{kChildTier, nvme}}));
  const std::vector<std::pair<absl::StatusCode, std::string>> expected = {
      {absl::StatusCode::kUnavailable, "ranks cannot run the step"},
      {absl::StatusCode::kDataLoss, nvme + "/exp_avg.rank-1-of-2.bin"}};
  for (size_t p = 0; p < 2; ++p) {
    std::ifstream in(dir + "/fail." + std::to_string(p) + ".status");
    int code = 0;
    double seconds = 0;
    std::string message;
    in >> code >> seconds;
    std::getline(in >> std::ws, message);
    EXPECT_EQ(static_cast<absl::StatusCode>(code), expected[p].first) << "process " << p;
    EXPECT_THAT(message, HasSubstr(expected[p].second)) << "process " << p;
    EXPECT_LT(seconds, 30.0) << "process " << p;
  }
}

void ClearTorchrunEnv() {
  for (const char* name : {"WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK"}) {
    unsetenv(name);
  }
}

TEST(MultiProcessTest, BadTorchrunVariablesAreNamed) {
  ClearTorchrunEnv();
  DataParallelOptions dp;
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WORLD_SIZE: not set")));
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_ADDR: not set")));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_PORT: not set")));
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_PORT: must be")));
  setenv("MASTER_PORT", "29500", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK: not set")));
  setenv("RANK", "2", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("RANK: must be an integer in [0, 1], got '2'")));
  setenv("RANK", "1", 1);
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(1), &dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LOCAL_RANK: not set")));
  ClearTorchrunEnv();
}

// Rank 1 with no master listening: UNAVAILABLE naming MASTER_ADDR:MASTER_PORT
// once the timeout (2 s) passed, not a hang.
TEST(MultiProcessTest, UnreachableMasterFailsWithinTheTimeout) {
  ClearTorchrunEnv();
  const int port = FreePort();
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("RANK", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  DataParallelOptions dp;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(JoinFromTorchrunEnv(std::chrono::seconds(2), &dp),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("MASTER_ADDR:MASTER_PORT (127.0.0.1:" + std::to_string(port))));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  ClearTorchrunEnv();
}

// Rank 0 serves, nobody else comes: joining the group fails after the
// collective timeout with UNAVAILABLE instead of waiting for ever.
TEST(MultiProcessTest, MissingPeerFailsTheJoinWithinTheTimeout) {
  if (!HasCollectiveBackend("cpu")) GTEST_SKIP() << "no gloo in this build";
  TorchrunEnv env{"127.0.0.1", 0, 2, 0, 0};
  auto store = RendezvousStore::CreateTcp(env, std::chrono::seconds(2));
  ASSERT_THAT(store, IsOk());
  DataParallelOptions dp;
  dp.devices = {"cpu"};
  dp.timeout = std::chrono::seconds(2);
  dp.rendezvous = *store;
  dp.process_rank = 0;
  dp.num_processes = 2;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(DataParallelTrainer::Create(SmallLlama(), Options(), kSeed, dp),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  // A process count with no rendezvous store is refused by name.
  dp.rendezvous = nullptr;
  EXPECT_THAT(DataParallelTrainer::Create(SmallLlama(), Options(), kSeed, dp),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK: must be in [0, ")));
}

}  // namespace
}  // namespace megatrain::engine
