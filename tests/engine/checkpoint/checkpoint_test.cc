// Tests of engine/checkpoint/checkpoint.h: write -> read bit-identical (masters and
// AdamW moments) with every state field; corruption, truncation and missing
// files detected as DATA_LOSS naming the file; a different model refused;
// crash safety (leftover temporary directories); a full disk (a real ENOSPC
// on a small tmpfs, as root) and a file size limit (EFBIG): the error names
// the file, the partial checkpoint is removed, earlier ones stay loadable;
// retention; export to HF;
// and exact resume of a CPU Trainer (6 steps in one go == 3 + checkpoint +
// fresh trainer + 3, bit for bit).
#include "engine/checkpoint/checkpoint.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/data/batch.h"
#include "engine/runtime/bf16.h"
#include "engine/formats/hf_model.h"
#include "engine/store/host_store.h"
#include "engine/model/model_config.h"
#include "engine/step/trainer.h"
#include "engine/job/training_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tmpfs.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::WriteFileBytes;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 2-layer, hidden-64 Llama with GQA: every tensor kind, milliseconds to
// checkpoint and to train on 2 cores.
ModelConfig TinyConfig(int64_t layers = 2, int64_t intermediate = 128) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  return c;
}

// A store with optimizer state: HF-initialised masters (seed) and moments
// filled with fixed pseudo-random values (exp_avg_sq positive, as in AdamW).
std::unique_ptr<HostStore> MakeStore(const ModelConfig& config, uint64_t seed,
                                     bool streaming_bf16 = false) {
  HostStoreOptions options;
  options.streaming_bf16 = streaming_bf16;
  absl::StatusOr<std::unique_ptr<HostStore>> store = HostStore::Create(config, options);
  EXPECT_THAT(store, IsOk());
  (*store)->InitializeWeights(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t block = 0; block < (*store)->num_blocks(); ++block) {
    for (int64_t i = 0; i < (*store)->block_numel(block); ++i) {
      (*store)->exp_avg(block)[i] = 1e-3f * uniform(rng);
      (*store)->exp_avg_sq(block)[i] = 1e-6f * (1.0f + uniform(rng));
    }
  }
  return *std::move(store);
}

std::vector<int64_t> Steps(const std::vector<CheckpointInfo>& infos) {
  std::vector<int64_t> steps;
  for (const CheckpointInfo& info : infos) steps.push_back(info.step);
  return steps;
}

void ExpectBuffersBitIdentical(const HostStore& expected, const HostStore& actual,
                               bool moments = true) {
  ASSERT_EQ(expected.num_blocks(), actual.num_blocks());
  for (int64_t block = 0; block < expected.num_blocks(); ++block) {
    const size_t bytes = expected.block_numel(block) * sizeof(float);
    EXPECT_EQ(std::memcmp(expected.master(block), actual.master(block), bytes), 0)
        << "master, block " << block;
    if (!moments) continue;
    EXPECT_EQ(std::memcmp(expected.exp_avg(block), actual.exp_avg(block), bytes), 0)
        << "exp_avg, block " << block;
    EXPECT_EQ(std::memcmp(expected.exp_avg_sq(block), actual.exp_avg_sq(block), bytes), 0)
        << "exp_avg_sq, block " << block;
  }
}

CheckpointState StateAt(int64_t step) {
  CheckpointState state;
  state.step = step;
  state.rng_state = std::numeric_limits<uint64_t>::max() - 7;  // beyond 2^53
  state.data_cursor_json = R"({"epoch": 2, "position": 12345})";
  state.job_spec_json = "{\"name\": \"tiny \\\"quoted\\\"\",\n \"note\": \"é\"}";
  state.schedule_json = R"({"kind":"cosine","warmup_steps":2,"total_steps":6})";
  return state;
}

CheckpointSpec KeepAll() {
  CheckpointSpec spec;
  spec.keep_last = 1000;
  return spec;
}

CheckpointSpec KeepLast(int64_t count) {
  CheckpointSpec spec;
  spec.keep_last = count;
  return spec;
}

void FlipByte(const std::string& path, std::streamoff offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekg(offset);
  const char byte = static_cast<char>(file.get());
  file.seekp(offset);
  file.put(static_cast<char>(byte ^ 0x01));
}

