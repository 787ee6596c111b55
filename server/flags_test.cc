// OptionsFromFlags: --max_page_bytes is validated at start and reaches the provider of
// every source the production factories build.
#include "server/flags.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "consumer/provider.h"
#include "consumer/provider/http_provider.h"
#include "gtest/gtest.h"
#include "sim/provider_sim.h"

ABSL_DECLARE_FLAG(int, max_page_bytes);

namespace handoff::server {
namespace {

constexpr char kToken[] = "flags-test-T0KEN-93c1";
constexpr char kKeyEnv[] = "HANDOFF_FLAGS_TEST_KEY";

TEST(MaxPageBytesFlagTest, DefaultIsTheAdaptersCap) {
  absl::FlagSaver saver;
  absl::StatusOr<ServerOptions> options = OptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->max_page_bytes, consumer::HttpProviderOptions().max_page_bytes);
  EXPECT_EQ(options->max_page_bytes, size_t{64} << 20);
  EXPECT_EQ(ServerOptions().max_page_bytes, size_t{64} << 20);
}

TEST(MaxPageBytesFlagTest, AcceptsItsRangeAndNamesTheFlagOutsideIt) {
  absl::FlagSaver saver;
  for (int ok : {65536, 1048576, 268435456}) {
    absl::SetFlag(&FLAGS_max_page_bytes, ok);
    absl::StatusOr<ServerOptions> options = OptionsFromFlags();
    ASSERT_TRUE(options.ok()) << ok << ": " << options.status();
    EXPECT_EQ(options->max_page_bytes, static_cast<size_t>(ok));
  }
  for (int bad : {-1, 0, 1024, 65535, 268435457}) {
    absl::SetFlag(&FLAGS_max_page_bytes, bad);
    absl::StatusOr<ServerOptions> options = OptionsFromFlags();
    ASSERT_FALSE(options.ok()) << bad;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(options.status().message(),
              absl::StrCat("--max_page_bytes=", bad, " is outside 65536..268435456"));
  }
}

// The same first page of 1000 logs (~0.7 MB) through the provider factory of the flags'
// options: accepted under the default cap, refused as page_too_large under 64 KiB, by
// polling and by SSE, with a message that names the cap and carries no key.
TEST(MaxPageBytesFlagTest, EverySourcesProviderEnforcesIt) {
  setenv(kKeyEnv, kToken, 1);
  sim::ProviderSimOptions sim_options;
  sim_options.chain.seed = 3;
  sim_options.chain.initial_head = 400;
  sim_options.chain.logs_per_block = 5;
  sim_options.bearer_token = kToken;
  sim::ProviderSim sim(sim_options);
  ASSERT_TRUE(sim.Start(0).ok());

  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    SCOPED_TRACE(handoff::v1::Transport_Name(transport));
    handoff::v1::SourceSpec spec;
    spec.set_id("big-pages");
    spec.set_provider_url(sim.base_url());
    spec.set_chain("sim");
    spec.set_source("logs");
    spec.set_filter("all");
    spec.set_transport(transport);
    spec.set_page_limit(1000);
    spec.mutable_api_key()->set_env(kKeyEnv);
    for (int cap : {0, 65536}) {  // 0: the flag's default
      absl::FlagSaver saver;
      if (cap != 0) absl::SetFlag(&FLAGS_max_page_bytes, cap);
      absl::StatusOr<ServerOptions> options = OptionsFromFlags();
      ASSERT_TRUE(options.ok()) << options.status();
      absl::StatusOr<std::unique_ptr<consumer::Provider>> provider =
          options->factories.provider(spec);
      ASSERT_TRUE(provider.ok()) << provider.status();
      consumer::FetchResult r = (*provider)->Fetch("0");
      if (cap == 0) {
        ASSERT_TRUE(r.page.has_value()) << r.refusal->message;
        EXPECT_EQ(r.page->items.size(), 1000u);
        continue;
      }
      ASSERT_TRUE(r.refusal.has_value()) << "a page of " << r.page->items.size() << " logs";
      EXPECT_EQ(r.refusal->kind, consumer::RefusalKind::kMalformedPage);
      EXPECT_EQ(r.refusal->code, "page_too_large");
      EXPECT_TRUE(absl::StrContains(r.refusal->message, "max_page_bytes (65536)"))
          << r.refusal->message;
      EXPECT_FALSE(absl::StrContains(r.refusal->message, kToken));
    }
  }
  sim.Stop();
}

}  // namespace
}  // namespace handoff::server
