#include "consumer/keyed_mutex.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

// While "a" is held, "b" can be taken at once (this thread would wait forever if the
// keys shared a mutex: the bounded wait turns that into a failure).
TEST(KeyedMutexTest, DifferentKeysDoNotWaitForEachOther) {
  KeyedMutex keys;
  absl::Notification a_held, b_taken, release_a;
  std::thread holder([&] {
    KeyedMutex::Lock a(&keys, "a");
    a_held.Notify();
    release_a.WaitForNotification();
  });
  a_held.WaitForNotification();
  std::thread other([&] {
    KeyedMutex::Lock b(&keys, "b");
    b_taken.Notify();
  });
  EXPECT_TRUE(b_taken.WaitForNotificationWithTimeout(absl::Seconds(30)));
  release_a.Notify();
  holder.join();
  other.join();
  EXPECT_EQ(keys.keys_in_use(), 0u);
}

// One key: holders never overlap, and every increment under the lock survives.
TEST(KeyedMutexTest, OneKeyIsHeldByOneThreadAtATime) {
  KeyedMutex keys;
  std::atomic<int> inside{0};
  int counter = 0;  // guarded by the key's mutex
  std::atomic<bool> overlapped{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        KeyedMutex::Lock lock(&keys, "same");
        if (inside.fetch_add(1) != 0) overlapped = true;
        ++counter;
        inside.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(counter, 8 * 2000);
  EXPECT_EQ(keys.keys_in_use(), 0u);  // the key's mutex went with its last user
}

}  // namespace
}  // namespace handoff::consumer
