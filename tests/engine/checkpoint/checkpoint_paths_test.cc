// Tests of the write/rename/delete path of engine/checkpoint/checkpoint.h through a
// directory descriptor (Note [Directory descriptors] in engine/fs/dir_fd.h):
// a symbolic link swapped into a job's directory makes the write fail
// clearly and nothing outside the directory is written or deleted;
// retention and temp cleanup never follow links.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "engine/checkpoint/checkpoint.h"
#include "engine/store/host_store.h"
#include "engine/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 1-layer, hidden-32 Llama: checkpoints of a few hundred KiB.
std::unique_ptr<HostStore> SmallStore() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  absl::StatusOr<std::unique_ptr<HostStore>> store = HostStore::Create(c, HostStoreOptions());
  EXPECT_THAT(store, IsOk());
  (*store)->InitializeWeights(7);
  return *std::move(store);
}

CheckpointState StateAt(int64_t step) {
  CheckpointState state;
  state.step = step;
  state.schedule_json = "{}";
  state.data_cursor_json = "{}";
  state.job_spec_json = "{}";
  return state;
}

CheckpointSpec KeepLast(int keep_last) {
  CheckpointSpec spec;
  spec.keep_last = keep_last;
  return spec;
}

// <base>/job: the job's output directory; <base>/outside: another user's
// directory that must stay as it is.
class CheckpointPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::canonical(MakeTempDir()).string();
    job_ = base_ + "/job";
    outside_ = base_ + "/outside";
    fs::create_directories(job_);
    fs::create_directories(outside_ + "/step-00000001");
    std::ofstream(outside_ + "/step-00000001/keep") << "precious";
    std::ofstream(outside_ + "/.tmp-keep") << "precious";
    store_ = SmallStore();
  }

  void ExpectOutsideUntouched() {
    EXPECT_THAT(ListDir(outside_), ElementsAre(".tmp-keep", "step-00000001"));
    EXPECT_THAT(ListDir(outside_ + "/step-00000001"), ElementsAre("keep"));
  }

  std::string base_, job_, outside_;
  std::unique_ptr<HostStore> store_;
};

TEST_F(CheckpointPathsTest, CheckpointsLinkedOutsideFailsTheWrite) {
  fs::create_directory_symlink(outside_, job_ + "/checkpoints");
  EXPECT_THAT(WriteCheckpoint(*store_, StateAt(2), job_, KeepLast(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(job_ + "/checkpoints: open directory")));
  ExpectOutsideUntouched();
}

TEST_F(CheckpointPathsTest, RetentionAndCleanupRemoveLinksWithoutFollowingThem) {
  ASSERT_THAT(WriteCheckpoint(*store_, StateAt(1), job_, KeepLast(1)), IsOk());
  const std::string root = job_ + "/checkpoints";
  // Links named like a leftover temp entry and like an old checkpoint.
  fs::create_directory_symlink(outside_, root + "/.tmp-step-00000000.abcdef");
  fs::create_directory_symlink(outside_ + "/step-00000001", root + "/step-00000000");
  absl::StatusOr<CheckpointInfo> written = WriteCheckpoint(*store_, StateAt(2), job_, KeepLast(1));
  ASSERT_THAT(written, IsOk());
  EXPECT_EQ(written->dir, root + "/step-00000002");
  // Neither link was recorded by the writer (Note [Checkpoint ledger]):
  // both stay, unfollowed; step 1 (published by the writer) was retired by
  // keep_last 1.
  EXPECT_THAT(ListDir(root), ElementsAre(".ledger.json", ".tmp-step-00000000.abcdef",
                                         "step-00000000", "step-00000002"));
  EXPECT_TRUE(fs::is_symlink(root + "/step-00000000"));
  ExpectOutsideUntouched();
}

TEST_F(CheckpointPathsTest, OutputDirThatIsALinkIsRefused) {
  fs::create_directory_symlink(outside_, base_ + "/job-link");
  EXPECT_THAT(WriteCheckpoint(*store_, StateAt(1), base_ + "/job-link", KeepLast(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job-link")));
  ExpectOutsideUntouched();
}

}  // namespace
}  // namespace megatrain::engine
