#include "consumer/spec_validation.h"

#include <string>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

handoff::v1::SourceSpec MinimalSpec() {
  handoff::v1::SourceSpec spec;
  spec.set_id("s1");
  spec.set_provider_url("http://127.0.0.1:8545");
  spec.set_chain("sim");
  spec.set_source("logs");
  spec.set_filter("all");
  spec.set_transport(handoff::v1::TRANSPORT_POLL);
  spec.mutable_start()->set_block(100);
  return spec;
}

TEST(NormalizeSpec, ADownstreamSinkIsGatedOnFinalityUnlessTheSpecSaysOtherwise) {
  handoff::v1::SourceSpec spec = MinimalSpec();
  spec.mutable_sink()->mutable_downstream()->set_target("127.0.0.1:9000");
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->sink().gate(), handoff::v1::DELIVERY_GATE_FINALIZED);

  for (handoff::v1::DeliveryGate gate :
       {handoff::v1::DELIVERY_GATE_IMMEDIATE, handoff::v1::DELIVERY_GATE_SAFE}) {
    spec.mutable_sink()->set_gate(gate);
    n = NormalizeSpec(spec);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(n->sink().gate(), gate);
  }
}

TEST(NormalizeSpec, LocalRowsAreTheDefaultSinkAndTakeNoGate) {
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(MinimalSpec());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->sink().has_local_rows());
  EXPECT_EQ(n->sink().gate(), handoff::v1::DELIVERY_GATE_IMMEDIATE);
  EXPECT_EQ(n->page_limit(), 1000u);
}

TEST(NormalizeSpec, ChainSourceAndFilterAreRequiredByName) {
  for (const char* field : {"chain", "source", "filter"}) {
    handoff::v1::SourceSpec spec = MinimalSpec();
    if (std::string(field) == "chain") spec.clear_chain();
    if (std::string(field) == "source") spec.clear_source();
    if (std::string(field) == "filter") spec.clear_filter();
    absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(n.status().message().find(std::string("spec.") + field), absl::string_view::npos)
        << n.status();
  }
}

TEST(NormalizeSpec, AnUnknownGateIsRefusedByName) {
  handoff::v1::SourceSpec spec = MinimalSpec();
  spec.mutable_sink()->mutable_downstream()->set_target("127.0.0.1:9000");
  spec.mutable_sink()->set_gate(static_cast<handoff::v1::DeliveryGate>(42));
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("spec.sink.gate"), absl::string_view::npos)
      << n.status();
}

TEST(NormalizeSpec, AProviderUrlWithCredentialsIsRefusedWithoutEchoingThem) {
  for (const char* url : {"https://user:hunter2@provider.example/v1",
                          "http://hunter2@127.0.0.1:8545", "https://:hunter2@provider.example"}) {
    handoff::v1::SourceSpec spec = MinimalSpec();
    spec.set_provider_url(url);
    absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_NE(n.status().message().find("credentials"), absl::string_view::npos) << n.status();
    EXPECT_EQ(n.status().ToString().find("hunter2"), std::string::npos) << n.status();
  }
  // An '@' in the path is not userinfo.
  handoff::v1::SourceSpec spec = MinimalSpec();
  spec.set_provider_url("https://provider.example/v1/@team/");
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->provider_url(), "https://provider.example/v1/@team");
}

// Each bounds a wait (the max is raised to the initial one): neither may pass an hour.
TEST(NormalizeSpec, BackoffsAreAtMostAnHour) {
  handoff::v1::SourceSpec spec = MinimalSpec();
  spec.mutable_failure_policy()->set_initial_backoff_ms(3600000);
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->failure_policy().max_backoff_ms(), 3600000u);
  for (const char* field : {"initial_backoff_ms", "max_backoff_ms"}) {
    spec = MinimalSpec();
    if (std::string(field) == "initial_backoff_ms") {
      spec.mutable_failure_policy()->set_initial_backoff_ms(4000000000u);
    } else {
      spec.mutable_failure_policy()->set_max_backoff_ms(3600001);
    }
    n = NormalizeSpec(spec);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(n.status().message().find(field), absl::string_view::npos) << n.status();
  }
}

TEST(NormalizeSpec, AProviderUrlWithoutAHostIsRefused) {
  for (const char* url : {"http://", "https:///v1", "http://:8545/v1"}) {
    handoff::v1::SourceSpec spec = MinimalSpec();
    spec.set_provider_url(url);
    absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_NE(n.status().message().find("host"), absl::string_view::npos) << n.status();
  }
}

}  // namespace
}  // namespace handoff::consumer
