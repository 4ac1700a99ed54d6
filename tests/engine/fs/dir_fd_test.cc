// Tests of engine/fs/dir_fd.h (Note [Directory descriptors]): entries are
// created, renamed and removed below a held descriptor; a symbolic link
// swapped into the tree fails the call and nothing outside is touched; a
// tree holding links to outside is removed without following them.
#include "engine/fs/dir_fd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

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

// The one errno table of file operations (store/nvme_tier.cc uses it too):
// disk full, quota and file size limit are RESOURCE_EXHAUSTED; the message
// names the path, the operation and the errno text.
TEST(FileErrnoStatusTest, MapsEachErrnoToItsCodeAndNamesPathAndOperation) {
  const std::string path = "/data/nvme/exp_avg.bin";
  EXPECT_THAT(FileErrnoStatus(ENOSPC, path, "write at offset 4096"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("/data/nvme/exp_avg.bin: write at offset 4096: ")));
  EXPECT_THAT(FileErrnoStatus(EDQUOT, path, "write"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("exp_avg.bin: write: ")));
  EXPECT_THAT(FileErrnoStatus(EFBIG, path, "ftruncate"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("ftruncate")));
  EXPECT_THAT(FileErrnoStatus(ENOENT, path, "open"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("exp_avg.bin: open: ")));
  EXPECT_THAT(FileErrnoStatus(EROFS, path, "open"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("exp_avg.bin: open: ")));
  EXPECT_THAT(FileErrnoStatus(ELOOP, path, "open"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("exp_avg.bin: open: ")));
  EXPECT_THAT(FileErrnoStatus(EEXIST, path, "create file"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("create file")));
  EXPECT_THAT(FileErrnoStatus(EIO, path, "read"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("exp_avg.bin: read: ")));
}

// <base>/job        the job's directory (the DirFd root)
// <base>/outside    a directory with a file the tests must never touch
class DirFdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::canonical(MakeTempDir()).string();
    job_ = base_ + "/job";
    outside_ = base_ + "/outside";
    fs::create_directories(job_);
    fs::create_directories(outside_);
    std::ofstream(outside_ + "/keep") << "precious";
  }

  void ExpectOutsideUntouched() {
    EXPECT_THAT(ListDir(outside_), ElementsAre("keep"));
    std::ifstream in(outside_ + "/keep");
    std::string text;
    in >> text;
    EXPECT_EQ(text, "precious");
  }

  std::string base_, job_, outside_;
};

TEST_F(DirFdTest, CreatesRenamesAndRemovesBeneathTheRoot) {
  absl::StatusOr<DirFd> checkpoints =
      DirFd::OpenBeneath(job_, "checkpoints/tmp", DirFd::Create::kYes);
  ASSERT_THAT(checkpoints, IsOk());
  EXPECT_EQ(checkpoints->path(), job_ + "/checkpoints/tmp");
  absl::StatusOr<int> fd = checkpoints->CreateFileAt("a.bin");
  ASSERT_THAT(fd, IsOk());
  ASSERT_EQ(::write(*fd, "xy", 2), 2);
  ::close(*fd);
  EXPECT_THAT(checkpoints->CreateFileAt("a.bin"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("a.bin")));
  ASSERT_THAT(checkpoints->RenameAt("a.bin", *checkpoints, "b.bin"), IsOk());
  EXPECT_THAT(ListDir(job_ + "/checkpoints/tmp"), ElementsAre("b.bin"));
  // IoPath resolves through the descriptor.
  EXPECT_TRUE(fs::exists(checkpoints->IoPath("b.bin")));
  ASSERT_THAT(checkpoints->Fsync(), IsOk());
  absl::StatusOr<DirFd> parent = DirFd::OpenBeneath(job_, "checkpoints", DirFd::Create::kNo);
  ASSERT_THAT(parent, IsOk());
  ASSERT_THAT(parent->RemoveTreeAt("tmp"), IsOk());
  EXPECT_THAT(ListDir(job_ + "/checkpoints"), ElementsAre());
  EXPECT_THAT(parent->RemoveTreeAt("tmp"), IsOk());  // missing is fine
}

