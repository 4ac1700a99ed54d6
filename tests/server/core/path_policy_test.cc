// Tests of server/core/path_policy.h: roots, ".." components, symbolic links
// that escape a root (to an existing and to a missing target), paths that do
// not exist yet, and the job-spec fields each check names.
#include "server/core/path_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

// A temp tree:
//   <base>/data/tiny/shard.mtt        data root
//   <base>/data/escape -> <base>/secret      symlink out of the root
//   <base>/data/inside -> <base>/data/tiny   symlink within the root
//   <base>/out/                       output root
//   <base>/out/dangling -> <base>/elsewhere/new (missing target)
//   <base>/secret/key
class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::canonical(MakeTempDir()).string();
    data_ = base_ + "/data";
    out_ = base_ + "/out";
    secret_ = base_ + "/secret";
    fs::create_directories(data_ + "/tiny");
    fs::create_directories(out_);
    fs::create_directories(secret_);
    std::ofstream(data_ + "/tiny/shard.mtt") << "x";
    std::ofstream(secret_ + "/key") << "k";
    fs::create_directory_symlink(secret_, data_ + "/escape");
    fs::create_directory_symlink(data_ + "/tiny", data_ + "/inside");
    fs::create_symlink(base_ + "/elsewhere/new", out_ + "/dangling");
    auto policy = PathPolicy::Create({data_}, {out_});
    ASSERT_THAT(policy, IsOk());
    policy_ = *policy;
  }

  std::string base_, data_, out_, secret_;
  PathPolicy policy_ = PathPolicy::Unrestricted();
};

TEST_F(PathPolicyTest, AllowsPathsUnderTheRoots) {
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/tiny"), IsOk());
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/tiny/shard.mtt"), IsOk());
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_), IsOk());
  // A symlink that stays inside the root is fine.
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/inside/shard.mtt"), IsOk());
  EXPECT_THAT(policy_.CheckWrite("output_dir", out_ + "/run1"), IsOk());
}

TEST_F(PathPolicyTest, AllowsMissingPathsBelowARoot) {
  // Output directories usually do not exist yet; nor need data files (the
  // engine reports those).
  EXPECT_THAT(policy_.CheckWrite("output_dir", out_ + "/a/b/c"), IsOk());
  EXPECT_THAT(policy_.CheckRead("data.text", data_ + "/not-yet.txt"), IsOk());
}

TEST_F(PathPolicyTest, EmptyPathIsAnUnsetField) {
  EXPECT_THAT(policy_.CheckRead("model.hf_dir", ""), IsOk());
  EXPECT_THAT(policy_.CheckWrite("output_dir", ""), IsOk());
}

TEST_F(PathPolicyTest, OutsideTheRootsIsPermissionDeniedNamingTheField) {
  EXPECT_THAT(policy_.CheckRead("data.tokens", "/etc/passwd"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("data.tokens: '/etc/passwd' is outside the daemon's data roots (" +
                                 data_ + "; --data_roots)")));
  EXPECT_THAT(policy_.CheckWrite("out_dir", "/tmp/export"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("out_dir: '/tmp/export' is outside the daemon's output roots")));
  // Data roots are not output roots and vice versa.
  EXPECT_THAT(policy_.CheckWrite("output_dir", data_ + "/run"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("output_dir:")));
  EXPECT_THAT(policy_.CheckRead("model.hf_dir", out_ + "/model"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("model.hf_dir:")));
}

TEST_F(PathPolicyTest, SiblingWithTheRootAsPrefixIsOutside) {
  // "/x/data-other" starts with "/x/data" but is not below it.
  fs::create_directories(base_ + "/data-other");
  EXPECT_THAT(policy_.CheckRead("data.tokens", base_ + "/data-other/f"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("outside")));
}

TEST_F(PathPolicyTest, DotDotComponentIsInvalidArgument) {
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/../secret/key"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: '..' components are not allowed")));
  // Even where it would stay inside the root, and even without roots.
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/tiny/../tiny"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'..'")));
  EXPECT_THAT(PathPolicy::Unrestricted().CheckWrite("out_dir", "/tmp/a/../b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_dir: '..'")));
  // A name that merely contains dots is fine.
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/..hidden/x..y"), IsOk());
}

