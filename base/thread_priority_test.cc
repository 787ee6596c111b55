#include "base/thread_priority.h"

#include <linux/capability.h>
#include <sys/resource.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "base/capabilities_for_testing.h"
#include "base/thread_name.h"
#include "gtest/gtest.h"

namespace handoff {
namespace {

TEST(ThreadPriorityTest, LowersOnlyTheCallingThreadAndItsNewThreads) {
  const int before = CurrentThreadNice();
  int worker = -100, child = -100;
  std::thread t([&] {
    ASSERT_TRUE(LowerCurrentThreadPriority(3).ok());
    worker = CurrentThreadNice();
    std::thread c([&] { child = CurrentThreadNice(); });  // inherits the worker's
    c.join();
  });
  t.join();
  EXPECT_EQ(worker, std::min(19, before + 3));
  EXPECT_EQ(child, worker);
  EXPECT_EQ(CurrentThreadNice(), before);  // this thread is untouched
}

TEST(ThreadPriorityTest, IdleSchedulingIsPerThreadAndInherited) {
  bool worker = false, child = false;
  std::thread t([&] {
    ASSERT_TRUE(UseIdleSchedulingForCurrentThread().ok());
    worker = CurrentThreadIsIdleScheduled();
    std::thread c([&] { child = CurrentThreadIsIdleScheduled(); });
    c.join();
  });
  t.join();
  EXPECT_TRUE(worker);
  EXPECT_TRUE(child);
  EXPECT_FALSE(CurrentThreadIsIdleScheduled());
}

TEST(ThreadPriorityTest, RejectsIncrementsOutsideTheNiceRange) {
  EXPECT_EQ(LowerCurrentThreadPriority(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LowerCurrentThreadPriority(20).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LowerCurrentThreadPriority(0).ok());
}

TEST(ThreadPriorityTest, RealtimeSchedulingIsPerThreadAndNotInherited) {
  const absl::Status allowed = CheckRealtimeSchedulingAllowed(1);
  if (!allowed.ok()) GTEST_SKIP() << "this process may not use SCHED_RR: " << allowed;
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());  // the check changed no thread here
  bool worker = false, child = true, back_to_normal = true;
  std::thread t([&] {
    ASSERT_TRUE(UseRealtimeSchedulingForCurrentThread(1).ok());
    worker = CurrentThreadIsRealtimeScheduled();
    // SCHED_RESET_ON_FORK: a thread a real-time thread starts begins under the normal
    // policy, so nothing an admin handler starts inherits it.
    std::thread c([&] { child = CurrentThreadIsRealtimeScheduled(); });
    c.join();
    ASSERT_TRUE(UseNormalSchedulingForCurrentThread().ok());
    back_to_normal = !CurrentThreadIsRealtimeScheduled();
  });
  t.join();
  EXPECT_TRUE(worker);
  EXPECT_FALSE(child);
  EXPECT_TRUE(back_to_normal);
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());
}

TEST(ThreadPriorityTest, AnotherThreadOfTheProcessCanBeMadeRealtime) {
  const absl::Status allowed = CheckRealtimeSchedulingAllowed(1);
  if (!allowed.ok()) GTEST_SKIP() << "this process may not use SCHED_RR: " << allowed;
  // A library's thread, which Handoff cannot run code on: it waits, and is moved from here.
  absl::Notification started, moved;
  pid_t tid = 0;
  bool realtime_inside = false, child = true;
  std::thread library([&] {
    tid = CurrentThreadId();
    started.Notify();
    moved.WaitForNotification();
    realtime_inside = CurrentThreadIsRealtimeScheduled();
    std::thread c([&] { child = CurrentThreadIsRealtimeScheduled(); });  // reset on fork
    c.join();
  });
  started.WaitForNotification();
  EXPECT_FALSE(ThreadIsRealtimeScheduled(tid));
  EXPECT_EQ(UseRealtimeSchedulingForThread(tid, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(UseRealtimeSchedulingForThread(tid, 1).ok());
  EXPECT_TRUE(ThreadIsRealtimeScheduled(tid));
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());  // the caller is unchanged
  moved.Notify();
  library.join();
  EXPECT_TRUE(realtime_inside);
  EXPECT_FALSE(child);
}

TEST(ThreadPriorityTest, RealtimeWithoutThePrivilegeIsPermissionDenied) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_RTPRIO, &limit), 0);
  if (limit.rlim_cur >= 1) GTEST_SKIP() << "RLIMIT_RTPRIO lets any thread use SCHED_RR";
  absl::Status check, direct;
  bool realtime = true;
  std::thread t([&] {
    // Capabilities are per thread: only this one (and threads it starts) loses it.
    ASSERT_TRUE(DropCapabilityFromCurrentThread(CAP_SYS_NICE).ok());
    check = CheckRealtimeSchedulingAllowed(1);
    direct = UseRealtimeSchedulingForCurrentThread(1);
    realtime = CurrentThreadIsRealtimeScheduled();
  });
  t.join();
  EXPECT_EQ(check.code(), absl::StatusCode::kPermissionDenied) << check;
  EXPECT_NE(check.message().find("CAP_SYS_NICE"), absl::string_view::npos) << check;
  EXPECT_EQ(direct.code(), absl::StatusCode::kPermissionDenied) << direct;
  EXPECT_FALSE(realtime);
}

TEST(ThreadPriorityTest, RejectsRealtimePrioritiesOutsideTheRange) {
  EXPECT_EQ(UseRealtimeSchedulingForCurrentThread(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UseRealtimeSchedulingForCurrentThread(100).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CurrentThreadIsRealtimeScheduled());
}

}  // namespace
}  // namespace handoff
