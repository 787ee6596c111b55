#include "consumer/spec_validation.h"

#include <string>
#include <vector>

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

handoff::v1::SourceSpec DownstreamSpec() {
  handoff::v1::SourceSpec spec = MinimalSpec();
  spec.mutable_sink()->mutable_downstream()->set_target("dns:///ledger.svc:8443");
  return spec;
}

// The INVALID_ARGUMENT of `spec`, which must name `field` (and say `why`, when given).
void ExpectRefused(const handoff::v1::SourceSpec& spec, const std::string& field,
                   const std::string& why = "") {
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);
  ASSERT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_NE(n.status().message().find(field), absl::string_view::npos) << n.status();
  EXPECT_NE(n.status().message().find(why), absl::string_view::npos) << n.status();
}

TEST(NormalizeSpec, ADownstreamSinkTakesTlsMtlsAndATokenByReference) {
  handoff::v1::SourceSpec spec = DownstreamSpec();
  auto* d = spec.mutable_sink()->mutable_downstream();
  d->mutable_tls()->set_enabled(true);
  absl::StatusOr<handoff::v1::SourceSpec> n = NormalizeSpec(spec);  // system roots
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->sink().downstream().tls().enabled());
  d->mutable_tls()->set_ca_file("/etc/handoff/sink/ca.pem");
  d->mutable_tls()->set_client_cert_file("/etc/handoff/sink/tls.crt");
  d->mutable_tls()->set_client_key_file("/etc/handoff/sink/tls.key");
  d->mutable_tls()->set_server_name_override("ledger.internal");
  d->mutable_token()->set_env("HANDOFF_SINK_TOKEN");
  n = NormalizeSpec(spec);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->sink().downstream().tls().client_key_file(), "/etc/handoff/sink/tls.key");
  EXPECT_EQ(n->sink().downstream().token().env(), "HANDOFF_SINK_TOKEN");
  d->mutable_token()->set_file("/etc/handoff/sink/token");
  EXPECT_TRUE(NormalizeSpec(spec).ok());
}

TEST(NormalizeSpec, AnEmptyTlsIsTheSameSpecAsNone) {
  handoff::v1::SourceSpec spec = DownstreamSpec();
  absl::StatusOr<handoff::v1::SourceSpec> without = NormalizeSpec(spec);
  spec.mutable_sink()->mutable_downstream()->mutable_tls();
  absl::StatusOr<handoff::v1::SourceSpec> empty = NormalizeSpec(spec);
  ASSERT_TRUE(without.ok() && empty.ok()) << empty.status();
  EXPECT_FALSE(empty->sink().downstream().has_tls());
  EXPECT_EQ(without->SerializeAsString(), empty->SerializeAsString());
}

TEST(NormalizeSpec, TlsFieldsWithoutEnabledAreRefusedByName) {
  for (const char* field : {"ca_file", "client_cert_file", "client_key_file",
                            "server_name_override"}) {
    handoff::v1::SourceSpec spec = DownstreamSpec();
    auto* tls = spec.mutable_sink()->mutable_downstream()->mutable_tls();
    const std::string f = field;
    if (f == "ca_file") tls->set_ca_file("/ca.pem");
    if (f == "client_cert_file") {
      tls->set_client_cert_file("/c.pem");
      tls->set_client_key_file("/k.pem");
    }
    if (f == "client_key_file") tls->set_client_key_file("/k.pem");
    if (f == "server_name_override") tls->set_server_name_override("sink.test");
    ExpectRefused(spec, "spec.sink.downstream.tls.", "tls.enabled is false");
  }
}

TEST(NormalizeSpec, AnIncompleteClientCertificatePairIsRefused) {
  for (bool cert : {true, false}) {
    handoff::v1::SourceSpec spec = DownstreamSpec();
    auto* tls = spec.mutable_sink()->mutable_downstream()->mutable_tls();
    tls->set_enabled(true);
    if (cert) {
      tls->set_client_cert_file("/etc/handoff/sink/tls.crt");
    } else {
      tls->set_client_key_file("/etc/handoff/sink/tls.key");
    }
    ExpectRefused(spec, "client_cert_file/client_key_file", "set both (mTLS) or neither");
  }
}

TEST(NormalizeSpec, BadTlsPathsAndNamesAreRefused) {
  handoff::v1::SourceSpec spec = DownstreamSpec();
  auto* tls = spec.mutable_sink()->mutable_downstream()->mutable_tls();
  tls->set_enabled(true);
  tls->set_ca_file("/ca\n.pem");
  ExpectRefused(spec, "spec.sink.downstream.tls.ca_file");
  tls->set_ca_file(std::string(5000, 'a'));
  ExpectRefused(spec, "spec.sink.downstream.tls.ca_file");
  tls->clear_ca_file();
  tls->set_server_name_override("sink test");
  ExpectRefused(spec, "spec.sink.downstream.tls.server_name_override", "host name");
}

TEST(NormalizeSpec, ASinkTokenIsAReferenceAndNeedsTls) {
  handoff::v1::SourceSpec spec = DownstreamSpec();
  auto* d = spec.mutable_sink()->mutable_downstream();
  d->mutable_token()->set_env("HANDOFF_SINK_TOKEN");
  ExpectRefused(spec, "spec.sink.downstream.token", "never sent in plaintext");
  d->mutable_tls()->set_enabled(true);
  EXPECT_TRUE(NormalizeSpec(spec).ok());
  d->mutable_token()->Clear();  // neither env nor file: the value has no place
  ExpectRefused(spec, "spec.sink.downstream.token", "never the secret itself");
  d->mutable_token()->set_env("");
  ExpectRefused(spec, "spec.sink.downstream.token.env");
  d->mutable_token()->set_file("");
  ExpectRefused(spec, "spec.sink.downstream.token.file");
}

TEST(UnsafeSpecChanges, ASinksTlsAndTokenChangeInPlaceButNotItsTarget) {
  absl::StatusOr<handoff::v1::SourceSpec> plain = NormalizeSpec(DownstreamSpec());
  ASSERT_TRUE(plain.ok()) << plain.status();
  handoff::v1::SourceSpec secured = *plain;
  auto* d = secured.mutable_sink()->mutable_downstream();
  d->mutable_tls()->set_enabled(true);
  d->mutable_tls()->set_ca_file("/etc/handoff/sink/ca.pem");
  d->mutable_token()->set_file("/etc/handoff/sink/token");
  EXPECT_TRUE(UnsafeSpecChanges(*plain, secured).empty());
  d->set_target("dns:///other.svc:8443");
  EXPECT_EQ(UnsafeSpecChanges(*plain, secured), std::vector<std::string>{"sink"});
}

}  // namespace
}  // namespace handoff::consumer
