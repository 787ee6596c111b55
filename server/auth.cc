#include "server/auth.h"

#include <grpcpp/server_context.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace handoff::server {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr absl::string_view kBearer = "Bearer ";

std::array<unsigned char, 32> Sha256(absl::string_view data) {
  std::array<unsigned char, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-' && c != '@') return false;
  }
  return true;
}

bool ValidToken(absl::string_view token) {
  if (token.size() < kMinTokenLength) return false;
  for (const char c : token) {
    if (!absl::ascii_isgraph(c)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromContent(
    absl::string_view content) {
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    // Messages below name the line and the field, never quote the token.
    const std::string where = absl::StrCat("auth_tokens_file: line ", line_number);
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected `name role token`, got ", fields.size(), " fields"));
    }
    if (!ValidName(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name must match [A-Za-z0-9._@-]{1,64}"));
    }
    Role role;
    if (fields[1] == "reader") {
      role = Role::kReader;
    } else if (fields[1] == "operator") {
      role = Role::kOperator;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": role must be reader or operator"));
    }
    if (!ValidToken(fields[2])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": token must be at least ", kMinTokenLength, " printable characters"));
    }
    // The deployment examples' placeholders (deploy/k8s/secret-tokens.example.yaml) are
    // public: never a credential.
    if (absl::StartsWith(fields[2], "REPLACE-")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": token is the example's placeholder; set a random one"));
    }
    if (!names.insert(std::string(fields[0])).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate name ", fields[0]));
    }
    Entry entry{std::string(fields[0]), role, Sha256(fields[2])};
    for (const Entry& other : entries) {
      if (other.digest == entry.digest) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": token already used by ", other.name));
      }
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError("auth_tokens_file: no tokens");
  }
  return std::unique_ptr<Authenticator>(new Authenticator(true, std::move(entries)));
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("auth_tokens_file: cannot read ", path));
  }
  std::stringstream content;
  content << in.rdbuf();
  return FromContent(content.str());
}

std::unique_ptr<Authenticator> Authenticator::Disabled() {
  return std::unique_ptr<Authenticator>(new Authenticator(false, {}));
}

absl::StatusOr<Caller> Authenticator::Authorize(absl::string_view authorization,
                                                Permission permission,
                                                absl::string_view rpc) const {
  if (!enabled_) return Caller{"anonymous", Role::kOperator};
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing `authorization: Bearer <token>` metadata");
  }
  // The scheme is case-insensitive (RFC 7235).
  if (authorization.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError("authorization metadata must be `Bearer <token>`");
  }
  const absl::string_view token =
      absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  const std::array<unsigned char, 32> digest = Sha256(token);
  // Visit every entry whatever matches, comparing fixed-size digests in constant time.
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    const bool match = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    if (match) found = &entry;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  if (permission == Permission::kOperate && found->role != Role::kOperator) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, " needs the operator role; token \"", found->name, "\" is a reader"));
  }
  return Caller{found->name, found->role};
}

absl::StatusOr<Caller> Authenticator::Authorize(const grpc::ServerContext& context,
                                                Permission permission,
                                                absl::string_view rpc) const {
  if (!enabled_) return Authorize(absl::string_view(), permission, rpc);
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return Authorize(absl::string_view(), permission, rpc);
  return Authorize(absl::string_view(it->second.data(), it->second.size()), permission, rpc);
}

}  // namespace handoff::server
