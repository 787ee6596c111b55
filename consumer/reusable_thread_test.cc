#include "consumer/reusable_thread.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

TEST(ReusableThreadTest, TasksBackToBackShareOneThread) {
  ReusableThread runner(absl::Hours(1));  // no idle exit, however the test is scheduled
  std::vector<int> seen;  // written by the tasks, read after Wait(): no lock needed
  std::thread::id first;
  for (int i = 0; i < 200; ++i) {
    EXPECT_FALSE(runner.busy());
    runner.Run([&seen, &first, i] {
      if (i == 0) first = std::this_thread::get_id();
      EXPECT_EQ(std::this_thread::get_id(), first);
      seen.push_back(i);
    });
    EXPECT_TRUE(runner.busy());
    runner.Wait();
    ASSERT_EQ(seen.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(seen.back(), i);
  }
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(runner.threads_started(), 1);
}

TEST(ReusableThreadTest, WaitWithoutATaskReturnsAtOnce) {
  ReusableThread runner;
  runner.Wait();
  EXPECT_FALSE(runner.busy());
  EXPECT_EQ(runner.threads_started(), 0);
}

TEST(ReusableThreadTest, AnIdleThreadEndsAndTheNextTaskStartsAnother) {
  ReusableThread runner(absl::Milliseconds(5));
  std::atomic<int> ran{0};
  runner.Run([&ran] { ++ran; });
  runner.Wait();
  // Wait (bounded) for the idle thread to leave: it owns no task, so a new one must be
  // started for the next task.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (runner.thread_alive() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_FALSE(runner.thread_alive());
  runner.Run([&ran] { ++ran; });
  runner.Wait();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(runner.threads_started(), 2);
}

TEST(ReusableThreadTest, DestructorWaitsForTheTaskInFlight) {
  absl::Notification release;
  std::atomic<bool> done{false};
  std::thread releaser;
  {
    ReusableThread runner;
    runner.Run([&] {
      release.WaitForNotification();
      done = true;
    });
    releaser = std::thread([&release] { release.Notify(); });
  }  // ~ReusableThread
  EXPECT_TRUE(done.load());
  releaser.join();
}

}  // namespace
}  // namespace handoff::consumer