TEST_F(DirFdTest, SymlinkSwappedInFailsAndNothingOutsideIsWritten) {
  fs::create_directory_symlink(outside_, job_ + "/checkpoints");
  for (DirFd::Create create : {DirFd::Create::kNo, DirFd::Create::kYes}) {
    EXPECT_THAT(DirFd::OpenBeneath(job_, "checkpoints", create),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(job_ + "/checkpoints: open directory")));
    EXPECT_THAT(DirFd::OpenBeneath(job_, "checkpoints/step-1", create),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  }
  absl::StatusOr<DirFd> job = DirFd::Open(job_);
  ASSERT_THAT(job, IsOk());
  // A file name that is a link is not written through either.
  fs::create_symlink(outside_ + "/keep", job_ + "/state.json");
  EXPECT_THAT(job->CreateFileAt("state.json"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("state.json")));
  ExpectOutsideUntouched();
}

TEST_F(DirFdTest, HeldDescriptorIgnoresALaterSwapOfItsPath) {
  absl::StatusOr<DirFd> checkpoints = DirFd::OpenBeneath(job_, "checkpoints", DirFd::Create::kYes);
  ASSERT_THAT(checkpoints, IsOk());
  // The directory is moved away and a link to outside takes its place.
  fs::rename(job_ + "/checkpoints", job_ + "/moved");
  fs::create_directory_symlink(outside_, job_ + "/checkpoints");
  absl::StatusOr<int> fd = checkpoints->CreateFileAt("new.bin");
  ASSERT_THAT(fd, IsOk());
  ::close(*fd);
  std::ofstream(checkpoints->IoPath("via-io-path")) << "x";
  EXPECT_THAT(ListDir(job_ + "/moved"), ElementsAre("new.bin", "via-io-path"));
  ExpectOutsideUntouched();
}

TEST_F(DirFdTest, RemoveTreeRemovesLinksWithoutFollowingThem) {
  absl::StatusOr<DirFd> job = DirFd::Open(job_);
  ASSERT_THAT(job, IsOk());
  fs::create_directories(job_ + "/doomed/inner");
  std::ofstream(job_ + "/doomed/inner/file") << "x";
  fs::create_directory_symlink(outside_, job_ + "/doomed/to-outside");
  fs::create_directory_symlink(outside_, job_ + "/doomed/inner/to-outside");
  fs::create_symlink(outside_ + "/keep", job_ + "/doomed/keep-link");
  ASSERT_THAT(job->RemoveTreeAt("doomed"), IsOk());
  EXPECT_THAT(ListDir(job_), ElementsAre());
  // A link given as the tree itself is removed as a link.
  fs::create_directory_symlink(outside_, job_ + "/link-tree");
  ASSERT_THAT(job->RemoveTreeAt("link-tree"), IsOk());
  EXPECT_THAT(ListDir(job_), ElementsAre());
  ExpectOutsideUntouched();
}