TEST(CheckpointTest, WriteReadIsBitIdenticalWithEveryStateField) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/1);
  const CheckpointState state = StateAt(7);

  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, state, output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  std::unique_ptr<HostStore> restored =
      MakeStore(TinyConfig(), /*seed=*/2, /*streaming_bf16=*/true);
  absl::StatusOr<CheckpointState> read = ReadCheckpoint(info->dir, restored.get());
  ASSERT_THAT(read, IsOk());

  EXPECT_EQ(info->dir, output_dir + "/checkpoints/step-00000007");
  EXPECT_EQ(info->step, 7);
  EXPECT_THAT(ListDir(info->dir), ElementsAre("config.json", "exp_avg.bin", "exp_avg_sq.bin",
                                              "manifest.json", "master.bin", "state.json"));
  int64_t bytes = 0;
  for (const std::string& name : ListDir(info->dir)) {
    bytes += std::filesystem::file_size(info->dir + "/" + name);
  }
  EXPECT_EQ(info->bytes, bytes);
  ExpectBuffersBitIdentical(*source, *restored);
  EXPECT_EQ(read->step, state.step);
  EXPECT_EQ(read->rng_state, state.rng_state);
  EXPECT_EQ(read->data_cursor_json, state.data_cursor_json);
  EXPECT_EQ(read->job_spec_json, state.job_spec_json);
  EXPECT_EQ(read->schedule_json, state.schedule_json);
  for (int64_t block = 0; block < restored->num_blocks(); ++block) {
    for (int64_t i = 0; i < restored->block_numel(block); ++i) {
      ASSERT_EQ(restored->streaming_bf16(block)[i], FloatToBf16(source->master(block)[i]))
          << "streaming copy not refreshed, block " << block;
    }
  }
  absl::StatusOr<ModelConfig> config = ReadCheckpointConfig(info->dir);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->ToHfConfigJson(), source->config().ToHfConfigJson());
}

class CheckpointCorruptionTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointCorruptionTest, FlippedByteIsDataLossNamingTheFile) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/3);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(3), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  const std::string path = info->dir + "/" + GetParam();
  // The middle of the file: tensor data for .bin, a value for .json.
  FlipByte(path, static_cast<std::streamoff>(std::filesystem::file_size(path) / 2));
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/4);

  EXPECT_THAT(ReadCheckpoint(info->dir, restored.get()),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr("XXH64"))));
}

INSTANTIATE_TEST_SUITE_P(EveryFile, CheckpointCorruptionTest,
                         ::testing::Values("master.bin", "exp_avg.bin", "exp_avg_sq.bin",
                                           "state.json", "config.json"));

TEST(CheckpointOwnershipTest, JobIdAndManifestHashAreWrittenAndVerified) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/11);
  CheckpointState state = StateAt(5);
  state.job_id = "job-000003";
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, state, output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->job_id, "job-000003");
  EXPECT_NE(info->manifest_xxh64, 0u);

  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/12);
  absl::StatusOr<CheckpointState> read = ReadCheckpoint(info->dir, restored.get());
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->job_id, "job-000003");
  for (const bool check_data : {false, true}) {
    absl::StatusOr<CheckpointInfo> verified = VerifyCheckpoint(info->dir, check_data);
    ASSERT_THAT(verified, IsOk());
    EXPECT_EQ(verified->step, 5);
    EXPECT_EQ(verified->job_id, "job-000003");
    EXPECT_EQ(verified->manifest_xxh64, info->manifest_xxh64);
    EXPECT_EQ(verified->bytes, info->bytes);
  }
}

TEST(CheckpointOwnershipTest, StandaloneCheckpointNamesNoJob) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/13);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(2), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  std::ifstream state_file(info->dir + "/state.json");
  const std::string text((std::istreambuf_iterator<char>(state_file)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::Not(HasSubstr("job_id")));  // as format-1 readers expect
  absl::StatusOr<CheckpointInfo> verified = VerifyCheckpoint(info->dir, /*check_data=*/true);
  ASSERT_THAT(verified, IsOk());
  EXPECT_EQ(verified->job_id, "");
}

