#include "sim/sample_sink/sample_sink.h"

#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "handoff/v1/event_sink.grpc.pb.h"
#include "sim/sample_sink/sample_sink_admin.grpc.pb.h"
#include "sim/sample_sink/sink_test_util.h"
#include "sim/sample_sink/test_certs.h"

namespace handoff::sim {
namespace {

using handoff::v1::ApplyRequest;

std::unique_ptr<SampleSink> StartSink(const std::string& name, v1::FaultConfig faults = {}) {
  SampleSink::Options options;
  options.core.db_path = TestDb(name);
  options.core.faults = faults;
  auto sink = SampleSink::Start(std::move(options));
  EXPECT_TRUE(sink.ok()) << sink.status();
  return sink.ok() ? *std::move(sink) : nullptr;
}

class Clients {
 public:
  explicit Clients(const SampleSink& sink)
      : channel_(grpc::CreateChannel(sink.target(), grpc::InsecureChannelCredentials())),
        sink_(handoff::v1::EventSink::NewStub(channel_)),
        admin_(v1::SampleSinkAdmin::NewStub(channel_)) {}

  grpc::Status Apply(const ApplyRequest& r, handoff::v1::ApplyResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return sink_->Apply(&ctx, r, out);
  }
  grpc::Status ApplyBatch(const handoff::v1::ApplyBatchRequest& r,
                          handoff::v1::ApplyBatchResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return sink_->ApplyBatch(&ctx, r, out);
  }
  v1::SampleSinkAdmin::Stub* admin() { return admin_.get(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<handoff::v1::EventSink::Stub> sink_;
  std::unique_ptr<v1::SampleSinkAdmin::Stub> admin_;
};

TEST(SampleSinkTest, ServesApplyAndApplyBatchOnAPickedPort) {
  auto sink = StartSink("serve");
  ASSERT_NE(sink, nullptr);
  EXPECT_GT(sink->port(), 0);
  Clients clients(*sink);
  handoff::v1::ApplyResponse one;
  ASSERT_TRUE(clients.Apply(Request(1, 0), &one).ok());
  EXPECT_EQ(one.outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);

  handoff::v1::ApplyBatchRequest batch;
  *batch.add_events() = Request(1, 0);
  *batch.add_events() = Request(1, 1);
  handoff::v1::ApplyBatchResponse many;
  ASSERT_TRUE(clients.ApplyBatch(batch, &many).ok());
  ASSERT_EQ(many.results_size(), 2);
  EXPECT_EQ(many.results(0).outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  EXPECT_EQ(many.results(1).outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
  EXPECT_EQ(sink->stats().calls(), 2u);
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
}

TEST(SampleSinkTest, AdminSetsFaultsAndReportsStatsAndRecords) {
  auto sink = StartSink("admin");
  ASSERT_NE(sink, nullptr);
  Clients clients(*sink);
  {
    v1::SetFaultsRequest request;
    request.mutable_faults()->set_fail_next_calls(1);
    request.mutable_faults()->set_fail_mode(v1::FAIL_MODE_UNAVAILABLE);
    v1::SetFaultsResponse response;
    grpc::ClientContext ctx;
    ASSERT_TRUE(clients.admin()->SetFaults(&ctx, request, &response).ok());
  }
  EXPECT_EQ(sink->faults().fail_next_calls(), 1u);
  handoff::v1::ApplyResponse out;
  EXPECT_EQ(clients.Apply(Request(4, 4), &out).error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(clients.Apply(Request(4, 4), &out).ok());
  ASSERT_TRUE(clients.Apply(Request(4, 4), &out).ok());
  EXPECT_EQ(out.outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  {
    v1::Stats stats;
    grpc::ClientContext ctx;
    ASSERT_TRUE(clients.admin()->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    EXPECT_EQ(stats.calls(), 3u);
    EXPECT_EQ(stats.failed_calls(), 1u);
    EXPECT_EQ(stats.applied(), 1u);
    EXPECT_EQ(stats.already_applied(), 1u);
    EXPECT_EQ(stats.records(), 1u);
  }
  {
    v1::ListRecordsResponse records;
    grpc::ClientContext ctx;
    ASSERT_TRUE(clients.admin()->ListRecords(&ctx, v1::ListRecordsRequest(), &records).ok());
    ASSERT_EQ(records.records_size(), 1);
    EXPECT_EQ(records.records(0).idempotency_key(), Request(4, 4).idempotency_key());
    EXPECT_EQ(records.records(0).attempts(), 2u);
  }
}

TEST(SampleSinkTest, RecordsSurviveARestartOnTheSameTable) {
  const std::string name = "restart";
  {
    auto sink = StartSink(name);
    ASSERT_NE(sink, nullptr);
    Clients clients(*sink);
    handoff::v1::ApplyResponse out;
    ASSERT_TRUE(clients.Apply(Request(2, 7), &out).ok());
  }
  auto sink = StartSink(name);
  ASSERT_NE(sink, nullptr);
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  Clients clients(*sink);
  handoff::v1::ApplyResponse out;
  ASSERT_TRUE(clients.Apply(Request(2, 7), &out).ok());
  EXPECT_EQ(out.outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
}

TEST(SampleSinkTest, StopFailsASlowCallAndIsIdempotent) {
  v1::FaultConfig faults;
  faults.set_delay_ms(60000);
  auto sink = StartSink("stop", faults);
  ASSERT_NE(sink, nullptr);
  Clients clients(*sink);
  grpc::Status status;
  std::thread caller([&] {
    handoff::v1::ApplyResponse out;
    status = clients.Apply(Request(1, 1), &out);
  });
  ASSERT_TRUE(sink->WaitForCalls(1, absl::Seconds(30)));
  sink->Stop();
  caller.join();
  EXPECT_FALSE(status.ok());
  sink->Stop();
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty());
}

TEST(SampleSinkTest, TlsOptionsComeInPairs) {
  absl::StatusOr<TestCerts> certs = MakeTestCerts(TestDb("certs-pairs"));
  ASSERT_TRUE(certs.ok()) << certs.status();
  SampleSink::Options half;
  half.core.db_path = TestDb("tls-half");
  half.tls_cert_chain = ReadTestFile(certs->server_cert);
  EXPECT_EQ(SampleSink::Start(half).status().code(), absl::StatusCode::kInvalidArgument);
  SampleSink::Options ca_only;
  ca_only.core.db_path = TestDb("tls-ca-only");
  ca_only.tls_client_ca = ReadTestFile(certs->client_ca);
  EXPECT_EQ(SampleSink::Start(ca_only).status().code(), absl::StatusCode::kInvalidArgument);
}

// Over TLS with a client CA (mTLS) and a bearer token: EventSink calls need the token,
// the admin service does not, and a refusal names no token.
TEST(SampleSinkTest, ServesMutualTlsAndChecksTheBearerToken) {
  absl::StatusOr<TestCerts> certs = MakeTestCerts(TestDb("certs-mtls"));
  ASSERT_TRUE(certs.ok()) << certs.status();
  SampleSink::Options options;
  options.core.db_path = TestDb("tls-token");
  options.tls_cert_chain = ReadTestFile(certs->server_cert);
  options.tls_private_key = ReadTestFile(certs->server_key);
  options.tls_client_ca = ReadTestFile(certs->client_ca);
  options.bearer_token = "sample-token-Hunter2";
  absl::StatusOr<std::unique_ptr<SampleSink>> sink = SampleSink::Start(std::move(options));
  ASSERT_TRUE(sink.ok()) << sink.status();

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadTestFile(certs->ca);
  ssl.pem_cert_chain = ReadTestFile(certs->client_cert);
  ssl.pem_private_key = ReadTestFile(certs->client_key);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel((*sink)->target(), grpc::SslCredentials(ssl));
  auto stub = handoff::v1::EventSink::NewStub(channel);
  auto apply = [&](const std::string& authorization, uint64_t block) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    handoff::v1::ApplyResponse response;
    return stub->Apply(&ctx, Request(block, 0), &response);
  };
  for (const std::string bad : {"", "Bearer sample-token-Hunter3", "sample-token-Hunter2",
                                "Bearer sample-token-Hunter2x"}) {
    grpc::Status s = apply(bad, 1);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << bad;
    EXPECT_EQ(s.error_message().find("Hunter"), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(apply("Bearer sample-token-Hunter2", 2).ok());

  auto admin = v1::SampleSinkAdmin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListRecordsResponse records;
  ASSERT_TRUE(admin->ListRecords(&ctx, v1::ListRecordsRequest(), &records).ok());
  ASSERT_EQ(records.records_size(), 1);
  EXPECT_EQ(records.records(0).block_number(), 2u);
}

}  // namespace
}  // namespace handoff::sim
