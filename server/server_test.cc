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
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/thread_name.h"
#include "base/thread_priority.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "handoff/v1/consumer_admin.grpc.pb.h"
#include "server/admin_call_scheduling.h"
#include "store/store.h"
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

// Records the sources deleted.
class DeletionLog final : public consumer::EngineObserver {
 public:
  void OnSourceDeleted(absl::string_view id) override { deleted.emplace_back(id); }
  std::vector<std::string> deleted;
};

// handoffd's observer (metrics and logs) passes a deletion on to each of its observers.
TEST(FanOutObserverTest, ForwardsADeletionToEveryObserver) {
  DeletionLog a, b;
  FanOutObserver fan_out({&a, &b});
  fan_out.OnSourceDeleted("gone");
  EXPECT_EQ(a.deleted, std::vector<std::string>{"gone"});
  EXPECT_EQ(b.deleted, std::vector<std::string>{"gone"});
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

// The FakeSourceManager with one worker ("stuck") that never reaches a safe point until
// the test releases it: Shutdown joins it without end, as a worker whose provider or sink
// call ignores its cancellation; ShutdownBy gives up on it at its deadline and names it.
class StuckWorkerManager final : public consumer::SourceManager {
 public:
  StuckWorkerManager(absl::Notification* release, absl::Mutex* mu, absl::Time* deadline_seen)
      : release_(release), mu_(mu), deadline_seen_(deadline_seen) {}
  absl::Status Recover() override { return f_.Recover(); }
  void Shutdown() override {
    f_.Shutdown();
    release_->WaitForNotification();
  }
  std::vector<std::string> ShutdownBy(absl::Time deadline) override {
    {
      absl::MutexLock lock(mu_);
      *deadline_seen_ = deadline;
    }
    f_.Shutdown();
    if (release_->WaitForNotificationWithDeadline(deadline)) return {};
    return {"stuck"};
  }
  absl::StatusOr<handoff::v1::Source> CreateSource(
      const handoff::v1::CreateSourceRequest& r) override {
    return f_.CreateSource(r);
  }
  absl::StatusOr<handoff::v1::Source> StartSource(absl::string_view id) override {
    return f_.StartSource(id);
  }
  absl::StatusOr<handoff::v1::Source> StopSource(absl::string_view id) override {
    return f_.StopSource(id);
  }
  absl::Status DeleteSource(absl::string_view id) override { return f_.DeleteSource(id); }
  absl::StatusOr<handoff::v1::Source> GetSource(absl::string_view id) override {
    return f_.GetSource(id);
  }
  absl::StatusOr<handoff::v1::ListSourcesResponse> ListSources(
      const handoff::v1::ListSourcesRequest& r) override {
    return f_.ListSources(r);
  }
  absl::StatusOr<handoff::v1::Progress> GetProgress(absl::string_view id) override {
    return f_.GetProgress(id);
  }
  absl::StatusOr<handoff::v1::Progress> WaitProgress(absl::string_view id, uint64_t* generation,
                                                     absl::Time deadline) override {
    return f_.WaitProgress(id, generation, deadline);
  }
  absl::StatusOr<handoff::v1::ListHoldsResponse> ListHolds(
      const handoff::v1::ListHoldsRequest& r) override {
    return f_.ListHolds(r);
  }
  absl::StatusOr<handoff::v1::Hold> GetHold(const handoff::v1::GetHoldRequest& r) override {
    return f_.GetHold(r);
  }
  absl::StatusOr<handoff::v1::ResolveHoldResponse> ResolveHold(
      const handoff::v1::ResolveHoldRequest& r, absl::string_view actor) override {
    return f_.ResolveHold(r, actor);
  }
  absl::StatusOr<handoff::v1::ListQuarantineResponse> ListQuarantine(
      const handoff::v1::ListQuarantineRequest& r) override {
    return f_.ListQuarantine(r);
  }
  absl::StatusOr<handoff::v1::Source> RebuildSource(
      const handoff::v1::RebuildSourceRequest& r) override {
    return f_.RebuildSource(r);
  }
  absl::StatusOr<handoff::v1::QueryEventsResponse> QueryEvents(
      const handoff::v1::QueryEventsRequest& r) override {
    return f_.QueryEvents(r);
  }
  std::vector<handoff::v1::Progress> AllProgress() override { return f_.AllProgress(); }

 private:
  testing::FakeSourceManager f_;
  absl::Notification* const release_;
  absl::Mutex* const mu_;
  absl::Time* const deadline_seen_;
};

// --shutdown_grace is an upper bound: a worker that does not stop in time is abandoned
// (logged by name) and shutdown ends within the grace, instead of running into the
// kubelet's SIGKILL. The store is not closed under the abandoned worker: it stays open
// (handoffd then exits the process without destroying it; destroying the Server waits for
// the worker to end).
TEST(ServerTest, ShutdownEndsWithinTheGraceAbandoningAWorkerThatDoesNotStop) {
  ServerOptions options = TestOptions("stuck");
  options.shutdown_grace = absl::Seconds(2);
  absl::Mutex mu;
  std::vector<std::string> lines;
  absl::Time deadline_seen = absl::InfiniteFuture();
  options.log_writer = [&](absl::string_view line) {
    absl::MutexLock lock(&mu);
    lines.emplace_back(line);
  };
  absl::Notification release;
  options.source_manager_factory = [&](consumer::SourceManagerOptions)
      -> absl::StatusOr<std::unique_ptr<consumer::SourceManager>> {
    return std::make_unique<StuckWorkerManager>(&release, &mu, &deadline_seen);
  };
  auto server = Server::BuildAndStart(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time start = absl::Now();
  absl::Notification returned;
  std::thread shutdown([&] {
    (*server)->Shutdown();
    returned.Notify();
  });
  // Generous margin: the bound under test is the grace; without it this never returns.
  const bool in_time =
      returned.WaitForNotificationWithTimeout(options.shutdown_grace + absl::Seconds(20));
  release.Notify();
  shutdown.join();
  EXPECT_TRUE(in_time) << "shutdown ran past --shutdown_grace joining a stuck worker";
  {
    absl::MutexLock lock(&mu);
    EXPECT_LE(deadline_seen, start + options.shutdown_grace);
    bool logged = false;
    for (const std::string& line : lines) {
      if (line.find("abandoned") != std::string::npos &&
          line.find("stuck") != std::string::npos) {
        logged = true;
      }
    }
    EXPECT_TRUE(logged) << absl::StrJoin(lines, "\n");
  }
  EXPECT_EQ((*server)->abandoned_sources(), std::vector<std::string>{"stuck"});
  // The store stays open under the abandoned worker: its database is still locked.
  store::StoreOptions so;
  so.path = options.data_dir + "/db";
  EXPECT_FALSE(store::Store::Open(so).ok()) << "the store was closed under a running worker";
  server->reset();  // the manager (its worker released above), then the store
  EXPECT_TRUE(store::Store::Open(so).ok());
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
