#include "consumer/deferred_deleter.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

// Records the order of destruction and the destroying thread.
struct Tracked {
  Tracked(int id, absl::Mutex* mu, std::vector<int>* order, std::thread::id* last)
      : id(id), mu(mu), order(order), last(last) {}
  ~Tracked() {
    absl::MutexLock lock(mu);
    order->push_back(id);
    *last = std::this_thread::get_id();
  }
  int id;
  absl::Mutex* mu;
  std::vector<int>* order;
  std::thread::id* last;
};

// Blocks its destruction until `release` is notified.
struct Gate {
  Gate(absl::Notification* entered, absl::Notification* release)
      : entered(entered), release(release) {}
  ~Gate() {
    entered->Notify();
    release->WaitForNotification();
  }
  absl::Notification* entered;
  absl::Notification* release;
};

TEST(DeferredDeleterTest, DestroysEverythingInOrderOffTheCallingThread) {
  absl::Mutex mu;
  std::vector<int> order;
  std::thread::id last;
  {
    DeferredDeleter deleter(100);
    for (int i = 0; i < 50; ++i) {
      deleter.Delete(std::make_unique<Tracked>(i, &mu, &order, &last));
    }
    EXPECT_EQ(deleter.inline_deletes(), 0u);
  }  // the destructor drains the queue
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(last, std::this_thread::get_id());
}

TEST(DeferredDeleterTest, AFullQueueDestroysInlineSoMemoryStaysBounded) {
  absl::Notification entered, release;
  absl::Mutex mu;
  std::vector<int> order;
  std::thread::id last;
  DeferredDeleter deleter(2);
  // The background thread is stuck destroying the gate; two more fit in the queue.
  deleter.Delete(std::make_unique<Gate>(&entered, &release));
  entered.WaitForNotification();
  deleter.Delete(std::make_unique<Tracked>(1, &mu, &order, &last));
  deleter.Delete(std::make_unique<Tracked>(2, &mu, &order, &last));
  deleter.Delete(std::make_unique<Tracked>(3, &mu, &order, &last));  // queue full
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(order.size(), 1u);
    EXPECT_EQ(order[0], 3);
    EXPECT_EQ(last, std::this_thread::get_id());
  }
  EXPECT_EQ(deleter.inline_deletes(), 1u);
  release.Notify();
}

TEST(DeferredDeleterTest, ANullObjectIsIgnored) {
  DeferredDeleter deleter(1);
  deleter.Delete(std::unique_ptr<int>());
  EXPECT_EQ(deleter.inline_deletes(), 0u);
}

}  // namespace
}  // namespace handoff::consumer
