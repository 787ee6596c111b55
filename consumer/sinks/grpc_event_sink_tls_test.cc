// The EventSink client over TLS, end to end on loopback: the sample sink serves TLS (and
// mTLS, and a bearer token check) with certificates made by openssl for this test, and
// the client is built from a spec by MakeExternalSink, as handoffd builds it.
//
// A call that cannot be made securely (a plaintext peer, an untrusted or misnamed
// certificate, a client certificate the sink refuses, a missing or wrong token) is a
// transport error, answered once the handshake or the call fails: the deadline is one
// minute, and each such answer is checked to be gRPC's UNAVAILABLE or UNAUTHENTICATED,
// not DEADLINE_EXCEEDED. No answer or error names a token or a key.
#include <sys/stat.h>

#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "consumer/sinks/grpc_event_sink.h"
#include "gtest/gtest.h"
#include "sim/sample_sink/sample_sink.h"
#include "sim/sample_sink/test_certs.h"

namespace handoff::consumer {
namespace {

using Kind = SinkAnswer::Kind;
using handoff::sim::ReadTestFile;
using handoff::sim::SampleSink;
using handoff::sim::TestCerts;

constexpr char kSource[] = "tls-src";
constexpr char kToken[] = "sink-token-Hunter2-5f0c9e1a";
constexpr char kWrongToken[] = "sink-token-Wrong-77a1b2c3";

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

class TlsSinkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> made = handoff::sim::MakeTestCerts(TmpPath("certs"));
    ASSERT_TRUE(made.ok()) << made.status();
    certs_ = new TestCerts(*std::move(made));
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  struct SinkTls {
    std::string cert, key, client_ca, token;
  };

  // A sample sink on a port of its own; TLS when `tls.cert` is set.
  std::unique_ptr<SampleSink> StartSink(const SinkTls& tls) {
    SampleSink::Options options;
    options.core.db_path = TmpPath(absl::StrCat("sink-", ++sinks_));
    if (!tls.cert.empty()) {
      options.tls_cert_chain = ReadTestFile(tls.cert);
      options.tls_private_key = ReadTestFile(tls.key);
    }
    if (!tls.client_ca.empty()) options.tls_client_ca = ReadTestFile(tls.client_ca);
    options.bearer_token = tls.token;
    absl::StatusOr<std::unique_ptr<SampleSink>> sink = SampleSink::Start(std::move(options));
    EXPECT_TRUE(sink.ok()) << sink.status();
    return sink.ok() ? *std::move(sink) : nullptr;
  }

  // A downstream spec for `sink`, TLS off, with a deadline no failure here waits for.
  static handoff::v1::SourceSpec Spec(const SampleSink& sink, bool batch = false) {
    handoff::v1::SourceSpec spec;
    spec.set_id(kSource);
    auto* d = spec.mutable_sink()->mutable_downstream();
    d->set_target(sink.target());
    d->set_deadline_ms(60000);
    d->set_batch(batch);
    return spec;
  }

  static handoff::v1::SinkSpec::Downstream::Tls* Tls(handoff::v1::SourceSpec* spec) {
    auto* tls = spec->mutable_sink()->mutable_downstream()->mutable_tls();
    tls->set_enabled(true);
    return tls;
  }

  // Delivers event `n` of this test through a client made from `spec` with `token`.
  std::vector<SinkAnswer> DeliverOne(const handoff::v1::SourceSpec& spec,
                                     const std::string& token = "") {
    absl::StatusOr<std::unique_ptr<ExternalSink>> client = MakeExternalSink(spec, token);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    rows_.emplace_back();
    handoff::v1::EventRow& row = rows_.back();
    row.set_block_number(100 + rows_.size());
    row.set_block_hash(absl::StrCat("0xh", row.block_number()));
    const Delivery delivery{IdempotencyKey(kSource, row), &row, handoff::v1::FINALITY_FINALIZED};
    return (*client)->Deliver(kSource, {&delivery, 1});
  }

  // One answer, a transport error that failed fast and names no secret.
  void ExpectFastTransportError(const std::vector<SinkAnswer>& answers,
                                absl::string_view code = "UNAVAILABLE") {
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].kind, Kind::kTransportError) << answers[0].message;
    EXPECT_TRUE(absl::StrContains(answers[0].message, code)) << answers[0].message;
    ExpectNoSecret(answers[0].message);
  }

  static void ExpectNoSecret(absl::string_view text) {
    EXPECT_FALSE(absl::StrContains(text, "Hunter2")) << text;
    EXPECT_FALSE(absl::StrContains(text, kWrongToken)) << text;
    EXPECT_FALSE(absl::StrContains(text, "PRIVATE KEY")) << text;
    for (const std::string* key : {&certs_->client_key, &certs_->server_key}) {
      const std::string pem = ReadTestFile(*key);
      // A line of the key's base64 body.
      const std::string body = pem.substr(pem.find('\n') + 1, 40);
      EXPECT_FALSE(absl::StrContains(text, body)) << text;
    }
  }

  static std::vector<Kind> Kinds(const std::vector<SinkAnswer>& answers) {
    std::vector<Kind> kinds;
    for (const SinkAnswer& a : answers) kinds.push_back(a.kind);
    return kinds;
  }

  static TestCerts* certs_;
  static int sinks_;  // every sink of the binary has a table of its own
  std::deque<handoff::v1::EventRow> rows_;
};

