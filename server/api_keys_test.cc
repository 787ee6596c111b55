#include "server/api_keys.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace handoff::server {
namespace {

constexpr char kKey[] = "sk_live_Hunter2-0123456789";

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

handoff::v1::SourceSpec WithFile(const std::string& path) {
  handoff::v1::SourceSpec spec;
  spec.set_id("s1");
  spec.mutable_api_key()->set_file(path);
  return spec;
}

handoff::v1::SourceSpec WithEnv(const std::string& name) {
  handoff::v1::SourceSpec spec;
  spec.set_id("s1");
  spec.mutable_api_key()->set_env(name);
  return spec;
}

TEST(ResolveApiKey, ReadsTheNamedFileOrVariableTrimmed) {
  const std::string file = TmpDir() + "/plain-key";
  WriteFile(file, absl::StrCat(kKey, "\n"));
  absl::StatusOr<std::string> key = ResolveApiKey(WithFile(file), ApiKeyPolicy{});
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kKey);
  setenv("HANDOFF_PROVIDER_KEY_MAIN", kKey, 1);
  key = ResolveApiKey(WithEnv("HANDOFF_PROVIDER_KEY_MAIN"), ApiKeyPolicy{});
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kKey);
  EXPECT_EQ(*ResolveApiKey(handoff::v1::SourceSpec(), ApiKeyPolicy{}), "");
}

// Under a policy, only the deployment's keys: a file inside the directory (reached through
// the symlinks a Kubernetes Secret volume uses) or a variable with the prefix. Anything
// else is refused before it is read, and no error shows a key.
TEST(ResolveApiKey, APolicyAdmitsOnlyTheDeploymentsKeys) {
  const std::string dir = TmpDir() + "/keys";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((dir + "/..data").c_str(), 0700), 0);
  WriteFile(dir + "/..data/mainnet-key", kKey);
  ASSERT_EQ(symlink("..data/mainnet-key", (dir + "/mainnet-key").c_str()), 0);
  const std::string outside = TmpDir() + "/other-secret";
  WriteFile(outside, "sk_other_Hunter2-9876543210");
  ASSERT_EQ(symlink(outside.c_str(), (dir + "/escape").c_str()), 0);
  setenv("HANDOFF_PROVIDER_KEY_MAIN", kKey, 1);
  setenv("DATABASE_PASSWORD", "Hunter2-db-password-0001", 1);

  ApiKeyPolicy policy;
  policy.dir = dir;
  policy.env_prefix = "HANDOFF_PROVIDER_KEY_";
  absl::StatusOr<std::string> key = ResolveApiKey(WithFile(dir + "/mainnet-key"), policy);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, kKey);
  key = ResolveApiKey(WithEnv("HANDOFF_PROVIDER_KEY_MAIN"), policy);
  ASSERT_TRUE(key.ok()) << key.status();

  for (const handoff::v1::SourceSpec& spec :
       {WithFile(outside), WithFile(dir + "/escape"), WithFile(dir + "/../other-secret"),
        WithFile(dir), WithFile(dir + "/missing"), WithEnv("DATABASE_PASSWORD")}) {
    absl::StatusOr<std::string> refused = ResolveApiKey(spec, policy);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
        << spec.ShortDebugString();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "--api_key_"))
        << refused.status();
    EXPECT_FALSE(absl::StrContains(refused.status().ToString(), "Hunter2")) << refused.status();
  }
}

TEST(ResolveApiKey, ErrorsNameWhereNeverWhat) {
  const std::string file = TmpDir() + "/bad-key";
  WriteFile(file, "sk_live Hunter2 with spaces");
  absl::StatusOr<std::string> key = ResolveApiKey(WithFile(file), ApiKeyPolicy{});
  EXPECT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(absl::StrContains(key.status().ToString(), "Hunter2")) << key.status();
  unsetenv("HANDOFF_PROVIDER_KEY_UNSET");
  key = ResolveApiKey(WithEnv("HANDOFF_PROVIDER_KEY_UNSET"), ApiKeyPolicy{});
  EXPECT_TRUE(absl::StrContains(key.status().message(), "is not set")) << key.status();
}

}  // namespace
}  // namespace handoff::server
