#include "server/api_keys.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace handoff::server {
namespace {

// The path with every symlink resolved, or nullopt when it does not exist.
std::optional<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return std::nullopt;
  return std::string(resolved);
}

absl::Status Refused(const handoff::v1::SourceSpec& spec, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("source ", spec.id(), ": ", why));
}

// A secret file is small: a larger one (or a device, a FIFO) is not one, and reading it
// could take the source's start with it.
constexpr off_t kMaxSecretFileBytes = 64 << 10;

// The secret `ref` names, called `field` in errors, under `policy`.
absl::StatusOr<std::string> ResolveSecret(const handoff::v1::SourceSpec& spec,
                                          const handoff::v1::SecretRef& ref,
                                          absl::string_view field, const ApiKeyPolicy& policy) {
  std::string key;
  if (ref.has_env()) {
    if (!policy.env_prefix.empty() && !absl::StartsWith(ref.env(), policy.env_prefix)) {
      return Refused(spec, absl::StrCat(field, ".env: ", ref.env(), " does not start with ",
                                        policy.env_prefix, " (--api_key_env_prefix)"));
    }
    const char* value = std::getenv(ref.env().c_str());
    if (value == nullptr || *value == '\0') {
      return Refused(spec,
                     absl::StrCat(field, ".env: environment variable ", ref.env(), " is not set"));
    }
    key = value;
  } else if (ref.has_file()) {
    if (!policy.dir.empty()) {
      const std::optional<std::string> dir = RealPath(policy.dir);
      const std::optional<std::string> file = RealPath(ref.file());
      if (!dir.has_value() || !file.has_value() || !absl::StartsWith(*file, *dir + "/")) {
        return Refused(spec, absl::StrCat(field, ".file: ", ref.file(), " is not a file inside ",
                                          policy.dir, " (--api_key_dir)"));
      }
    }
    struct stat st;
    if (stat(ref.file().c_str(), &st) != 0) {
      return Refused(spec, absl::StrCat(field, ".file: cannot read ", ref.file()));
    }
    if (!S_ISREG(st.st_mode) || st.st_size > kMaxSecretFileBytes) {
      return Refused(spec, absl::StrCat(field, ".file: ", ref.file(),
                                        " is not a regular file of at most 64 KiB"));
    }
    std::ifstream in(ref.file());
    if (!in) return Refused(spec, absl::StrCat(field, ".file: cannot read ", ref.file()));
    std::stringstream ss;
    ss << in.rdbuf();
    key = ss.str();
  }
  key = std::string(absl::StripAsciiWhitespace(key));
  if (key.empty()) return Refused(spec, absl::StrCat(field, ": the named secret is empty"));
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) {
      return Refused(spec,
                     absl::StrCat(field, ": the secret holds characters a header cannot carry"));
    }
  }
  return key;
}

}  // namespace

absl::StatusOr<std::string> ResolveApiKey(const handoff::v1::SourceSpec& spec,
                                          const ApiKeyPolicy& policy) {
  if (!spec.has_api_key()) return std::string();
  return ResolveSecret(spec, spec.api_key(), "api_key", policy);
}

absl::StatusOr<std::string> ResolveSinkToken(const handoff::v1::SourceSpec& spec,
                                             const ApiKeyPolicy& policy) {
  if (!spec.sink().has_downstream() || !spec.sink().downstream().has_token()) {
    return std::string();
  }
  return ResolveSecret(spec, spec.sink().downstream().token(), "sink.downstream.token", policy);
}

}  // namespace handoff::server
