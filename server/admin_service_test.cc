#include "server/admin_service.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_source_manager.h"

namespace handoff::server {
namespace {

using handoff::v1::ConsumerAdmin;

constexpr char kOperatorToken[] = "operator-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";

class AdminServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(AdminServiceOptions()); }

  void StartServer(AdminServiceOptions options) {
    auto auth = Authenticator::FromContent(
        absl::StrCat("alice operator ", kOperatorToken, "\nbob reader ", kReaderToken, "\n"));
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    options.watch_recheck = absl::Milliseconds(20);
    service_ = std::make_unique<AdminService>(&manager_, auth_.get(), options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = ConsumerAdmin::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                       grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (service_ != nullptr) service_->BeginShutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  static std::unique_ptr<grpc::ClientContext> As(const char* token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (token != nullptr) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  grpc::Status Create(const char* token, const std::string& id, handoff::v1::Source* out) {
    handoff::v1::CreateSourceRequest request;
    request.mutable_spec()->set_id(id);
    request.mutable_spec()->set_provider_url("http://127.0.0.1:1");
    return stub_->CreateSource(As(token).get(), request, out);
  }

  testing::FakeSourceManager manager_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AdminService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ConsumerAdmin::Stub> stub_;
};

TEST_F(AdminServiceTest, OperatorCreatesAndReaderGets) {
  handoff::v1::Source created;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &created).ok());
  EXPECT_EQ(created.spec().id(), "src-1");

  handoff::v1::GetSourceRequest get;
  get.set_source_id("src-1");
  handoff::v1::Source got;
  ASSERT_TRUE(stub_->GetSource(As(kReaderToken).get(), get, &got).ok());
  EXPECT_EQ(got.spec().provider_url(), "http://127.0.0.1:1");

  handoff::v1::ListSourcesResponse list;
  ASSERT_TRUE(
      stub_->ListSources(As(kReaderToken).get(), handoff::v1::ListSourcesRequest(), &list).ok());
  ASSERT_EQ(list.sources_size(), 1);
}

TEST_F(AdminServiceTest, MissingOrUnknownTokenIsUnauthenticated) {
  handoff::v1::Source out;
  EXPECT_EQ(Create(nullptr, "src-1", &out).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Create("not-a-known-token-at-all", "src-1", &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  handoff::v1::GetSourceRequest get;
  get.set_source_id("src-1");
  EXPECT_EQ(stub_->GetSource(As(nullptr).get(), get, &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AdminServiceTest, ReaderMayNotOperate) {
  handoff::v1::Source out;
  const grpc::Status denied = Create(kReaderToken, "src-1", &out);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message().find(kReaderToken), std::string::npos);

  handoff::v1::StartSourceRequest start;
  start.set_source_id("src-1");
  EXPECT_EQ(stub_->StartSource(As(kReaderToken).get(), start, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  handoff::v1::StopSourceRequest stop;
  EXPECT_EQ(stub_->StopSource(As(kReaderToken).get(), stop, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  handoff::v1::DeleteSourceResponse deleted;
  EXPECT_EQ(stub_->DeleteSource(As(kReaderToken).get(), handoff::v1::DeleteSourceRequest(),
                                &deleted)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(stub_->RebuildSource(As(kReaderToken).get(), handoff::v1::RebuildSourceRequest(),
                                 &out)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  handoff::v1::ResolveHoldResponse resolved;
  EXPECT_EQ(stub_->ResolveHold(As(kReaderToken).get(), handoff::v1::ResolveHoldRequest(),
                               &resolved)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Reads are allowed (the fake answers them).
  handoff::v1::ListHoldsResponse holds;
  EXPECT_TRUE(
      stub_->ListHolds(As(kReaderToken).get(), handoff::v1::ListHoldsRequest(), &holds).ok());
  handoff::v1::ListQuarantineResponse quarantine;
  EXPECT_TRUE(stub_->ListQuarantine(As(kReaderToken).get(), handoff::v1::ListQuarantineRequest(),
                                    &quarantine)
                  .ok());
}

TEST_F(AdminServiceTest, CoreErrorsKeepTheirCodeAndFieldName) {
  handoff::v1::Source out;
  const grpc::Status bad = Create(kOperatorToken, "Bad_Id", &out);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("spec.id"), std::string::npos);

  handoff::v1::GetSourceRequest get;
  get.set_source_id("missing");
  EXPECT_EQ(stub_->GetSource(As(kReaderToken).get(), get, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(AdminServiceTest, ResolveHoldActorIsTheTokenName) {
  handoff::v1::ResolveHoldRequest request;
  request.set_source_id("src-1");
  request.set_decision(handoff::v1::HOLD_DECISION_QUARANTINE);
  request.set_reason("bad payload");
  request.set_hold_version(3);
  handoff::v1::ResolveHoldResponse response;
  ASSERT_TRUE(stub_->ResolveHold(As(kOperatorToken).get(), request, &response).ok());
  EXPECT_EQ(manager_.last_actor(), "alice");
  EXPECT_EQ(response.record().actor(), "alice");
}

TEST_F(AdminServiceTest, FundingActionOnlyForOperators) {
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::Progress progress;
  progress.set_source_id("src-1");
  progress.set_state(handoff::v1::SOURCE_STATE_FUNDING_REQUIRED);
  progress.set_funding_action("{\"next_action\":\"top_up\"}");
  ASSERT_TRUE(manager_.SetProgress(progress).ok());

  handoff::v1::GetProgressRequest get;
  get.set_source_id("src-1");
  handoff::v1::Progress as_reader, as_operator;
  ASSERT_TRUE(stub_->GetProgress(As(kReaderToken).get(), get, &as_reader).ok());
  ASSERT_TRUE(stub_->GetProgress(As(kOperatorToken).get(), get, &as_operator).ok());
  EXPECT_EQ(as_reader.state(), handoff::v1::SOURCE_STATE_FUNDING_REQUIRED);
  EXPECT_EQ(as_reader.funding_action(), "");
  EXPECT_EQ(as_operator.funding_action(), "{\"next_action\":\"top_up\"}");

  handoff::v1::GetSourceRequest get_source;
  get_source.set_source_id("src-1");
  ASSERT_TRUE(stub_->GetSource(As(kReaderToken).get(), get_source, &out).ok());
  EXPECT_EQ(out.progress().funding_action(), "");
  handoff::v1::ListSourcesResponse list;
  ASSERT_TRUE(
      stub_->ListSources(As(kReaderToken).get(), handoff::v1::ListSourcesRequest(), &list).ok());
  EXPECT_EQ(list.sources(0).progress().funding_action(), "");
}

TEST_F(AdminServiceTest, WatchSendsSnapshotThenChangesThenEndsOnCancel) {
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("src-1");
  request.set_heartbeat_ms(60000);
  auto context = As(kReaderToken);
  auto reader = stub_->WatchProgress(context.get(), request);
  handoff::v1::Progress progress;
  ASSERT_TRUE(reader->Read(&progress));
  EXPECT_EQ(progress.state(), handoff::v1::SOURCE_STATE_STOPPED);

  progress.set_state(handoff::v1::SOURCE_STATE_RUNNING);
  progress.mutable_counters()->set_applied(7);
  ASSERT_TRUE(manager_.SetProgress(progress).ok());
  ASSERT_TRUE(reader->Read(&progress));
  EXPECT_EQ(progress.state(), handoff::v1::SOURCE_STATE_RUNNING);
  EXPECT_EQ(progress.counters().applied(), 7u);

  context->TryCancel();
  while (reader->Read(&progress)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Shutdown without a deadline returns only once the handler left its loop.
  server_->Shutdown();
  EXPECT_EQ(service_->active_watchers(), 0);
}

TEST_F(AdminServiceTest, WatchSendsHeartbeatsWithoutChange) {
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("src-1");
  request.set_heartbeat_ms(100);
  auto context = As(kReaderToken);
  auto reader = stub_->WatchProgress(context.get(), request);
  handoff::v1::Progress progress;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&progress)) << i;
  EXPECT_EQ(progress.source_id(), "src-1");
  context->TryCancel();
}

TEST_F(AdminServiceTest, WatchEndsOkWhenServerStops) {
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("src-1");
  auto context = As(kReaderToken);
  auto reader = stub_->WatchProgress(context.get(), request);
  handoff::v1::Progress progress;
  ASSERT_TRUE(reader->Read(&progress));
  service_->BeginShutdown();
  EXPECT_FALSE(reader->Read(&progress));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(AdminServiceTest, WatchEndsOkWhenManagerShutsDown) {
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("src-1");
  auto context = As(kReaderToken);
  auto reader = stub_->WatchProgress(context.get(), request);
  handoff::v1::Progress progress;
  ASSERT_TRUE(reader->Read(&progress));
  manager_.Shutdown();
  EXPECT_FALSE(reader->Read(&progress));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(AdminServiceTest, WatchOfUnknownSourceIsNotFound) {
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("missing");
  auto context = As(kReaderToken);
  auto reader = stub_->WatchProgress(context.get(), request);
  handoff::v1::Progress progress;
  EXPECT_FALSE(reader->Read(&progress));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AdminServiceTest, TooManyWatchersIsResourceExhausted) {
  TearDown();
  AdminServiceOptions options;
  options.max_watchers = 1;
  StartServer(options);
  handoff::v1::Source out;
  ASSERT_TRUE(Create(kOperatorToken, "src-1", &out).ok());
  handoff::v1::WatchProgressRequest request;
  request.set_source_id("src-1");
  request.set_heartbeat_ms(60000);
  auto first_context = As(kReaderToken);
  auto first = stub_->WatchProgress(first_context.get(), request);
  handoff::v1::Progress progress;
  ASSERT_TRUE(first->Read(&progress));  // the first stream holds its slot now

  auto second_context = As(kReaderToken);
  auto second = stub_->WatchProgress(second_context.get(), request);
  EXPECT_FALSE(second->Read(&progress));
  const grpc::Status refused = second->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("max_watchers"), std::string::npos);
  first_context->TryCancel();
}

}  // namespace
}  // namespace handoff::server