TEST(CheckpointOwnershipTest, VerifyWithDataFindsACorruptTensorFile) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/14);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(4), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  const std::string path = info->dir + "/exp_avg_sq.bin";
  FlipByte(path, static_cast<std::streamoff>(std::filesystem::file_size(path) / 2));
  // Without the data only the manifest and state are read: still "intact".
  EXPECT_THAT(VerifyCheckpoint(info->dir, /*check_data=*/false), IsOk());
  EXPECT_THAT(VerifyCheckpoint(info->dir, /*check_data=*/true),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr("XXH64"))));
  std::filesystem::remove(info->dir + "/manifest.json");
  EXPECT_THAT(VerifyCheckpoint(info->dir, /*check_data=*/false),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("manifest.json: missing")));
  EXPECT_THAT(VerifyCheckpoint(output_dir + "/checkpoints/step-00000099", false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such checkpoint directory")));
}

TEST(CheckpointTest, TruncatedFileIsDataLoss) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/5);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(5), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  const std::string path = info->dir + "/exp_avg.bin";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/6);
  std::unique_ptr<HostStore> untouched = MakeStore(TinyConfig(), /*seed=*/6);

  EXPECT_THAT(
      ReadCheckpoint(info->dir, restored.get()),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path), HasSubstr("truncated"))));
  // Sizes are checked before anything is copied.
  ExpectBuffersBitIdentical(*untouched, *restored);
}

TEST(CheckpointTest, MissingFileIsDataLoss) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/7);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(1), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/8);

  std::filesystem::remove(info->dir + "/exp_avg_sq.bin");
  EXPECT_THAT(ReadCheckpoint(info->dir, restored.get()),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("exp_avg_sq.bin"), HasSubstr("missing"))));
  std::filesystem::remove(info->dir + "/manifest.json");
  EXPECT_THAT(ReadCheckpoint(info->dir, restored.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("manifest.json")));
  EXPECT_THAT(ReadCheckpoint(output_dir + "/checkpoints/step-00000099", restored.get()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("step-00000099")));
}

TEST(CheckpointTest, DifferentModelIsFailedPrecondition) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/9);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(2), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());

  std::unique_ptr<HostStore> deeper = MakeStore(TinyConfig(/*layers=*/3), /*seed=*/10);
  EXPECT_THAT(ReadCheckpoint(info->dir, deeper.get()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("2 decoder layers"), HasSubstr("3 decoder layers"))));
  std::unique_ptr<HostStore> wider = MakeStore(TinyConfig(2, /*intermediate=*/192), /*seed=*/10);
  EXPECT_THAT(ReadCheckpoint(info->dir, wider.get()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'model.layers.0.mlp.gate_proj.weight'"),
                             HasSubstr("[128, 64] in the checkpoint"),
                             HasSubstr("[192, 64] in the store"))));
}

TEST(CheckpointTest, CrashLeavesPreviousCheckpointLoadable) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> step1 = MakeStore(TinyConfig(), /*seed=*/11);
  std::unique_ptr<HostStore> step2 = MakeStore(TinyConfig(), /*seed=*/12);
  ASSERT_THAT(WriteCheckpoint(*step1, StateAt(1), output_dir, KeepAll()), IsOk());
  absl::StatusOr<CheckpointInfo> last = WriteCheckpoint(*step2, StateAt(2), output_dir, KeepAll());
  ASSERT_THAT(last, IsOk());
  // A crash while writing step 3: its temporary directory holds partial
  // files and no manifest. And one in the middle of deleting a checkpoint.
  const std::string root = output_dir + "/checkpoints";
  std::filesystem::create_directories(root + "/.tmp-step-00000003.Ab12Cd");
  std::ofstream(root + "/.tmp-step-00000003.Ab12Cd/master.bin") << "MTCKPTBK partial";
  std::filesystem::create_directories(root + "/.tmp-delete-step-00000000");

  absl::StatusOr<std::vector<CheckpointInfo>> listed = ListCheckpoints(output_dir);
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(Steps(*listed), ElementsAre(1, 2));
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/13);
  absl::StatusOr<CheckpointState> state = ReadCheckpoint(listed->back().dir, restored.get());
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->step, 2);
  ExpectBuffersBitIdentical(*step2, *restored);

  // The next write leaves them alone: the writer did not record them (Note
  // [Checkpoint ledger]; a user may have put them there).
  ASSERT_THAT(WriteCheckpoint(*step2, StateAt(3), output_dir, KeepAll()), IsOk());
  EXPECT_THAT(ListDir(root),
              ElementsAre(".ledger.json", ".tmp-delete-step-00000000", ".tmp-step-00000003.Ab12Cd",
                          "step-00000001", "step-00000002", "step-00000003"));
}