TestCerts* TlsSinkTest::certs_ = nullptr;
int TlsSinkTest::sinks_ = 0;

TEST_F(TlsSinkTest, DeliversOverTlsPerEventAndBatched) {
  std::unique_ptr<SampleSink> sink = StartSink({certs_->server_cert, certs_->server_key});
  ASSERT_NE(sink, nullptr);
  for (bool batch : {false, true}) {
    handoff::v1::SourceSpec spec = Spec(*sink, batch);
    Tls(&spec)->set_ca_file(certs_->ca);
    EXPECT_EQ(Kinds(DeliverOne(spec)), std::vector<Kind>{Kind::kApplied}) << batch;
  }
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
  absl::StatusOr<std::map<std::string, handoff::sim::SinkRecord>> records = sink->Records();
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 2u);
}

TEST_F(TlsSinkTest, APlaintextClientOfATlsSinkIsATransportErrorNotAHang) {
  std::unique_ptr<SampleSink> sink = StartSink({certs_->server_cert, certs_->server_key});
  ASSERT_NE(sink, nullptr);
  ExpectFastTransportError(DeliverOne(Spec(*sink)));
  ExpectFastTransportError(DeliverOne(Spec(*sink, /*batch=*/true)));
  EXPECT_TRUE(sink->Records()->empty());
}

TEST_F(TlsSinkTest, ATlsClientOfAPlaintextSinkIsATransportError) {
  std::unique_ptr<SampleSink> sink = StartSink({});
  ASSERT_NE(sink, nullptr);
  handoff::v1::SourceSpec spec = Spec(*sink);
  Tls(&spec)->set_ca_file(certs_->ca);
  ExpectFastTransportError(DeliverOne(spec));
  EXPECT_TRUE(sink->Records()->empty());
}

TEST_F(TlsSinkTest, AnUntrustedSinkCertificateIsATransportErrorNamingNoSecret) {
  std::unique_ptr<SampleSink> sink =
      StartSink({certs_->server_cert, certs_->server_key, "", kToken});
  ASSERT_NE(sink, nullptr);
  handoff::v1::SourceSpec spec = Spec(*sink);
  Tls(&spec)->set_ca_file(certs_->other_ca);
  spec.mutable_sink()->mutable_downstream()->mutable_tls()->set_client_cert_file(
      certs_->client_cert);
  spec.mutable_sink()->mutable_downstream()->mutable_tls()->set_client_key_file(
      certs_->client_key);
  ExpectFastTransportError(DeliverOne(spec, kToken));
  // The system's roots do not trust a test CA either.
  Tls(&spec)->clear_ca_file();
  ExpectFastTransportError(DeliverOne(spec, kToken));
  EXPECT_TRUE(sink->Records()->empty());
}

TEST_F(TlsSinkTest, MutualTlsNeedsTheClientCertificateTheSinkTrusts) {
  std::unique_ptr<SampleSink> sink =
      StartSink({certs_->server_cert, certs_->server_key, certs_->client_ca});
  ASSERT_NE(sink, nullptr);
  handoff::v1::SourceSpec spec = Spec(*sink);
  Tls(&spec)->set_ca_file(certs_->ca);
  ExpectFastTransportError(DeliverOne(spec));  // no client certificate

  Tls(&spec)->set_client_cert_file(certs_->stranger_cert);
  Tls(&spec)->set_client_key_file(certs_->stranger_key);
  ExpectFastTransportError(DeliverOne(spec));  // one the sink's client CA did not sign

  Tls(&spec)->set_client_cert_file(certs_->client_cert);
  Tls(&spec)->set_client_key_file(certs_->client_key);
  EXPECT_EQ(Kinds(DeliverOne(spec)), std::vector<Kind>{Kind::kApplied});
  EXPECT_EQ(sink->Records()->size(), 1u);
}

