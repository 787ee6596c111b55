#include "server/api_keys.h"

#include <limits.h>
#include <stdlib.h>

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

}  // namespace

absl::StatusOr<std::string> ResolveApiKey(const handoff::v1::SourceSpec& spec,
                                          const ApiKeyPolicy& policy) {
  if (!spec.has_api_key()) return std::string();
  const handoff::v1::SecretRef& ref = spec.api_key();
  std::string key;
  if (ref.has_env()) {
    if (!policy.env_prefix.empty() && !absl::StartsWith(ref.env(), policy.env_prefix)) {
      return Refused(spec, absl::StrCat("api_key.env: ", ref.env(), " does not start with ",
                                        policy.env_prefix, " (--api_key_env_prefix)"));
    }
    const char* value = std::getenv(ref.env().c_str());
    if (value == nullptr || *value == '\0') {
      return Refused(spec,
                     absl::StrCat("api_key.env: environment variable ", ref.env(), " is not set"));
    }
    key = value;
  } else if (ref.has_file()) {
    if (!policy.dir.empty()) {
      const std::optional<std::string> dir = RealPath(policy.dir);
      const std::optional<std::string> file = RealPath(ref.file());
      if (!dir.has_value() || !file.has_value() || !absl::StartsWith(*file, *dir + "/")) {
        return Refused(spec, absl::StrCat("api_key.file: ", ref.file(), " is not a file inside ",
                                          policy.dir, " (--api_key_dir)"));
      }
    }
    std::ifstream in(ref.file());
    if (!in) return Refused(spec, absl::StrCat("api_key.file: cannot read ", ref.file()));
    std::stringstream ss;
    ss << in.rdbuf();
    key = ss.str();
  }
  key = std::string(absl::StripAsciiWhitespace(key));
  if (key.empty()) return Refused(spec, "api_key: the named secret is empty");
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) {
      return Refused(spec, "api_key: the secret holds characters a header cannot carry");
    }
  }
  return key;
}

}  // namespace handoff::server
