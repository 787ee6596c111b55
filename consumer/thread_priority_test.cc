#include "consumer/thread_priority.h"

#include <thread>

#include "gtest/gtest.h"

namespace handoff::consumer {
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

}  // namespace
}  // namespace handoff::consumer