TEST_F(TlsSinkTest, TheServerNameOverrideIsWhatTheCertificateIsCheckedAgainst) {
  std::unique_ptr<SampleSink> sink =
      StartSink({certs_->named_server_cert, certs_->named_server_key});
  ASSERT_NE(sink, nullptr);
  handoff::v1::SourceSpec spec = Spec(*sink);
  Tls(&spec)->set_ca_file(certs_->ca);
  ExpectFastTransportError(DeliverOne(spec));  // 127.0.0.1 is not sink.handoff.test
  Tls(&spec)->set_server_name_override("sink.handoff.test");
  EXPECT_EQ(Kinds(DeliverOne(spec)), std::vector<Kind>{Kind::kApplied});
}

TEST_F(TlsSinkTest, TheBearerTokenIsSentAndChecked) {
  std::unique_ptr<SampleSink> sink =
      StartSink({certs_->server_cert, certs_->server_key, "", kToken});
  ASSERT_NE(sink, nullptr);
  for (bool batch : {false, true}) {
    handoff::v1::SourceSpec spec = Spec(*sink, batch);
    Tls(&spec)->set_ca_file(certs_->ca);
    ExpectFastTransportError(DeliverOne(spec), "UNAUTHENTICATED");
    ExpectFastTransportError(DeliverOne(spec, kWrongToken), "UNAUTHENTICATED");
    EXPECT_EQ(Kinds(DeliverOne(spec, kToken)), std::vector<Kind>{Kind::kApplied}) << batch;
  }
  EXPECT_EQ(sink->Records()->size(), 2u);
}

// The files are read when the sink is made (a source's start): each problem is refused
// then, naming the source, the field and the path, never what the file holds.
TEST_F(TlsSinkTest, UnusableFilesAreRefusedByFieldAndPathNeverByContent) {
  const std::string garbage = TmpPath("garbage.pem");
  std::ofstream(garbage) << "not a certificate: Hunter2-garbage\n";
  const std::string directory = TmpPath("a-directory");
  mkdir(directory.c_str(), 0700);

  // `path` is the one the error names ("" for a pair that does not match).
  struct Case {
    std::string ca, cert, key, field, why, path;
  };
  const std::string missing = TmpPath("missing.pem");
  const std::string client_cert = certs_->client_cert, client_key = certs_->client_key;
  const std::vector<Case> cases = {
      {missing, "", "", "tls.ca_file", "cannot be read", missing},
      {directory, "", "", "tls.ca_file", "is not a regular file", directory},
      {"/dev/zero", "", "", "tls.ca_file", "is not a regular file", "/dev/zero"},
      {garbage, "", "", "tls.ca_file", "holds no PEM certificate", garbage},
      {client_key, "", "", "tls.ca_file", "holds no PEM certificate", client_key},
      {"", garbage, client_key, "tls.client_cert_file", "holds no PEM certificate", garbage},
      {"", client_cert, client_cert, "tls.client_key_file", "no PEM private key", client_cert},
      {"", client_cert, garbage, "tls.client_key_file", "no PEM private key", garbage},
      {"", client_cert, certs_->encrypted_key, "tls.client_key_file",
       "holds an encrypted private key", certs_->encrypted_key},
      {"", client_cert, certs_->stranger_key, "tls.client_key_file",
       "does not match the certificate", ""},
  };
  for (const Case& c : cases) {
    handoff::v1::SourceSpec spec;
    spec.set_id(kSource);
    spec.mutable_sink()->mutable_downstream()->set_target("127.0.0.1:1");
    auto* tls = Tls(&spec);
    tls->set_ca_file(c.ca);
    tls->set_client_cert_file(c.cert);
    tls->set_client_key_file(c.key);
    absl::StatusOr<std::unique_ptr<ExternalSink>> sink = MakeExternalSink(spec, kToken);
    const std::string error = sink.status().ToString();
    EXPECT_EQ(sink.status().code(), absl::StatusCode::kFailedPrecondition) << error;
    EXPECT_TRUE(absl::StartsWith(sink.status().message(), absl::StrCat("source ", kSource, ": ")))
        << error;
    EXPECT_TRUE(absl::StrContains(error, absl::StrCat("sink.downstream.", c.field))) << error;
    EXPECT_TRUE(absl::StrContains(error, c.why)) << error;
    EXPECT_TRUE(absl::StrContains(error, c.path)) << error;
    ExpectNoSecret(error);
  }
}

TEST_F(TlsSinkTest, ATokenIsNeverSentWithoutTls) {
  handoff::v1::SourceSpec spec;
  spec.set_id(kSource);
  spec.mutable_sink()->mutable_downstream()->set_target("127.0.0.1:1");
  absl::StatusOr<std::unique_ptr<ExternalSink>> sink = MakeExternalSink(spec, kToken);
  EXPECT_EQ(sink.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(sink.status().message(), "sink.downstream.token"))
      << sink.status();
  ExpectNoSecret(sink.status().ToString());
}

}  // namespace
}  // namespace handoff::consumer
