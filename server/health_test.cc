#include "server/health.h"

#include <grpcpp/health_check_service_interface.h>

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_source_manager.h"

namespace handoff::server {
namespace {

// Records the statuses the reporter sets.
class RecordingHealth final : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string& name, bool serving) override {
    absl::MutexLock lock(&mu_);
    ++sets_[name];
    if (!shut_down_) status_[name] = serving;
  }
  void SetServingStatus(bool serving) override {
    absl::MutexLock lock(&mu_);
    for (auto& [name, value] : status_) value = serving;
  }
  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    for (auto& [name, value] : status_) value = false;
    shut_down_ = true;
  }
  std::map<std::string, bool> status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // How many times the status of `name` was set.
  int sets(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return sets_[name];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, bool> status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> sets_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(SourceServingTest, OnlyAdvancingOrNormallyWaitingStatesServe) {
  using namespace handoff::v1;  // NOLINT
  for (SourceState s : {SOURCE_STATE_STARTING, SOURCE_STATE_RUNNING, SOURCE_STATE_BACKING_OFF}) {
    EXPECT_TRUE(SourceServing(s)) << SourceState_Name(s);
  }
  for (SourceState s :
       {SOURCE_STATE_UNSPECIFIED, SOURCE_STATE_STOPPED, SOURCE_STATE_BLOCKED_ON_HOLD,
        SOURCE_STATE_RESYNC_REQUIRED, SOURCE_STATE_FUNDING_REQUIRED, SOURCE_STATE_AUTH_FAILED,
        SOURCE_STATE_CONFIG_INVALID, SOURCE_STATE_PROTOCOL_VIOLATION,
        SOURCE_STATE_STORAGE_FAILED, SOURCE_STATE_STOPPING}) {
    EXPECT_FALSE(SourceServing(s)) << SourceState_Name(s);
  }
}

class HealthReporterTest : public ::testing::Test {
 protected:
  void Create(const std::string& id, handoff::v1::SourceState state) {
    handoff::v1::CreateSourceRequest request;
    request.mutable_spec()->set_id(id);
    request.mutable_spec()->set_provider_url("http://x");
    ASSERT_TRUE(manager_.CreateSource(request).ok());
    handoff::v1::Progress progress;
    progress.set_source_id(id);
    progress.set_state(state);
    ASSERT_TRUE(manager_.SetProgress(progress).ok());
  }

  absl::Status StoreHealth() {
    absl::MutexLock lock(&mu_);
    return store_status_;
  }

  std::vector<std::string> lines_;
  Logger logger_{LogLevel::kInfo, [this](absl::string_view l) { lines_.emplace_back(l); }};
  RecordingHealth health_;
  testing::FakeSourceManager manager_;
  absl::Mutex mu_;
  absl::Status store_status_ ABSL_GUARDED_BY(mu_);
  HealthReporter reporter_{{&health_}, &manager_, [this] { return StoreHealth(); }, &logger_,
                           absl::Hours(1)};
};

TEST_F(HealthReporterTest, PerSourceStatusFollowsState) {
  Create("running", handoff::v1::SOURCE_STATE_RUNNING);
  Create("held", handoff::v1::SOURCE_STATE_BLOCKED_ON_HOLD);
  Create("halted", handoff::v1::SOURCE_STATE_AUTH_FAILED);
  reporter_.Refresh();
  auto status = health_.status();
  EXPECT_TRUE(status[""]);
  EXPECT_TRUE(status[kAdminServiceName]);
  EXPECT_TRUE(status["running"]);
  EXPECT_FALSE(status["held"]);
  EXPECT_FALSE(status["halted"]);
}

TEST_F(HealthReporterTest, UnusableStoreMakesEverythingNotServing) {
  Create("running", handoff::v1::SOURCE_STATE_RUNNING);
  {
    absl::MutexLock lock(&mu_);
    store_status_ = absl::UnavailableError("sync failed");
  }
  reporter_.Refresh();
  auto status = health_.status();
  EXPECT_FALSE(status[""]);
  EXPECT_FALSE(status[kAdminServiceName]);
  EXPECT_FALSE(status["running"]);
  ASSERT_FALSE(lines_.empty());
  EXPECT_NE(lines_.back().find("sync failed"), std::string::npos);
  // The running sources are told to halt, each pass while the store stays failed.
  ASSERT_EQ(manager_.store_failures().size(), 1u);
  EXPECT_EQ(manager_.store_failures()[0], absl::UnavailableError("sync failed"));
  reporter_.Refresh();
  EXPECT_EQ(manager_.store_failures().size(), 2u);

  {
    absl::MutexLock lock(&mu_);
    store_status_ = absl::OkStatus();
  }
  reporter_.Refresh();
  EXPECT_TRUE(health_.status()[""]);
  EXPECT_EQ(manager_.store_failures().size(), 2u) << "a healthy store halts nothing";
}

// A deleted source's name is set NOT_SERVING once, then forgotten by the reporter: no
// pass re-asserts a ghost (gRPC's health service keeps the name as NOT_SERVING until
// restart; it cannot forget one). A source re-created under the id reports its own state.
TEST_F(HealthReporterTest, DeletedSourceIsMarkedOnceThenForgottenAndMayComeBack) {
  // "gone", serving, is deleted: its name turns NOT_SERVING at the next pass.
  auto delete_gone = [this] {
    reporter_.Refresh();
    EXPECT_TRUE(health_.status()["gone"]);
    ASSERT_TRUE(manager_.StopSource("gone").ok());
    ASSERT_TRUE(manager_.DeleteSource("gone").ok());
    reporter_.Refresh();
    EXPECT_FALSE(health_.status()["gone"]);
  };
  Create("gone", handoff::v1::SOURCE_STATE_RUNNING);
  Create("kept", handoff::v1::SOURCE_STATE_RUNNING);
  delete_gone();
  const int sets = health_.sets("gone");
  reporter_.Refresh();
  reporter_.Refresh();
  EXPECT_EQ(health_.sets("gone"), sets) << "a deleted source is re-reported on every pass";
  EXPECT_EQ(health_.sets("kept"), 4);

  Create("gone", handoff::v1::SOURCE_STATE_STARTING);
  delete_gone();
}

TEST_F(HealthReporterTest, StopFreezesNotServingAndIsSafeWithoutStart) {
  Create("running", handoff::v1::SOURCE_STATE_RUNNING);
  reporter_.Start();
  EXPECT_TRUE(health_.status()[""]);
  reporter_.Stop();
  reporter_.Stop();
  EXPECT_FALSE(health_.status()[""]);
  EXPECT_FALSE(health_.status()["running"]);
}

}  // namespace
}  // namespace handoff::server
