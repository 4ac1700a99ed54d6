// Issue 36, Note [Held output directory] (engine/fs/held_output_dir.h): a
// job's output_dir is walked from its root without following links at
// start and held; a parent swapped for a symbolic link mid-run fails the
// job's next checkpoint, and nothing is written or deleted where the link
// leads (outside the roots, or another user's job directory).
#include "engine/fs/held_output_dir.h"

#include <filesystem>
#include <memory>
#include <string>

#include "engine/checkpoint/checkpoint.h"
#include "engine/model/model_config.h"
#include "engine/store/host_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  return c;
}

class HeldOutputDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir("held");
    root_ = base_ + "/out";  // the output root
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/mallory/runs");
    fs::create_directories(outside_);
    HostStoreOptions options;
    auto store = HostStore::Create(TinyConfig(), options);
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
    store_->InitializeWeights(1);
  }

  absl::StatusOr<CheckpointInfo> Write(const std::string& output_dir, int64_t step,
                                       int64_t keep_last = 1) {
    CheckpointState state;
    state.step = step;
    CheckpointSpec retention;
    retention.keep_last = keep_last;
    return WriteCheckpoint(*store_, state, output_dir, retention);
  }

  // Replaces directory `path` by a symbolic link to `target` (the old
  // directory moved aside), as a user who may write its parent can.
  static void SwapForLink(const std::string& path, const std::string& target) {
    fs::rename(path, path + ".moved");
    fs::create_directory_symlink(target, path);
  }

  std::string base_, root_, outside_;
  std::unique_ptr<HostStore> store_;
};

TEST_F(HeldOutputDirTest, LinkBelowTheRootFailsTheStartAndCreatesNothingWhereItLeads) {
  fs::create_directory_symlink(outside_, root_ + "/mallory/escape");
  EXPECT_THAT(HeldOutputDir::Open(root_ + "/mallory/escape/run", {root_}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_FALSE(fs::exists(outside_ + "/run"));
}

TEST_F(HeldOutputDirTest, ParentSwappedForALinkOutsideFailsTheNextCheckpoint) {
  const std::string output_dir = root_ + "/mallory/runs/run1";
  absl::StatusOr<HeldOutputDir> held = HeldOutputDir::Open(output_dir, {root_});
  ASSERT_THAT(held, IsOk());
  ScopedHeldOutputDir scope(&*held);
  ASSERT_THAT(Write(output_dir, 1), IsOk());
  // Mid-run: runs/ becomes a link to a directory outside every root that
  // has a run1/ of its own.
  fs::create_directories(outside_ + "/run1");
  SwapForLink(root_ + "/mallory/runs", outside_);
  EXPECT_THAT(Write(output_dir, 2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("no longer leads to the job's directory")));
  EXPECT_TRUE(fs::is_empty(outside_ + "/run1"));  // nothing written outside
  // The job's own checkpoint stayed where it was written.
  EXPECT_TRUE(fs::exists(root_ + "/mallory/runs.moved/run1/checkpoints/step-00000001"));
}

TEST_F(HeldOutputDirTest, ParentSwappedOntoAnotherJobsDirectoryLeavesItsCheckpointsAlone) {
  // The victim's job directory, with two checkpoints in her ledger.
  const std::string victim = root_ + "/jobs/job-000002";
  {
    absl::StatusOr<HeldOutputDir> held = HeldOutputDir::Open(victim, {root_});
    ASSERT_THAT(held, IsOk());
    ScopedHeldOutputDir scope(&*held);
    ASSERT_THAT(Write(victim, 1, /*keep_last=*/5), IsOk());
    ASSERT_THAT(Write(victim, 2, /*keep_last=*/5), IsOk());
  }
  // The intruder's job, keep_last 1, writes into .../mallory/runs/job-000002.
  const std::string intruder = root_ + "/mallory/runs/job-000002";
  absl::StatusOr<HeldOutputDir> held = HeldOutputDir::Open(intruder, {root_});
  ASSERT_THAT(held, IsOk());
  ScopedHeldOutputDir scope(&*held);
  ASSERT_THAT(Write(intruder, 1), IsOk());
  SwapForLink(root_ + "/mallory/runs", root_ + "/jobs");
  EXPECT_THAT(Write(intruder, 3), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("no longer leads to the job's directory")));
  // Her checkpoints are intact and nothing of the intruder's is there.
  absl::StatusOr<std::vector<CheckpointInfo>> hers = ListCheckpoints(victim);
  ASSERT_THAT(hers, IsOk());
  ASSERT_EQ(hers->size(), 2u);
  EXPECT_EQ((*hers)[0].step, 1);
  EXPECT_EQ((*hers)[1].step, 2);
  EXPECT_FALSE(fs::exists(victim + "/checkpoints/step-00000003"));
}

TEST_F(HeldOutputDirTest, WithoutAHeldDirectoryTheWriterResolvesThePathAsBefore) {
  // A standalone run (no daemon) holds nothing: the path is used.
  EXPECT_THAT(Write(base_ + "/standalone", 1), IsOk());
  EXPECT_TRUE(fs::exists(base_ + "/standalone/checkpoints/step-00000001"));
}

}  // namespace
}  // namespace megatrain::engine
