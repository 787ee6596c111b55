#include "base/thread_name.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace handoff {
namespace {

TEST(ThreadNameTest, KeepsRoleAndIdWhenTheyFit) {
  EXPECT_EQ(ThreadName("ingest", "usdc"), "ingest:usdc");
  EXPECT_EQ(ThreadName("in", "abcdefghijkl"), "in:abcdefghijkl");  // exactly 15
}

TEST(ThreadNameTest, MarksACutId) {
  const std::string name = ThreadName("ingest", "eth-mainnet-usdc-transfers");
  EXPECT_EQ(name.size(), kMaxThreadNameBytes);
  EXPECT_EQ(name, "ingest:eth-mai~");
}

TEST(ThreadNameTest, NamesTheCallingThreadAndItsChildrenInherit) {
  std::string own, inherited;
  std::thread t([&] {
    ASSERT_TRUE(NameCurrentThread("in:src-1").ok());
    own = CurrentThreadName();
    std::thread child([&] { inherited = CurrentThreadName(); });
    child.join();
  });
  t.join();
  EXPECT_EQ(own, "in:src-1");
  EXPECT_EQ(inherited, "in:src-1");
  EXPECT_NE(CurrentThreadName(), "in:src-1");  // another thread's name is its own
}

TEST(ThreadNameTest, RefusesANameLinuxWouldCut) {
  std::thread t([] {
    const std::string before = CurrentThreadName();
    EXPECT_EQ(NameCurrentThread("a-name-of-16-chr").code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CurrentThreadName(), before);
  });
  t.join();
}

TEST(ThreadNameTest, FindsTheProcesssThreadsByName) {
  EXPECT_TRUE(ThreadsNamed("tn-test-lib").empty());
  absl::BlockingCounter named(2);
  absl::Notification done;
  std::vector<pid_t> ids(2);
  std::vector<std::thread> threads;
  for (pid_t& id : ids) {
    threads.emplace_back([&] {
      ASSERT_TRUE(NameCurrentThread("tn-test-lib").ok());
      id = CurrentThreadId();
      named.DecrementCount();
      done.WaitForNotification();
      // An ended thread can stay listed in /proc/self/task a moment after join returns.
      ASSERT_TRUE(NameCurrentThread("tn-test-end").ok());
    });
  }
  named.Wait();
  std::vector<pid_t> found = ThreadsNamed("tn-test-lib");
  std::sort(found.begin(), found.end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(found, ids);
  EXPECT_TRUE(ThreadsNamed("tn-test-li").empty());  // exact names only
  EXPECT_NE(CurrentThreadId(), ids[0]);
  done.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(ThreadsNamed("tn-test-lib").empty());  // names are read afresh
}

}  // namespace
}  // namespace handoff
