// See auth.h.
#include "server/core/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/escape.h"

namespace megatrain::server {

absl::string_view RoleName(Role role) { return role == Role::kAdmin ? "admin" : "user"; }

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest digest{};
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

std::string DigestHex(const Sha256Digest& digest) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

namespace {

// Note [User names]: 1-64 characters of [a-z0-9_.-], the first one of
// [a-z0-9_]. A name becomes a path component (per-user data and output
// roots, {user} in --data_root) and a word in listings, so "." and "..",
// hidden names (".x") and option-like names ("-x") are refused.
bool IsValidUserName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (name.front() == '.' || name.front() == '-') return false;
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_' || c == '.' || c == '-')) {
      return false;
    }
  }
  return true;
}

// The tokens file's top level: only `users`, once. yaml-cpp keeps a
// repeated key's every entry; root["users"] would read the first and drop
// the rest without a word. Throws YAML::Exception on a non-scalar key.
absl::Status CheckTopLevelKeys(const YAML::Node& root, absl::string_view source) {
  bool users_seen = false;
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    if (key != "users") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", key, ": unknown key (known: users)"));
    }
    if (users_seen) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": users: given twice (again on line ",
                                                     entry.first.Mark().line + 1, ")"));
    }
    users_seen = true;
  }
  return absl::OkStatus();
}

// One users[] entry's keys as written, before their values are checked.
struct UserEntry {
  std::string name;
  std::string role = "user";
  std::string hash_hex;  // lower-cased
};

// Reads a users[] mapping (`where` names it in errors): only name, role
// and token_sha256, each at most once (a repeated key would replace the
// earlier value). Throws YAML::Exception on a non-scalar value.
absl::StatusOr<UserEntry> ReadUserEntry(const YAML::Node& node, const std::string& where) {
  UserEntry out;
  std::set<std::string> keys;
  for (const auto& field : node) {
    const std::string key = field.first.as<std::string>();
    if (!keys.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", EscapeControlCharacters(key), ": given twice"));
    }
    if (key == "name") {
      out.name = field.second.as<std::string>();
    } else if (key == "role") {
      out.role = field.second.as<std::string>();
    } else if (key == "token_sha256") {
      out.hash_hex = absl::AsciiStrToLower(field.second.as<std::string>());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", key, ": unknown key (known: name, role, token_sha256)"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromTokensFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("auth tokens file '", path, "' not found"));
  std::stringstream text;
  text << in.rdbuf();
  return FromTokensYaml(text.str(), path);
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromTokensYaml(
    absl::string_view yaml, absl::string_view source) {
  std::vector<User> users;
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": expected a mapping with key 'users'"));
    }
    absl::Status top = CheckTopLevelKeys(root, source);
    if (!top.ok()) return top;
    const YAML::Node list = root["users"];
    if (!list.IsSequence() || list.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": users: must be a non-empty list"));
    }
    std::set<std::string> names;
    std::set<std::string> hashes;
    for (size_t user_idx = 0; user_idx < list.size(); ++user_idx) {
      const YAML::Node node = list[user_idx];
      const std::string where = absl::StrCat(source, ": users[", user_idx, "]");
      if (!node.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expected a mapping"));
      }
      absl::StatusOr<UserEntry> entry = ReadUserEntry(node, where);
      if (!entry.ok()) return entry.status();
      User user;
      user.name = entry->name;
      const std::string& role = entry->role;
      const std::string& hash_hex = entry->hash_hex;
      if (!IsValidUserName(user.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".name: must be 1-64 characters of [a-z0-9_.-] starting with [a-z0-9_], got '",
            EscapeControlCharacters(user.name), "'"));
      }
      if (!names.insert(user.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".name: duplicate user '", user.name, "'"));
      }
      if (role == "user") {
        user.role = Role::kUser;
      } else if (role == "admin") {
        user.role = Role::kAdmin;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".role: must be 'user' or 'admin', got '", role, "'"));
      }
      bool hex_ok = hash_hex.size() == 64;
      for (char c : hash_hex) hex_ok = hex_ok && absl::ascii_isxdigit(c);
      if (!hex_ok) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".token_sha256: must be 64 hex digits (sha256sum of the token)"));
      }
      if (!hashes.insert(hash_hex).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".token_sha256: same token as another user"));
      }
      const std::string bytes = absl::HexStringToBytes(hash_hex);
      std::copy(bytes.begin(), bytes.end(), user.token_sha256.begin());
      users.push_back(std::move(user));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  return std::unique_ptr<Authenticator>(new Authenticator(true, std::move(users)));
}

std::unique_ptr<Authenticator> Authenticator::AllowAll() {
  return std::unique_ptr<Authenticator>(new Authenticator(false, {}));
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view authorization) const {
  if (!enabled_) return Principal{std::string(kLocalUser), Role::kAdmin};
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing bearer token (metadata 'authorization: Bearer <token>'; CLI: --token or "
        "MEGATRAIN_TOKEN)");
  }
  absl::string_view token = absl::StripAsciiWhitespace(authorization);
  if (token.size() < 7 || !absl::EqualsIgnoreCase(token.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  token = absl::StripLeadingAsciiWhitespace(token.substr(7));
  if (token.empty()) return absl::UnauthenticatedError("empty bearer token");
  const Sha256Digest digest = Sha256(token);
  // Constant time: compare against every user, never stop early.
  const User* match = nullptr;
  for (const User& user : users_) {
    const bool equal = CRYPTO_memcmp(digest.data(), user.token_sha256.data(), digest.size()) == 0;
    if (equal) match = &user;
  }
  if (match == nullptr) return absl::UnauthenticatedError("invalid bearer token");
  return Principal{match->name, match->role};
}

absl::Status CheckOwnerAccess(const Principal& principal, absl::string_view owner,
                              absl::string_view what) {
  if (principal.is_admin() || principal.name == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(what, " belongs to another user; user '",
                                                  principal.name,
                                                  "' may only access their own jobs"));
}

}  // namespace megatrain::server