// Note [Checkpoint ledger]: a temporary the writer recorded (a crashed
// write) is removed by the next write; one it did not record, and a
// `step-*` directory it did not publish, are never deleted.
TEST(CheckpointTest, OnlyRecordedEntriesAreDeleted) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  const std::string root = output_dir + "/checkpoints";
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), /*seed=*/26);
  ASSERT_THAT(WriteCheckpoint(*store, StateAt(2), output_dir, KeepLast(1)), IsOk());
  // Planted by a user: an older step and a temporary named like the writer's.
  std::filesystem::create_directories(root + "/step-00000001");
  std::ofstream(root + "/step-00000001/mine") << "mine";
  std::filesystem::create_directories(root + "/.tmp-step-00000003.XyZ123");
  // A crashed write of step 3, recorded in the ledger by the writer.
  std::filesystem::create_directories(root + "/.tmp-step-00000003.Ab12Cd");
  {
    std::ifstream in(root + "/.ledger.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_NE(text.find("\"step-00000002\""), std::string::npos) << text;
  }
  std::ofstream(root + "/.ledger.json", std::ios::trunc)
      << R"({"format": "megatrain-checkpoint-ledger", "version": 1,
             "checkpoints": ["step-00000002"], "temporaries": [".tmp-step-00000003.Ab12Cd"]})";

  ASSERT_THAT(WriteCheckpoint(*store, StateAt(4), output_dir, KeepLast(1)), IsOk());

  // Step 2 (published by the writer) was retired by keep_last 1; the
  // planted entries stay; the recorded leftover is gone.
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", ".tmp-step-00000003.XyZ123",
                                         "step-00000001", "step-00000004"));
  EXPECT_THAT(ListDir(root + "/step-00000001"), ElementsAre("mine"));
}

// Note [Checkpoint adoption]: checkpoints from before the ledger (here:
// its file deleted) come under retention once adopted from the job store's
// records; a directory nobody recorded, a link and a path outside
// checkpoints/ are not adopted.
TEST(CheckpointTest, AdoptedCheckpointsFromBeforeTheLedgerComeUnderRetention) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  const std::string root = output_dir + "/checkpoints";
  const std::string outside = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), /*seed=*/27);
  ASSERT_THAT(WriteCheckpoint(*store, StateAt(1), output_dir, KeepAll()), IsOk());
  ASSERT_THAT(WriteCheckpoint(*store, StateAt(2), output_dir, KeepAll()), IsOk());
  std::filesystem::remove(root + "/.ledger.json");  // written by a daemon without ledgers
  std::filesystem::create_directories(root + "/step-00000005");  // a user's, unrecorded
  std::filesystem::create_directories(outside + "/step-00000006");
  std::filesystem::create_directory_symlink(outside + "/step-00000006", root + "/step-00000006");

  // Without adoption retention leaves the unrecorded ones alone.
  ASSERT_THAT(WriteCheckpoint(*store, StateAt(3), output_dir, KeepLast(1)), IsOk());
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", "step-00000001", "step-00000002",
                                         "step-00000003", "step-00000005", "step-00000006"));

  // The job store's records: steps 1 and 2, a link at step 6, a path
  // outside checkpoints/ and one not named as the writer names steps.
  const std::vector<std::string> recorded = {root + "/step-00000001", root + "/step-00000002/",
                                             root + "/step-00000006", outside + "/step-00000006",
                                             root + "/step-1"};
  absl::StatusOr<int64_t> adopted = AdoptRecordedCheckpoints(output_dir, recorded);
  ASSERT_THAT(adopted, IsOk());
  EXPECT_EQ(*adopted, 2);
  adopted = AdoptRecordedCheckpoints(output_dir, recorded);  // already recorded
  ASSERT_THAT(adopted, IsOk());
  EXPECT_EQ(*adopted, 0);
  ASSERT_THAT(WriteCheckpoint(*store, StateAt(4), output_dir, KeepLast(1)), IsOk());

  EXPECT_THAT(ListDir(root),
              ElementsAre(".ledger.json", "step-00000004", "step-00000005", "step-00000006"));
  EXPECT_THAT(ListDir(outside + "/step-00000006"), ::testing::IsEmpty());
  // No checkpoints/ at all: nothing to adopt.
  adopted = AdoptRecordedCheckpoints(outside, {outside + "/checkpoints/step-00000001"});
  ASSERT_THAT(adopted, IsOk());
  EXPECT_EQ(*adopted, 0);
}

