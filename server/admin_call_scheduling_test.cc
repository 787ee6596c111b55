#include "server/admin_call_scheduling.h"

#include <linux/capability.h>
#include <sys/resource.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "base/capabilities_for_testing.h"
#include "base/thread_name.h"
#include "base/thread_priority.h"
#include "gtest/gtest.h"

namespace handoff::server {
namespace {

// Runs `fn` on a new thread, as gRPC runs a handler on a thread of its pool.
template <typename Fn>
void OnNewThread(Fn fn) {
  std::thread t(fn);
  t.join();
}

TEST(AdminCallSchedulingTest, DisabledLeavesEveryThreadNormal) {
  for (const AdminCallScheduling& scheduling :
       {AdminCallScheduling(), AdminCallScheduling::Create(0)}) {
    EXPECT_FALSE(scheduling.enabled());
    EXPECT_TRUE(scheduling.status().ok());
    EXPECT_EQ(scheduling.Describe(), "normal");
    bool realtime = true;
    OnNewThread([&] {
      { const AdminCallScheduling::Scope s = scheduling.PointRead(); }
      { const AdminCallScheduling::Scope s = scheduling.OtherCall(); }
      realtime = CurrentThreadIsRealtimeScheduled();
    });
    EXPECT_FALSE(realtime);
  }
}

TEST(AdminCallSchedulingTest, PointReadsRunRealtimeOtherCallsNormalThenWaitRealtime) {
  const AdminCallScheduling scheduling = AdminCallScheduling::Create(1);
  if (!scheduling.enabled()) GTEST_SKIP() << "no SCHED_RR here: " << scheduling.status();
  EXPECT_EQ(scheduling.Describe(), "SCHED_RR 1");
  bool in_point_read = false, after_point_read = false, in_other_call = true,
       started_by_other_call = true, started_by_point_read = true, after_other_call = false;
  OnNewThread([&] {
    {
      const AdminCallScheduling::Scope s = scheduling.PointRead();
      in_point_read = CurrentThreadIsRealtimeScheduled();
      std::thread c([&] { started_by_point_read = CurrentThreadIsRealtimeScheduled(); });
      c.join();
    }
    after_point_read = CurrentThreadIsRealtimeScheduled();  // waits for the next call RR
    {
      const AdminCallScheduling::Scope s = scheduling.OtherCall();
      in_other_call = CurrentThreadIsRealtimeScheduled();
      // A worker a StartSource starts must never run real-time.
      std::thread c([&] { started_by_other_call = CurrentThreadIsRealtimeScheduled(); });
      c.join();
    }
    after_other_call = CurrentThreadIsRealtimeScheduled();
  });
  EXPECT_TRUE(in_point_read);
  EXPECT_TRUE(after_point_read);
  EXPECT_FALSE(started_by_point_read);
  EXPECT_FALSE(in_other_call);
  EXPECT_FALSE(started_by_other_call);
  EXPECT_TRUE(after_other_call);
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());  // only the serving thread changed
}

TEST(AdminCallSchedulingTest, AThreadThatOnlyServedOtherCallsWaitsRealtimeAfterwards) {
  const AdminCallScheduling scheduling = AdminCallScheduling::Create(1);
  if (!scheduling.enabled()) GTEST_SKIP() << "no SCHED_RR here: " << scheduling.status();
  bool in_call = true, after = false;
  OnNewThread([&] {
    {
      AdminCallScheduling::Scope s = scheduling.OtherCall();
      AdminCallScheduling::Scope moved = std::move(s);  // restores once, from `moved`
      in_call = CurrentThreadIsRealtimeScheduled();
    }
    after = CurrentThreadIsRealtimeScheduled();
  });
  EXPECT_FALSE(in_call);
  EXPECT_TRUE(after);
}

// Stands in for gRPC's polling threads: threads that take the given names once Name() is
// called (as gRPC's name themselves once they run), then wait until the test ends.
class FakeGrpcThreads {
 public:
  explicit FakeGrpcThreads(std::vector<std::string> names)
      : named_(static_cast<int>(names.size())), ids_(names.size()) {
    for (size_t i = 0; i < names.size(); ++i) {
      threads_.emplace_back([this, id = &ids_[i], name = names[i]] {
        *id = CurrentThreadId();
        name_.WaitForNotification();
        EXPECT_TRUE(NameCurrentThread(name).ok());
        named_.DecrementCount();
        done_.WaitForNotification();
      });
    }
  }
  ~FakeGrpcThreads() {
    if (!name_.HasBeenNotified()) name_.Notify();
    done_.Notify();
    for (std::thread& t : threads_) t.join();
  }
  void Name() { name_.Notify(); }
  // Their ids, once they have named themselves.
  const std::vector<pid_t>& ids() {
    named_.Wait();
    return ids_;
  }

