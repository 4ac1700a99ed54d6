// Tests of server/core/auth.h: tokens file parsing, bearer-token authentication
// and the owner check.
#include "server/core/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// sha256("alice-token"), sha256("root-token"): computed with Sha256 below and
// checked against coreutils' sha256sum in Sha256MatchesKnownVector.
std::string TokensYaml() {
  return "users:\n"
         "  - name: alice\n"
         "    role: user\n"
         "    token_sha256: " +
         DigestHex(Sha256("alice-token")) +
         "\n"
         "  - name: root\n"
         "    role: admin\n"
         "    token_sha256: " +
         DigestHex(Sha256("root-token")) + "\n";
}

TEST(AuthTest, Sha256MatchesKnownVector) {
  // printf %s hello | sha256sum
  EXPECT_EQ(DigestHex(Sha256("hello")),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
}

TEST(AuthTest, AuthenticatesUserAndAdminTokens) {
  auto auth = Authenticator::FromTokensYaml(TokensYaml(), "tokens.yaml");
  ASSERT_THAT(auth, IsOk());
  EXPECT_TRUE((*auth)->enabled());
  EXPECT_EQ((*auth)->user_count(), 2u);

  absl::StatusOr<Principal> alice = (*auth)->Authenticate("Bearer alice-token");
  ASSERT_THAT(alice, IsOk());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_FALSE(alice->is_admin());

  absl::StatusOr<Principal> root = (*auth)->Authenticate("bearer   root-token ");
  ASSERT_THAT(root, IsOk());
  EXPECT_EQ(root->name, "root");
  EXPECT_TRUE(root->is_admin());
}

TEST(AuthTest, MissingTokenIsUnauthenticated) {
  auto auth = Authenticator::FromTokensYaml(TokensYaml(), "tokens.yaml");
  ASSERT_THAT(auth, IsOk());
  EXPECT_THAT((*auth)->Authenticate(""),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("missing bearer token")));
}

TEST(AuthTest, WrongSchemeIsUnauthenticated) {
  auto auth = Authenticator::FromTokensYaml(TokensYaml(), "tokens.yaml");
  ASSERT_THAT(auth, IsOk());
  EXPECT_THAT((*auth)->Authenticate("Basic YWxpY2U6eA=="),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer <token>")));
  EXPECT_THAT((*auth)->Authenticate("Bearer "),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer <token>")));
}

TEST(AuthTest, UnknownTokenIsUnauthenticated) {
  auto auth = Authenticator::FromTokensYaml(TokensYaml(), "tokens.yaml");
  ASSERT_THAT(auth, IsOk());
  EXPECT_THAT((*auth)->Authenticate("Bearer alice-token2"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("invalid bearer token")));
  // The hash itself is not a token.
  EXPECT_THAT((*auth)->Authenticate("Bearer " + DigestHex(Sha256("alice-token"))),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("invalid bearer token")));
}

TEST(AuthTest, AllowAllMakesEveryCallerTheLocalAdmin) {
  std::unique_ptr<Authenticator> auth = Authenticator::AllowAll();
  EXPECT_FALSE(auth->enabled());
  absl::StatusOr<Principal> who = auth->Authenticate("");
  ASSERT_THAT(who, IsOk());
  EXPECT_EQ(who->name, "local");
  EXPECT_TRUE(who->is_admin());
}

struct BadTokensCase {
  std::string name;
  std::string yaml;
  std::string message;
};

class BadTokensFileTest : public ::testing::TestWithParam<BadTokensCase> {};

TEST_P(BadTokensFileTest, IsInvalidArgumentNamingTheEntry) {
  EXPECT_THAT(Authenticator::FromTokensYaml(GetParam().yaml, "tokens.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

const std::string kHash = DigestHex(Sha256("x"));

INSTANTIATE_TEST_SUITE_P(
    Cases, BadTokensFileTest,
    ::testing::Values(
        BadTokensCase{"NotAMapping", "- a\n- b\n", "expected a mapping"},
        BadTokensCase{"UnknownTopKey", "users: []\ngroups: []\n", "groups: unknown key"},
        BadTokensCase{"NoUsers", "users: []\n", "users: must be a non-empty list"},
        BadTokensCase{"UnknownUserKey",
                      "users:\n  - {name: a, token_sha256: " + kHash + ", email: x}\n",
                      "users[0].email: unknown key"},
        BadTokensCase{"BadName", "users:\n  - {name: Alice!, token_sha256: " + kHash + "}\n",
                      "users[0].name: must be"},
        BadTokensCase{"DotName", "users:\n  - {name: '.', token_sha256: " + kHash + "}\n",
                      "users[0].name: must be 1-64 characters of [a-z0-9_.-] starting with "
                      "[a-z0-9_], got '.'"},
        BadTokensCase{"DotDotName", "users:\n  - {name: '..', token_sha256: " + kHash + "}\n",
                      "users[0].name: must be 1-64 characters of [a-z0-9_.-] starting with "
                      "[a-z0-9_], got '..'"},
        BadTokensCase{"HiddenName", "users:\n  - {name: .alice, token_sha256: " + kHash + "}\n",
                      "got '.alice'"},
        BadTokensCase{"OptionLikeName", "users:\n  - {name: -rf, token_sha256: " + kHash + "}\n",
                      "got '-rf'"},
        BadTokensCase{"BadRole", "users:\n  - {name: a, role: root, token_sha256: " + kHash + "}\n",
                      "users[0].role: must be 'user' or 'admin', got 'root'"},
        BadTokensCase{"BadHash", "users:\n  - {name: a, token_sha256: abc}\n",
                      "users[0].token_sha256: must be 64 hex digits"},
        BadTokensCase{"DuplicateName",
                      "users:\n  - {name: a, token_sha256: " + kHash +
                          "}\n  - {name: a, "
                          "token_sha256: " +
                          DigestHex(Sha256("y")) + "}\n",
                      "users[1].name: duplicate user 'a'"},
        BadTokensCase{"DuplicateHash",
                      "users:\n  - {name: a, token_sha256: " + kHash +
                          "}\n  - {name: b, token_sha256: " + kHash + "}\n",
                      "users[1].token_sha256: same token as another user"},
        BadTokensCase{
            "RoleGivenTwice",
            "users:\n  - {name: a, role: admin, role: user, token_sha256: " + kHash + "}\n",
            "users[0].role: given twice"},
        BadTokensCase{"UsersGivenTwice",
                      "users:\n  - {name: a, token_sha256: " + kHash +
                          "}\nusers:\n  - {name: b, token_sha256: " + DigestHex(Sha256("y")) +
                          "}\n",
                      "users: given twice (again on line 3)"},
        BadTokensCase{"BadYaml", "users: [\n", "tokens.yaml"}),
    [](const ::testing::TestParamInfo<BadTokensCase>& info) { return info.param.name; });

TEST(AuthTest, MissingTokensFileIsNotFound) {
  EXPECT_THAT(Authenticator::FromTokensFile("/nonexistent/tokens.yaml"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/tokens.yaml")));
}

TEST(AuthTest, OwnerAccessAllowsOwnerAndAdminsOnly) {
  const Principal alice{"alice", Role::kUser};
  const Principal root{"root", Role::kAdmin};
  EXPECT_THAT(CheckOwnerAccess(alice, "alice", "job job-000001"), IsOk());
  EXPECT_THAT(CheckOwnerAccess(root, "alice", "job job-000001"), IsOk());
  EXPECT_THAT(CheckOwnerAccess(alice, "bob", "job job-000001"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("job job-000001 belongs to another user")));
}

}  // namespace
}  // namespace megatrain::server
