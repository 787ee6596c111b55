#include "server/api_keys.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

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

handoff::v1::SourceSpec WithSinkToken(const handoff::v1::SecretRef& token) {
  handoff::v1::SourceSpec spec;
  spec.set_id("s1");
  auto* d = spec.mutable_sink()->mutable_downstream();
  d->set_target("dns:///ledger.svc:8443");
  d->mutable_tls()->set_enabled(true);
  *d->mutable_token() = token;
  return spec;
}

// The sink's bearer token is a secret of the same kind, under the same policy: the
// deployment's files and variables only, and errors name the field, never the token.
TEST(ResolveSinkToken, ReadsTheNamedSecretUnderTheApiKeyPolicy) {
  EXPECT_EQ(*ResolveSinkToken(handoff::v1::SourceSpec(), ApiKeyPolicy{}), "");
  EXPECT_EQ(*ResolveSinkToken(WithEnv("HANDOFF_PROVIDER_KEY_MAIN"), ApiKeyPolicy{}), "");

  const std::string dir = TmpDir() + "/sink-tokens";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  WriteFile(dir + "/ledger", absl::StrCat(kKey, "\n"));
  const std::string outside = TmpDir() + "/sink-token-outside";
  WriteFile(outside, kKey);
  setenv("HANDOFF_SINK_TOKEN_LEDGER", kKey, 1);
  setenv("OTHER_SINK_TOKEN", kKey, 1);
  ApiKeyPolicy policy;
  policy.dir = dir;
  policy.env_prefix = "HANDOFF_SINK_TOKEN_";

  handoff::v1::SecretRef ref;
  ref.set_file(dir + "/ledger");
  absl::StatusOr<std::string> token = ResolveSinkToken(WithSinkToken(ref), policy);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kKey);
  ref.set_env("HANDOFF_SINK_TOKEN_LEDGER");
  token = ResolveSinkToken(WithSinkToken(ref), policy);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kKey);

  handoff::v1::SecretRef outside_file, other_env, unset_env, device;
  outside_file.set_file(outside);
  other_env.set_env("OTHER_SINK_TOKEN");
  unset_env.set_env("HANDOFF_SINK_TOKEN_UNSET");
  device.set_file("/dev/zero");
  for (const auto& [bad, policed] : {std::pair{outside_file, true}, std::pair{other_env, true},
                                     std::pair{unset_env, true}, std::pair{device, false}}) {
    token = ResolveSinkToken(WithSinkToken(bad), policed ? policy : ApiKeyPolicy{});
    EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition) << bad.DebugString();
    EXPECT_TRUE(absl::StrContains(token.status().message(), "sink.downstream.token."))
        << token.status();
    EXPECT_FALSE(absl::StrContains(token.status().ToString(), "Hunter2")) << token.status();
  }
}

}  // namespace
}  // namespace handoff::server