// A link in place of checkpoints/ fails adoption without writing through it.
TEST(CheckpointTest, AdoptionRefusesALinkedCheckpointsDirectory) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  const std::string outside = testing::MakeTempDir("checkpoint_test");
  std::filesystem::create_directories(outside + "/step-00000001");
  std::filesystem::create_directory_symlink(outside, output_dir + "/checkpoints");

  EXPECT_THAT(AdoptRecordedCheckpoints(output_dir, {output_dir + "/checkpoints/step-00000001"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_THAT(ListDir(outside), ElementsAre("step-00000001"));
}

// Bytes of one checkpoint of TinyConfig() (the sum of its files).
int64_t TinyCheckpointBytes() {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), /*seed=*/1);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*store, StateAt(1), output_dir, KeepAll());
  EXPECT_THAT(info, IsOk());
  return info.ok() ? info->bytes : 0;
}

TEST(CheckpointDiskFullTest, EnospcRemovesThePartialCheckpointAndKeepsTheEarlierOnes) {
  std::string why_not;
  // Room for one checkpoint and a half: the second write runs out.
  std::unique_ptr<testing::ScopedTmpfs> disk =
      testing::ScopedTmpfs::Mount(TinyCheckpointBytes() * 3 / 2, &why_not);
  if (disk == nullptr) GTEST_SKIP() << why_not;
  const std::string output_dir = disk->path();
  const std::string root = output_dir + "/checkpoints";
  std::unique_ptr<HostStore> step1 = MakeStore(TinyConfig(), /*seed=*/21);
  std::unique_ptr<HostStore> step2 = MakeStore(TinyConfig(), /*seed=*/22);
  ASSERT_THAT(WriteCheckpoint(*step1, StateAt(1), output_dir, KeepAll()), IsOk());

  EXPECT_THAT(
      WriteCheckpoint(*step2, StateAt(2), output_dir, KeepAll()),
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          AllOf(HasSubstr("writing checkpoint step-00000002: " + root + "/.tmp-step-00000002."),
                HasSubstr(": write: No space left on device (ENOSPC)"), HasSubstr("was removed"),
                HasSubstr("earlier checkpoints are intact (newest: " + root + "/step-00000001)"))));
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", "step-00000001"));
  // Replacing an existing step on a full disk keeps the old one too.
  EXPECT_THAT(WriteCheckpoint(*step2, StateAt(1), output_dir, KeepAll()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("(ENOSPC)")));
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", "step-00000001"));
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/23);
  absl::StatusOr<CheckpointState> state = ReadCheckpoint(root + "/step-00000001", restored.get());
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->step, 1);
  ExpectBuffersBitIdentical(*step1, *restored);
}

// RLIMIT_FSIZE (`ulimit -f`): a write past the limit fails with EFBIG once
// SIGXFSZ, which would kill the process, is ignored. Needs no root.
TEST(CheckpointDiskFullTest, FileSizeLimitIsResourceExhaustedAndCleansUp) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  const std::string root = output_dir + "/checkpoints";
  std::unique_ptr<HostStore> step1 = MakeStore(TinyConfig(), /*seed=*/24);
  ASSERT_THAT(WriteCheckpoint(*step1, StateAt(1), output_dir, KeepAll()), IsOk());

  struct rlimit saved_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  struct rlimit limit = saved_limit;
  limit.rlim_cur = 64 << 10;  // the JSON files fit, the tensor files (~360 KB) do not
  const sighandler_t saved_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const absl::StatusOr<CheckpointInfo> written =
      WriteCheckpoint(*step1, StateAt(2), output_dir, KeepAll());
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  ::signal(SIGXFSZ, saved_handler);

  EXPECT_THAT(written, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(HasSubstr("/master.bin: write: File too large (EFBIG)"),
                                      HasSubstr("was removed"))));
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", "step-00000001"));
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/25);
  ASSERT_THAT(ReadCheckpoint(root + "/step-00000001", restored.get()), IsOk());
  ExpectBuffersBitIdentical(*step1, *restored);
}

