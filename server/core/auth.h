// Authentication and authorisation of RPC callers.
//
// With --auth_tokens=FILE the daemon accepts a bearer token in the
// `authorization` metadata ("Bearer <token>") and maps it to a user and a
// role. Only SHA-256 hashes of tokens are stored; a presented token is hashed
// and compared against every user's hash in constant time (CRYPTO_memcmp),
// always scanning all users, so timing reveals neither which bytes matched
// nor which user matched.
//
// Tokens file (YAML):
//
//   users:
//     - name: alice            # [a-z0-9_][a-z0-9_.-]{0,63}, unique
//       role: user             # user | admin
//       token_sha256: 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824
//
// Make a hash with `printf %s "$TOKEN" | sha256sum` (no trailing newline).
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(auto auth, Authenticator::FromTokensFile(path));
//   absl::StatusOr<Principal> who = auth->Authenticate("Bearer s3cret");
//
// Without a tokens file every caller is the user "local" with the admin
// role; the daemon then binds loopback addresses only (see daemon.h).
//
// Roles: a user sees and manages their own jobs; an admin all jobs.
//
// Thread-safety: Authenticator is immutable after creation; all methods are
// safe to call concurrently.
#ifndef MEGATRAIN_SERVER_AUTH_H_
#define MEGATRAIN_SERVER_AUTH_H_

#include <array>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::server {

enum class Role { kUser, kAdmin };

// "user" | "admin".
absl::string_view RoleName(Role role);

// An authenticated caller.
struct Principal {
  std::string name;
  Role role = Role::kUser;

  bool is_admin() const { return role == Role::kAdmin; }
};

// The user name of every caller when auth is off.
inline constexpr absl::string_view kLocalUser = "local";

// SHA-256 digest, 32 bytes.
using Sha256Digest = std::array<unsigned char, 32>;

// SHA-256 of `data` (OpenSSL libcrypto).
Sha256Digest Sha256(absl::string_view data);
// Lower-case hex of a digest (64 characters).
std::string DigestHex(const Sha256Digest& digest);

class Authenticator {
 public:
  // A user entry of the tokens file.
  struct User {
    std::string name;
    Role role = Role::kUser;
    Sha256Digest token_sha256{};
  };

  // Reads a tokens file (format above). NOT_FOUND when it is missing;
  // INVALID_ARGUMENT naming the file and the entry for bad YAML, an unknown
  // key, a bad name, role or hash, a duplicate name or hash, or no users.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromTokensFile(const std::string& path);
  // Parses tokens-file text; `source` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromTokensYaml(absl::string_view yaml,
                                                                       absl::string_view source);
  // Auth off: every caller is {kLocalUser, admin}.
  static std::unique_ptr<Authenticator> AllowAll();

  // True when tokens are checked.
  bool enabled() const { return enabled_; }
  // Number of users in the tokens file.
  size_t user_count() const { return users_.size(); }

  // Authenticates one call from its `authorization` metadata value (empty
  // when absent). UNAUTHENTICATED when it is missing, not "Bearer <token>"
  // or matches no user.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) const;

 private:
  Authenticator(bool enabled, std::vector<User> users)
      : enabled_(enabled), users_(std::move(users)) {}

  const bool enabled_;
  const std::vector<User> users_;
};

// OK when `principal` may see and manage a job owned by `owner` (its own, or
// any for admins); PERMISSION_DENIED naming `what` otherwise.
absl::Status CheckOwnerAccess(const Principal& principal, absl::string_view owner,
                              absl::string_view what);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_AUTH_H_