TEST_F(PathPolicyTest, RelativePathIsInvalidArgument) {
  EXPECT_THAT(policy_.CheckRead("data.tokenizer", "spm.model"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokenizer: must be an absolute path, got 'spm.model'")));
}

TEST_F(PathPolicyTest, SymlinkEscapeIsPermissionDenied) {
  // data/escape -> secret: lexically under the data root, really outside.
  EXPECT_THAT(policy_.CheckRead("data.tokens", data_ + "/escape/key"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("data.tokens: '" + data_ + "/escape/key' resolves to '" + secret_ +
                                 "/key', which is outside the daemon's data roots")));
  // Also for a file below it that does not exist yet (a write).
  auto writable = PathPolicy::Create({data_}, {data_});
  ASSERT_THAT(writable, IsOk());
  EXPECT_THAT(writable->CheckWrite("output_dir", data_ + "/escape/new/run"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("resolves to '" + secret_)));
}

TEST_F(PathPolicyTest, DanglingSymlinkIsPermissionDenied) {
  // Writing through out/dangling would create <base>/elsewhere/new.
  EXPECT_THAT(
      policy_.CheckWrite("output_dir", out_ + "/dangling"),
      StatusIs(absl::StatusCode::kPermissionDenied,
               HasSubstr("output_dir: '" + out_ + "/dangling' is a dangling symbolic link")));
  EXPECT_THAT(policy_.CheckWrite("output_dir", out_ + "/dangling/run"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("dangling symbolic link")));
}

TEST_F(PathPolicyTest, RootGivenThroughASymlinkIsResolved) {
  fs::create_directory_symlink(data_, base_ + "/data-link");
  auto policy = PathPolicy::Create({base_ + "/data-link"}, {});
  ASSERT_THAT(policy, IsOk());
  EXPECT_THAT(policy->data_roots(), ElementsAre(data_));
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/data-link/tiny"), IsOk());
  EXPECT_THAT(policy->CheckRead("data.tokens", data_ + "/tiny"), IsOk());
  // Output unrestricted: any absolute path.
  EXPECT_THAT(policy->CheckWrite("output_dir", "/anywhere/at/all"), IsOk());
}

TEST_F(PathPolicyTest, SlashRootAllowsEverything) {
  auto policy = PathPolicy::Create({"/"}, {"/"});
  ASSERT_THAT(policy, IsOk());
  EXPECT_THAT(policy->CheckRead("data.tokens", "/etc/hostname"), IsOk());
  EXPECT_THAT(policy->CheckRead("data.tokens", data_ + "/escape/key"), IsOk());
}

TEST_F(PathPolicyTest, BadRootsAreRefusedNamingTheFlag) {
  EXPECT_THAT(
      PathPolicy::Create({"relative/dir"}, {}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("--data_roots: roots must be absolute paths, got 'relative/dir'")));
  EXPECT_THAT(PathPolicy::Create({}, {base_ + "/missing"}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--output_roots: '")));
  EXPECT_THAT(PathPolicy::Create({data_ + "/tiny/shard.mtt"}, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a directory")));
}

TEST_F(PathPolicyTest, CheckJobSpecNamesEachField) {
  engine::JobSpec spec;
  spec.model.hf_dir = data_ + "/tiny";
  spec.data.tokens = data_ + "/tiny";
  spec.data.eval_tokens = data_ + "/inside";
  spec.output_dir = out_ + "/job-1";
  EXPECT_THAT(policy_.CheckJobSpec(spec), IsOk());

  struct Case {
    std::string field;
    std::function<void(engine::JobSpec&)> set;
  };
  const std::vector<Case> cases = {
      {"model.hf_dir", [&](engine::JobSpec& s) { s.model.hf_dir = secret_; }},
      {"data.tokens", [&](engine::JobSpec& s) { s.data.tokens = data_ + "/escape"; }},
      {"data.eval_tokens", [&](engine::JobSpec& s) { s.data.eval_tokens = "/etc"; }},
      {"data.text", [&](engine::JobSpec& s) { s.data.text = secret_ + "/key"; }},
      {"data.tokenizer", [&](engine::JobSpec& s) { s.data.tokenizer = "/etc/spm.model"; }},
      {"output_dir", [&](engine::JobSpec& s) { s.output_dir = secret_ + "/run"; }},
  };
  for (const Case& c : cases) {
    engine::JobSpec bad = spec;
    c.set(bad);
    EXPECT_THAT(policy_.CheckJobSpec(bad),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(c.field + ": '")))
        << c.field;
  }
}

// Note [Per-user data roots].
TEST_F(PathPolicyTest, UserRootGrantsOnlyTheCallersDirectory) {
  fs::create_directories(base_ + "/home/alice");
  fs::create_directories(base_ + "/home/bob");
  auto policy = PathPolicy::Create({data_, base_ + "/home/{user}"}, {out_});
  ASSERT_THAT(policy, IsOk());
  EXPECT_THAT(policy->user_data_roots(), ElementsAre(base_ + "/home/{user}"));
  EXPECT_THAT(policy->data_roots(), ElementsAre(data_, base_ + "/home/{user}"));
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/alice/t.mtt", "alice"), IsOk());
  EXPECT_THAT(policy->CheckRead("data.tokens", data_ + "/tiny", "alice"), IsOk());  // shared root
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/bob/t.mtt", "alice"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("is outside the daemon's data roots (" + data_ + ", " + base_ +
                                 "/home/{user}; --data_roots)")));
  // No user, or a name that is not a plain file name, gets nothing from it.
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/alice/t.mtt", ""),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("data.tokens: '")));
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/bob/t.mtt", "../bob"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("data.tokens: '")));
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/t.mtt", "."),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("data.tokens: '")));
  // A user whose directory does not exist yet is refused, not an error.
  EXPECT_THAT(policy->CheckRead("data.tokens", base_ + "/home/carol/t.mtt", "carol"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("outside")));
}

TEST_F(PathPolicyTest, UserPlaceholderIsRefusedInOutputRootsAndNeedsItsBase) {
  EXPECT_THAT(PathPolicy::Create({data_}, {out_ + "/{user}"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--output_roots: '{user}' is only allowed in data roots")));
  EXPECT_THAT(PathPolicy::Create({base_ + "/missing/{user}"}, {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--data_roots: '")));
  EXPECT_THAT(PathPolicy::Create({base_ + "/{user}/../x"}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'..' components")));
}

// Note [Input preflight].
TEST_F(PathPolicyTest, PreflightRefusesFifosDevicesAndWrongKinds) {
  const std::string fifo = base_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  engine::JobSpec spec;
  spec.data.tokens = fifo;
  EXPECT_THAT(PreflightJobInputs(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: '" + fifo +
                                 "' is a FIFO; must be a regular file or a directory")));
  spec.data.tokens = data_ + "/tiny";  // a directory of shards
  spec.data.text = "/dev/null";
  EXPECT_THAT(PreflightJobInputs(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.text: '/dev/null' is a character device; must be a "
                                 "regular file")));
  spec.data.text.clear();
  spec.data.tokenizer = data_;  // a model directory (its tokenizer.json) is accepted
  EXPECT_THAT(PreflightJobInputs(spec), IsOk());
  spec.data.tokenizer = fifo;
  EXPECT_THAT(PreflightJobInputs(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokenizer: '" + fifo + "' is a FIFO")));
  spec.data.tokenizer = data_ + "/not-yet.model";  // missing: the job's start reports it
  EXPECT_THAT(PreflightJobInputs(spec), IsOk());
  spec.model.hf_dir = data_ + "/tiny/shard.mtt";
  EXPECT_THAT(PreflightJobInputs(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("model.hf_dir: '" + data_ +
                                                           "/tiny/shard.mtt' is not a "
                                                           "regular file; must be a directory")));
}

TEST_F(PathPolicyTest, PreflightReadsConfigJson) {
  fs::create_directories(data_ + "/model");
  std::ofstream(data_ + "/model/config.json") << R"({"model_type": "llama"})";
  engine::JobSpec spec;
  spec.model.hf_dir = data_ + "/model";
  absl::StatusOr<JobInputs> inputs = PreflightJobInputs(spec);
  ASSERT_THAT(inputs, IsOk());
  EXPECT_EQ(inputs->hf_config_json, R"({"model_type": "llama"})");
  spec.model.hf_dir.clear();
  spec.model.preset = "tiny";
  inputs = PreflightJobInputs(spec);
  ASSERT_THAT(inputs, IsOk());
  EXPECT_FALSE(inputs->hf_config_json.has_value());
}

TEST(SplitPathListTest, TrimsAndDropsEmptyEntries) {
  EXPECT_THAT(SplitPathList(" /a, /b ,,"), ElementsAre("/a", "/b"));
  EXPECT_THAT(SplitPathList(""), ElementsAre());
}

}  // namespace
}  // namespace megatrain::server