TEST(CheckpointTest, RetentionKeepsLastKPlusEveryMth) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), /*seed=*/14);
  CheckpointSpec retention;
  retention.keep_last = 2;
  retention.keep_every = 3;

  for (int64_t step = 1; step <= 8; ++step) {
    ASSERT_THAT(WriteCheckpoint(*store, StateAt(step), output_dir, retention), IsOk());
  }

  absl::StatusOr<std::vector<CheckpointInfo>> listed = ListCheckpoints(output_dir);
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(Steps(*listed), ElementsAre(3, 6, 7, 8));
  EXPECT_THAT(ListDir(output_dir + "/checkpoints"),
              ElementsAre(".ledger.json", "step-00000003", "step-00000006", "step-00000007",
                          "step-00000008"));
}

TEST(CheckpointTest, RewritingAStepReplacesIt) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> first = MakeStore(TinyConfig(), /*seed=*/15);
  std::unique_ptr<HostStore> second = MakeStore(TinyConfig(), /*seed=*/16);
  CheckpointState state = StateAt(5);
  ASSERT_THAT(WriteCheckpoint(*first, state, output_dir, KeepAll()), IsOk());
  state.rng_state = 42;

  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*second, state, output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());

  EXPECT_THAT(ListDir(output_dir + "/checkpoints"), ElementsAre(".ledger.json", "step-00000005"));
  std::unique_ptr<HostStore> restored = MakeStore(TinyConfig(), /*seed=*/17);
  absl::StatusOr<CheckpointState> read = ReadCheckpoint(info->dir, restored.get());
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->rng_state, 42u);
  ExpectBuffersBitIdentical(*second, *restored);
}

