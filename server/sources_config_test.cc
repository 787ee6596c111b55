#include "server/sources_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_source_manager.h"

namespace handoff::server {
namespace {

constexpr char kConfig[] = R"pb(
  sources {
    spec {
      id: "mainnet-usdc"
      provider_url: "https://events.example.com"
      chain: "ethereum"
      source: "usdc"
      filter: "Transfer"
      transport: TRANSPORT_POLL
      start { block: 100 }
      page_limit: 500
      api_key { file: "/secrets/provider/key" }
      sink { local_rows {} }
    }
    start: true
  }
  sources {
    spec { id: "second" provider_url: "http://127.0.0.1:9" }
  }
)pb";

class SourcesConfigTest : public ::testing::Test {
 protected:
  std::vector<std::string> lines_;
  Logger logger_{LogLevel::kDebug, [this](absl::string_view l) { lines_.emplace_back(l); }};
  testing::FakeSourceManager manager_;
};

TEST_F(SourcesConfigTest, ParsesTextFormat) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->sources_size(), 2);
  EXPECT_EQ(config->sources(0).spec().api_key().file(), "/secrets/provider/key");
  EXPECT_TRUE(config->sources(0).start());
}

TEST_F(SourcesConfigTest, SyntaxErrorNamesLineAndColumn) {
  auto config = ParseSourcesConfig("sources {\n  spec { idd: \"x\" }\n}\n");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("line 2"), absl::string_view::npos)
      << config.status();
}

// A key written in the wrong place is quoted by protobuf's parser: the error keeps the
// position and the schema's names, and none of the file's other words.
TEST_F(SourcesConfigTest, SyntaxErrorsNeverQuoteTheFilesValues) {
  for (const char* text :
       {"sources {\n  spec {\n    api_key: \"sk_live_Hunter2xyz\"\n  }\n}\n",
        "sources {\n  spec {\n    sk_live_Hunter2xyz: 1\n  }\n}\n",
        "sources {\n  spec {\n    api_key { env sk_live_Hunter2xyz }\n  }\n}\n"}) {
    auto config = ParseSourcesConfig(text);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(config.status().message());
    EXPECT_EQ(message.find("Hunter2"), std::string::npos) << message;
    EXPECT_NE(message.find("line 3"), std::string::npos) << message;
  }
  // The schema's own names stay: the error still says which message it was in.
  auto config = ParseSourcesConfig("sources {\n  spec { idd: \"x\" }\n}\n");
  EXPECT_NE(config.status().message().find("handoff.v1.SourceSpec"), absl::string_view::npos)
      << config.status();
}

TEST_F(SourcesConfigTest, CreatesAndStartsDeclaredSources) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  auto first = manager_.GetSource("mainnet-usdc");
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->desired_running());
  auto second = manager_.GetSource("second");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->desired_running());
  // Applying the same file again is a no-op.
  EXPECT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
}

// The FakeSourceManager, but CreateSource of an existing id with an identical spec and
// start=true starts it, as the real SourceManager does (an idempotent create that asks
// for a start).
class StartingOnCreateManager final : public consumer::SourceManager {
 public:
  explicit StartingOnCreateManager(testing::FakeSourceManager* fake) : f_(fake) {}
  absl::Status Recover() override { return f_->Recover(); }
  void Shutdown() override { f_->Shutdown(); }
  absl::StatusOr<handoff::v1::Source> CreateSource(
      const handoff::v1::CreateSourceRequest& request) override {
    const bool existed = f_->GetSource(request.spec().id()).ok();
    absl::StatusOr<handoff::v1::Source> created = f_->CreateSource(request);
    if (!created.ok() || !existed || !request.start()) return created;
    return f_->StartSource(request.spec().id());
  }
  absl::StatusOr<handoff::v1::Source> UpdateSource(const handoff::v1::SourceSpec& s) override {
    return f_->UpdateSource(s);
  }
  absl::StatusOr<handoff::v1::Source> StartSource(absl::string_view id) override {
    return f_->StartSource(id);
  }
  absl::StatusOr<handoff::v1::Source> StopSource(absl::string_view id) override {
    return f_->StopSource(id);
  }
  absl::Status DeleteSource(absl::string_view id) override { return f_->DeleteSource(id); }
  absl::StatusOr<handoff::v1::Source> GetSource(absl::string_view id) override {
    return f_->GetSource(id);
  }
  absl::StatusOr<handoff::v1::ListSourcesResponse> ListSources(
      const handoff::v1::ListSourcesRequest& r) override {
    return f_->ListSources(r);
  }
  absl::StatusOr<handoff::v1::Progress> GetProgress(absl::string_view id) override {
    return f_->GetProgress(id);
  }
  absl::StatusOr<handoff::v1::Progress> WaitProgress(absl::string_view id, uint64_t* generation,
                                                     absl::Time deadline) override {
    return f_->WaitProgress(id, generation, deadline);
  }
  absl::StatusOr<handoff::v1::ListHoldsResponse> ListHolds(
      const handoff::v1::ListHoldsRequest& r) override {
    return f_->ListHolds(r);
  }
  absl::StatusOr<handoff::v1::Hold> GetHold(const handoff::v1::GetHoldRequest& r) override {
    return f_->GetHold(r);
  }
  absl::StatusOr<handoff::v1::ResolveHoldResponse> ResolveHold(
      const handoff::v1::ResolveHoldRequest& r, absl::string_view actor) override {
    return f_->ResolveHold(r, actor);
  }
  absl::StatusOr<handoff::v1::ListQuarantineResponse> ListQuarantine(
      const handoff::v1::ListQuarantineRequest& r) override {
    return f_->ListQuarantine(r);
  }
  absl::StatusOr<handoff::v1::Source> RebuildSource(
      const handoff::v1::RebuildSourceRequest& r) override {
    return f_->RebuildSource(r);
  }
  absl::StatusOr<handoff::v1::QueryEventsResponse> QueryEvents(
      const handoff::v1::QueryEventsRequest& r) override {
    return f_->QueryEvents(r);
  }
  std::vector<handoff::v1::Progress> AllProgress() override { return f_->AllProgress(); }