TEST_F(DirFdTest, RefusesComponentsThatClimbOrNest) {
  absl::StatusOr<DirFd> job = DirFd::Open(job_);
  ASSERT_THAT(job, IsOk());
  EXPECT_THAT(DirFd::OpenBeneath(job_, "../outside", DirFd::Create::kNo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one path component")));
  EXPECT_THAT(job->CreateFileAt("a/b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one path component")));
  EXPECT_THAT(job->RemoveTreeAt(".."),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one path component")));
  EXPECT_THAT(job->RenameAt("x", *job, "."),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one path component")));
  EXPECT_THAT(DirFd::Open("relative"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absolute path")));
  fs::create_directory_symlink(job_, base_ + "/job-link");
  EXPECT_THAT(DirFd::Open(base_ + "/job-link"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job-link")));
  EXPECT_THAT(DirFd::Open(base_ + "/missing"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  ExpectOutsideUntouched();
}

// --- Note [Confined reads] ----------------------------------------------------

// <base>/data        a data root (links inside it allowed)
// <base>/job         the job's output_dir (no links)
// <base>/outside     another user's file
class ReadConfinementTest : public DirFdTest {
 protected:
  void SetUp() override {
    DirFdTest::SetUp();
    data_ = base_ + "/data";
    fs::create_directories(data_ + "/hf/blobs");
    fs::create_directories(data_ + "/hf/snapshots");
    std::ofstream(data_ + "/tokens.mtt") << "tokens";
    std::ofstream(data_ + "/hf/blobs/abc") << "config";
    fs::create_symlink("../blobs/abc", data_ + "/hf/snapshots/config.json");
    std::ofstream(job_ + "/own") << "own";
    absl::StatusOr<ReadConfinement> confinement =
        ReadConfinement::Create({{data_, /*follow_links=*/true}, {job_, /*follow_links=*/false}});
    ASSERT_THAT(confinement, IsOk());
    confinement_.emplace(*std::move(confinement));
  }

  static std::string ReadAll(int fd) {
    std::string text(64, '\0');
    const ssize_t n = ::read(fd, text.data(), text.size());
    ::close(fd);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return text;
  }

  std::string data_;
  std::optional<ReadConfinement> confinement_;
};

TEST_F(ReadConfinementTest, ReadsFilesBelowTheRootsAndLinksThatStayInside) {
  ScopedReadConfinement scope(&*confinement_);
  absl::StatusOr<int> tokens = OpenInputFile(data_ + "/tokens.mtt");
  ASSERT_THAT(tokens, IsOk());
  EXPECT_EQ(ReadAll(*tokens), "tokens");
  // A Hugging Face cache: snapshots/<file> -> ../blobs/<hash>, inside the root.
  EXPECT_THAT(ReadInputFile(data_ + "/hf/snapshots/config.json", 1024), IsOk());
  absl::StatusOr<int> own = OpenInputFile(job_ + "/own");
  ASSERT_THAT(own, IsOk());
  EXPECT_EQ(ReadAll(*own), "own");
}

TEST_F(ReadConfinementTest, LinkSwappedInThatLeadsOutIsPermissionDenied) {
  // After the daemon checked data/tokens.mtt, it becomes a link to another
  // user's file.
  fs::remove(data_ + "/tokens.mtt");
  fs::create_symlink(outside_ + "/keep", data_ + "/tokens.mtt");
  ScopedReadConfinement scope(&*confinement_);
  EXPECT_THAT(OpenInputFile(data_ + "/tokens.mtt"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(data_ + "/tokens.mtt: resolves outside " + data_)));
  // A relative link climbing out, and a swapped directory, likewise.
  fs::create_symlink("../outside", data_ + "/dir");
  EXPECT_THAT(ReadInputFile(data_ + "/dir/keep", 1024),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("resolves outside")));
  ExpectOutsideUntouched();
}

TEST_F(ReadConfinementTest, OutputDirFollowsNoLinkAndPathsOutsideEveryRootAreRefused) {
  fs::create_symlink(job_ + "/own", job_ + "/link");
  ScopedReadConfinement scope(&*confinement_);
  EXPECT_THAT(OpenInputFile(job_ + "/link"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("symbolic link")));
  EXPECT_THAT(OpenInputFile(outside_ + "/keep"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("lies outside the directories this job may read")));
}

TEST_F(ReadConfinementTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = data_ + "/tokens.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  {
    ScopedReadConfinement scope(&*confinement_);
    EXPECT_THAT(OpenInputFile(fifo), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("not a regular file (a FIFO)")));
  }
  // Without a confinement too (the engine's CLI and tests).
  EXPECT_THAT(ReadInputFile(fifo, 1024), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("not a regular file (a FIFO)")));
}

TEST_F(ReadConfinementTest, ScopeEndsWithItsObject) {
  {
    ScopedReadConfinement scope(&*confinement_);
    EXPECT_THAT(OpenInputFile(outside_ + "/keep"),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("lies outside")));
  }
  absl::StatusOr<int> fd = OpenInputFile(outside_ + "/keep");
  ASSERT_THAT(fd, IsOk());
  EXPECT_EQ(ReadAll(*fd), "precious");
  EXPECT_THAT(ReadInputFile(outside_ + "/keep", 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 3")));
}

}  // namespace
}  // namespace megatrain::engine
