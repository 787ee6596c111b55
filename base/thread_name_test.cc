#include "base/thread_name.h"

#include <string>
#include <thread>

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

}  // namespace
}  // namespace handoff