 private:
  testing::FakeSourceManager* const f_;
};

// `start: true` starts a declared source when the file creates it; for a source that
// exists, the operator's StartSource/StopSource decides (the stored desired_running):
// a source stopped on purpose stays stopped through every restart that applies the same
// file, and one started stays started when the file says nothing of starting it.
TEST_F(SourcesConfigTest, AnExistingSourceKeepsTheOperatorsStartOrStop) {
  StartingOnCreateManager manager(&manager_);
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager, &logger_).ok());
  ASSERT_TRUE(manager.GetSource("mainnet-usdc")->desired_running());
  ASSERT_TRUE(manager.StopSource("mainnet-usdc").ok());
  ASSERT_TRUE(manager.StartSource("second").ok());
  // The next start applies the same file.
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager, &logger_).ok());
  EXPECT_FALSE(manager.GetSource("mainnet-usdc")->desired_running())
      << "a declared start: true undid the operator's StopSource";
  EXPECT_TRUE(manager.GetSource("second")->desired_running());
  // Also when the file changes the source safely at that start.
  config->mutable_sources(0)->mutable_spec()->set_page_limit(100);
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager, &logger_).ok());
  EXPECT_FALSE(manager.GetSource("mainnet-usdc")->desired_running());
  EXPECT_EQ(manager.GetSource("mainnet-usdc")->spec().page_limit(), 100u);
}

TEST_F(SourcesConfigTest, InvalidSpecNamesTheEntryAndTheField) {
  auto config = ParseSourcesConfig(R"pb(sources { spec { id: "Bad!" } })pb");
  ASSERT_TRUE(config.ok());
  const absl::Status status = ApplySourcesConfig(*config, &manager_, &logger_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("sources[0]"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("spec.id"), absl::string_view::npos) << status;
}

TEST_F(SourcesConfigTest, UnsafeChangeIsRefusedNamingTheFields) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  config->mutable_sources(0)->mutable_spec()->set_chain("polygon");
  config->mutable_sources(0)->mutable_spec()->mutable_start()->set_block(5);
  const absl::Status status = ApplySourcesConfig(*config, &manager_, &logger_);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("chain, start"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("mainnet-usdc"), absl::string_view::npos) << status;
}

TEST_F(SourcesConfigTest, SinkChangeIsRefused) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  config->mutable_sources(0)->mutable_spec()->mutable_sink()->mutable_downstream()->set_target(
      "127.0.0.1:9000");
  EXPECT_EQ(ApplySourcesConfig(*config, &manager_, &logger_).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SourcesConfigTest, SafeChangeIsApplied) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  auto* spec = config->mutable_sources(0)->mutable_spec();
  spec->set_page_limit(100);
  spec->set_transport(handoff::v1::TRANSPORT_SSE);
  spec->mutable_api_key()->set_env("PROVIDER_KEY");
  spec->mutable_failure_policy()->set_max_attempts(9);
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  auto stored = manager_.GetSource(spec->id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->spec().page_limit(), 100u);
  EXPECT_EQ(stored->spec().transport(), handoff::v1::TRANSPORT_SSE);
  EXPECT_EQ(stored->spec().failure_policy().max_attempts(), 9u);
}

// A safe change that leaves a source unable to start (an api_key naming an unset
// variable) halts that source as CONFIG_INVALID, never the server's start: the apply goes
// on, and the log names the source and the reason.
TEST_F(SourcesConfigTest, AnUpdatedSourceThatCannotStartIsReportedAndTheApplyGoesOn) {
  auto config = ParseSourcesConfig(kConfig);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  handoff::v1::Progress halted;
  halted.set_source_id("second");
  halted.set_state(handoff::v1::SOURCE_STATE_CONFIG_INVALID);
  halted.set_reason("cannot start: api_key.env: PROVIDER_KEY is not set");
  ASSERT_TRUE(manager_.SetProgress(halted).ok());
  config->mutable_sources(1)->mutable_spec()->mutable_api_key()->set_env("PROVIDER_KEY");
  lines_.clear();
  ASSERT_TRUE(ApplySourcesConfig(*config, &manager_, &logger_).ok());
  bool reported = false;
  for (const std::string& line : lines_) {
    if (line.find("second") != std::string::npos &&
        line.find("PROVIDER_KEY is not set") != std::string::npos &&
        line.find("CONFIG_INVALID") != std::string::npos) {
      reported = true;
    }
  }
  EXPECT_TRUE(reported) << "log:\n" << absl::StrJoin(lines_, "\n");
}

}  // namespace
}  // namespace handoff::server