TEST(CheckpointTest, ListCheckpointsOfMissingAndEmptyDirectories) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");

  EXPECT_THAT(ListCheckpoints(output_dir + "/nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  absl::StatusOr<std::vector<CheckpointInfo>> listed = ListCheckpoints(output_dir);
  ASSERT_THAT(listed, IsOk());
  EXPECT_TRUE(listed->empty());
}

TEST(CheckpointTest, BadArgumentsAreRefused) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), /*seed=*/18);
  CheckpointSpec retention;
  retention.keep_last = 0;
  EXPECT_THAT(WriteCheckpoint(*store, StateAt(1), output_dir, retention),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint.keep_last")));
  CheckpointState state = StateAt(1);
  state.data_cursor_json = "\xff\xfe";
  EXPECT_THAT(WriteCheckpoint(*store, state, output_dir, KeepAll()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state.data_cursor_json")));
  HostStoreOptions weights_only;
  weights_only.optimizer_state = false;
  absl::StatusOr<std::unique_ptr<HostStore>> no_moments =
      HostStore::Create(TinyConfig(), weights_only);
  ASSERT_THAT(no_moments, IsOk());
  EXPECT_THAT(WriteCheckpoint(**no_moments, StateAt(1), output_dir, KeepAll()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("optimizer state")));
  EXPECT_FALSE(std::filesystem::exists(output_dir + "/checkpoints/step-00000001"));
}

TEST(CheckpointTest, ExportHfModelWritesTheMasters) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/19);
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(*source, StateAt(4), output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  const std::string out = output_dir + "/hf";

  ASSERT_THAT(ExportHfModel(info->dir, out, "fp32"), IsOk());
  absl::StatusOr<ModelConfig> config = LoadHfConfig(out);
  ASSERT_THAT(config, IsOk());
  HostStoreOptions options;
  options.optimizer_state = false;
  absl::StatusOr<std::unique_ptr<HostStore>> loaded = HostStore::Create(*config, options);
  ASSERT_THAT(loaded, IsOk());
  ASSERT_THAT(LoadHfWeights(out, loaded->get()), IsOk());

  ExpectBuffersBitIdentical(*source, **loaded, /*moments=*/false);
  EXPECT_THAT(ExportHfModel(info->dir, output_dir + "/hf8", "int8"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(ExportHfModel(output_dir + "/nope", output_dir + "/hf2", "bf16"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

// Deterministic token batches: step `step` always gets the same tokens.
std::vector<MicroBatch> BatchesForStep(int64_t step, int64_t micro_batch, int64_t seq_len,
                                       int64_t vocab_size) {
  std::vector<MicroBatch> batches(2);
  std::mt19937 rng(static_cast<uint32_t>(1000 + step));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab_size - 1));
  for (MicroBatch& batch : batches) {
    std::vector<int32_t> stream(micro_batch * (seq_len + 1));
    for (int32_t& t : stream) t = token(rng);
    for (int64_t b = 0; b < micro_batch; ++b) {
      for (int64_t t = 0; t < seq_len; ++t) {
        batch.input_ids.push_back(stream[b * (seq_len + 1) + t]);
        batch.labels.push_back(stream[b * (seq_len + 1) + t + 1]);
      }
    }
  }
  return batches;
}

TrainerOptions ResumeOptions() {
  TrainerOptions options;
  options.device = "cpu";
  options.compute_dtype = ComputeDtype::kFp32;
  options.micro_batch = 2;
  options.seq_len = 16;
  options.adamw.lr = 1e-2;
  options.adamw.weight_decay = 0.1;
  options.schedule.kind = LrScheduleKind::kCosine;
  options.schedule.warmup_steps = 2;
  options.schedule.total_steps = 6;
  options.schedule.min_lr_ratio = 0.1;
  options.threads = 2;  // fixed: reductions are deterministic for a thread count
  return options;
}

void TrainSteps(Trainer* trainer, int64_t steps) {
  for (int64_t i = 0; i < steps; ++i) {
    const TrainerOptions& o = trainer->options();
    absl::StatusOr<StepResult> result = trainer->Step(BatchesForStep(
        trainer->step() + 1, o.micro_batch, o.seq_len, trainer->config().vocab_size));
    ASSERT_THAT(result, IsOk());
    ASSERT_FALSE(result->skipped);
  }
  // Updates run on the trainer's optimizer thread (Note [Optimizer overlap]).
  ASSERT_THAT(trainer->WaitForOptimizer(), IsOk());
}

TEST(CheckpointResumeTest, ResumeIsBitIdenticalToAnUninterruptedRun) {
  const std::string output_dir = testing::MakeTempDir("checkpoint_test");
  const ModelConfig config = TinyConfig();
  constexpr uint64_t kSeed = 20;

  // Uninterrupted: 6 steps.
  absl::StatusOr<std::unique_ptr<Trainer>> straight =
      Trainer::Create(config, ResumeOptions(), kSeed);
  ASSERT_THAT(straight, IsOk());
  TrainSteps(straight->get(), 6);

  // Interrupted: 3 steps, checkpoint, a fresh trainer (other seed), restore,
  // 3 more steps.
  absl::StatusOr<std::unique_ptr<Trainer>> first = Trainer::Create(config, ResumeOptions(), kSeed);
  ASSERT_THAT(first, IsOk());
  TrainSteps(first->get(), 3);
  CheckpointState state = StateAt((*first)->step());
  absl::StatusOr<CheckpointInfo> info =
      WriteCheckpoint((*first)->store(), state, output_dir, KeepAll());
  ASSERT_THAT(info, IsOk());
  first->reset();
  absl::StatusOr<std::unique_ptr<Trainer>> resumed =
      Trainer::Create(config, ResumeOptions(), kSeed + 1);
  ASSERT_THAT(resumed, IsOk());
  absl::StatusOr<CheckpointState> restored = ReadCheckpoint(info->dir, &(*resumed)->store());
  ASSERT_THAT(restored, IsOk());
  (*resumed)->set_step(restored->step);
  TrainSteps(resumed->get(), 3);

  EXPECT_EQ(restored->step, 3);
  EXPECT_EQ((*resumed)->step(), 6);
  ExpectBuffersBitIdentical((*straight)->store(), (*resumed)->store());
  // The run really moved the weights (the comparison is not vacuous).
  std::unique_ptr<HostStore> initial = MakeStore(config, kSeed);
  EXPECT_NE(std::memcmp(initial->master(1), (*resumed)->store().master(1),
                        initial->block_numel(1) * sizeof(float)),
            0);
}

}  // namespace
}  // namespace megatrain::engine
