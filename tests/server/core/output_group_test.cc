// --output_group (server/core/output_group.h): the modes and group of the
// state and jobs directories, and a refused unknown group.
#include "server/core/output_group.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

struct stat StatOf(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info;
}

TEST(OutputGroupTest, ResolvesNamesAndNumbersAndRefusesUnknownGroups) {
  const gid_t own = ::getgid();
  const struct group* entry = ::getgrgid(own);
  ASSERT_NE(entry, nullptr);
  EXPECT_THAT(ResolveOutputGroup(entry->gr_name), IsOk());
  EXPECT_EQ(*ResolveOutputGroup(entry->gr_name), own);
  EXPECT_EQ(*ResolveOutputGroup(std::to_string(own)), own);
  EXPECT_THAT(ResolveOutputGroup("no-such-group-megatrain"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--output_group: no group 'no-such-group-megatrain'")));
  EXPECT_THAT(ResolveOutputGroup(""), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("--output_group: empty group name")));
}

TEST(OutputGroupTest, StateDirIsTraversableAndJobsAreGroupReadable) {
  const std::string state_dir = megatrain::testing::MakeTempDir("output-group");
  const std::string jobs_dir = state_dir + "/jobs";
  std::filesystem::create_directories(jobs_dir);
  ::chmod(state_dir.c_str(), 0700);
  const mode_t old_umask = ::umask(022);
  ASSERT_THAT(ShareOutputsWithGroup(state_dir, jobs_dir, ::getgid()), IsOk());
  EXPECT_EQ(StatOf(state_dir).st_mode & 07777, 0710u);
  EXPECT_EQ(StatOf(jobs_dir).st_mode & 07777, 02750u);
  EXPECT_EQ(StatOf(jobs_dir).st_gid, ::getgid());
  // A job directory made below inherits the group (setgid) and, with the
  // umask 027, is readable by the group and not by others.
  const std::string job_dir = jobs_dir + "/job-000001";
  std::filesystem::create_directories(job_dir);
  EXPECT_EQ(StatOf(job_dir).st_gid, ::getgid());
  EXPECT_EQ(StatOf(job_dir).st_mode & 0777, 0750u);
  ::umask(old_umask);
  ::megatrain::testing::RemoveTestTree(state_dir);
}

}  // namespace
}  // namespace megatrain::server