 private:
  absl::Notification name_, done_;
  absl::BlockingCounter named_;
  std::vector<pid_t> ids_;
  std::vector<std::thread> threads_;
};

TEST(AdminCallSchedulingTest, RaisesGrpcPollersOnceTheyAreNamed) {
  const AdminCallScheduling scheduling = AdminCallScheduling::Create(1);
  if (!scheduling.enabled()) GTEST_SKIP() << "no SCHED_RR here: " << scheduling.status();
  const std::vector<ThreadInfo> before = ListThreads();
  FakeGrpcThreads grpc({AdminCallScheduling::kGrpcCallbackThreadName,
                        AdminCallScheduling::kGrpcCallbackThreadName,
                        AdminCallScheduling::kGrpcSyncServerThreadName, "grpc_global_tim"});
  // Started, they carry this thread's name (the raise thread's too) until they name
  // themselves, which they do while the raise waits, as gRPC's do once they run.
  absl::StatusOr<int> moved;
  std::thread raise(
      [&] { moved = scheduling.RaiseGrpcPollerThreads(before, absl::Seconds(60)); });
  grpc.Name();
  raise.join();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 3);
  const std::vector<pid_t>& ids = grpc.ids();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ThreadIsRealtimeScheduled(ids[i])) << i;
  EXPECT_FALSE(ThreadIsRealtimeScheduled(ids[3]));  // not a poller: a timer thread
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());  // nor the caller
}

TEST(AdminCallSchedulingTest, DisabledLeavesGrpcPollersNormal) {
  const std::vector<ThreadInfo> before = ListThreads();
  FakeGrpcThreads grpc({AdminCallScheduling::kGrpcCallbackThreadName});
  grpc.Name();
  // Disabled, it does not wait for names either: an hour's limit would time the test out.
  const absl::StatusOr<int> moved =
      AdminCallScheduling::Create(0).RaiseGrpcPollerThreads(before, absl::Hours(1));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
  EXPECT_FALSE(ThreadIsRealtimeScheduled(grpc.ids()[0]));
}

TEST(AdminCallSchedulingTest, WithoutThePrivilegeItIsDisabledAndSaysWhy) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_RTPRIO, &limit), 0);
  if (limit.rlim_cur >= 1) GTEST_SKIP() << "RLIMIT_RTPRIO lets any thread use SCHED_RR";
  AdminCallScheduling scheduling;
  bool realtime = true;
  OnNewThread([&] {
    ASSERT_TRUE(DropCapabilityFromCurrentThread(CAP_SYS_NICE).ok());
    scheduling = AdminCallScheduling::Create(1);
    { const AdminCallScheduling::Scope s = scheduling.PointRead(); }
    realtime = CurrentThreadIsRealtimeScheduled();
  });
  EXPECT_FALSE(scheduling.enabled());
  EXPECT_EQ(scheduling.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(scheduling.status().message().find("CAP_SYS_NICE"), absl::string_view::npos);
  EXPECT_EQ(scheduling.Describe(), "normal");
  EXPECT_FALSE(realtime);
}

TEST(AdminCallSchedulingTest, RefusesAPriorityOutsideTheRange) {
  const AdminCallScheduling scheduling = AdminCallScheduling::Create(100);
  EXPECT_FALSE(scheduling.enabled());
  EXPECT_EQ(scheduling.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace handoff::server
