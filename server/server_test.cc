#include "server/server.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/thread_name.h"
#include "base/thread_priority.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "handoff/v1/consumer_admin.grpc.pb.h"
#include "server/admin_call_scheduling.h"
#include "tests/testing/fake_source_manager.h"

namespace handoff::server {
namespace {

std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  return absl::StrCat(root == nullptr ? "/tmp" : root, "/", name);
}

ServerOptions TestOptions(const std::string& name) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = TempDir(name);
  options.insecure_disable_auth = true;
  options.log_level = LogLevel::kWarning;
  // Long: a watcher notices shutdown within watch_recheck of being scheduled, which a
  // loaded machine can delay past a short grace's quarter (the call is then CANCELLED).
  options.shutdown_grace = absl::Seconds(60);
  options.source_manager_factory = [](consumer::SourceManagerOptions)
      -> absl::StatusOr<std::unique_ptr<consumer::SourceManager>> {
    return std::make_unique<testing::FakeSourceManager>();
  };
  return options;
}

grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, const std::string& name,
                         grpc::health::v1::HealthCheckResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(name);
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC, channel);
  return grpc::internal::BlockingUnaryCall(channel.get(), method, &context, request, response);
}

TEST(ServerTest, ServesAdminHealthAndMetricsThenShutsDownAndReleasesTheStore) {
  ServerOptions options = TestOptions("serve");
  options.port_file = TempDir("serve.port");
  options.metrics_listen = "127.0.0.1:0";
  options.health_listen = "127.0.0.1:0";
  auto server = Server::BuildAndStart(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  ASSERT_GT((*server)->metrics_port(), 0);

  std::ifstream port_file(options.port_file);
  std::string grpc_key, metrics_key, health_key;
  int port = 0, metrics_port = 0, health_port = 0;
  port_file >> grpc_key >> port >> metrics_key >> metrics_port >> health_key >> health_port;
  EXPECT_EQ(grpc_key, "grpc");
  EXPECT_EQ(metrics_key, "metrics");
  EXPECT_EQ(health_key, "health");
  EXPECT_EQ(port, (*server)->port());
  EXPECT_EQ(metrics_port, (*server)->metrics_port());

  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  grpc::health::v1::HealthCheckResponse health;
  ASSERT_TRUE(HealthCheck(channel, "", &health).ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_TRUE(HealthCheck(channel, "handoff.v1.ConsumerAdmin", &health).ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  // The plaintext probe port answers health too.
  auto probe_channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", health_port),
                                           grpc::InsecureChannelCredentials());
  ASSERT_TRUE(HealthCheck(probe_channel, "", &health).ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto stub = handoff::v1::ConsumerAdmin::NewStub(channel);
  {
    grpc::ClientContext context;
    handoff::v1::CreateSourceRequest request;
    request.mutable_spec()->set_id("src");
    request.mutable_spec()->set_provider_url("http://127.0.0.1:1");
    handoff::v1::Source source;
    ASSERT_TRUE(stub->CreateSource(&context, request, &source).ok());
  }

  // A watcher is open when shutdown starts: it must end with OK, not hold shutdown up.
  grpc::ClientContext watch_context;
  handoff::v1::WatchProgressRequest watch;
  watch.set_source_id("src");
  auto reader = stub->WatchProgress(&watch_context, watch);
  handoff::v1::Progress progress;
  ASSERT_TRUE(reader->Read(&progress));

  std::thread waiter([&] { (*server)->WaitForTermination(); });
  (*server)->RequestShutdown();
  while (reader->Read(&progress)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  waiter.join();
  server->reset();

  // The database was closed: the same data_dir opens again.
  auto again = Server::BuildAndStart(options);
  ASSERT_TRUE(again.ok()) << again.status();
}

// Every gRPC thread that waits for network events may read an admin request
// (admin_call_scheduling.h): once started, the server has them all real-time, the
// health port's included. Fails if this gRPC stops starting callback threads (or renames
// its threads): the admin tail's fix would then find nothing to raise.
TEST(ServerTest, GrpcPollerThreadsWaitRealtime) {
  if (!CheckRealtimeSchedulingAllowed(1).ok()) GTEST_SKIP() << "no SCHED_RR here";
  ServerOptions options = TestOptions("poller_threads");
  options.admin_realtime_priority = 1;
  options.health_listen = "127.0.0.1:0";
  auto server = Server::BuildAndStart(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<pid_t> callback_threads =
      ThreadsNamed(AdminCallScheduling::kGrpcCallbackThreadName);
  const std::vector<pid_t> sync_threads =
      ThreadsNamed(AdminCallScheduling::kGrpcSyncServerThreadName);
  EXPECT_FALSE(callback_threads.empty());
  EXPECT_GE(sync_threads.size(), 2u);  // one pool per server
  for (pid_t tid : callback_threads) EXPECT_TRUE(ThreadIsRealtimeScheduled(tid)) << tid;
  for (pid_t tid : sync_threads) EXPECT_TRUE(ThreadIsRealtimeScheduled(tid)) << tid;
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());  // the thread that started it is not
}

TEST(ServerTest, RequiresAnExplicitAuthChoice) {
  ServerOptions options = TestOptions("auth-choice");
  options.insecure_disable_auth = false;
  auto server = Server::BuildAndStart(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("auth_tokens_file"), absl::string_view::npos);

  options.auth_tokens_file = TempDir("tokens");
  options.insecure_disable_auth = true;
  EXPECT_EQ(Server::BuildAndStart(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerTest, RefusesHalfTlsAndUnreadableFiles) {
  ServerOptions options = TestOptions("tls");
  options.tls_cert = TempDir("missing.pem");
  auto half = Server::BuildAndStart(options);
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(half.status().message().find("tls_key"), absl::string_view::npos);

  options.tls_key = TempDir("missing.key");
  auto unreadable = Server::BuildAndStart(options);
  EXPECT_EQ(unreadable.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unreadable.status().message().find("tls_cert"), absl::string_view::npos);
}

TEST(ServerTest, BadSourcesConfigFailsStartAndReleasesTheStore) {
  ServerOptions options = TestOptions("bad-config");
  options.sources_config = TempDir("bad.textproto");
  {
    std::ofstream out(options.sources_config);
    out << "sources { spec { id: \"Bad!\" provider_url: \"http://x\" } }\n";
  }
  auto server = Server::BuildAndStart(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("sources[0]"), absl::string_view::npos)
      << server.status();
  options.sources_config.clear();
  EXPECT_TRUE(Server::BuildAndStart(options).ok());
}

TEST(ServerTest, ListenFailureIsUnavailable) {
  auto first = Server::BuildAndStart(TestOptions("listen-a"));
  ASSERT_TRUE(first.ok());
  ServerOptions options = TestOptions("listen-b");
  options.listen = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = Server::BuildAndStart(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace handoff::server
