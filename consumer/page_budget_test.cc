#include "consumer/page_budget.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

bool Never() { return false; }

// Waits (without sleeping a fixed time) until `n` callers wait in `budget`.
void AwaitWaiting(const PageBudget& budget, size_t n) {
  while (budget.waiting() != n) std::this_thread::yield();
}

TEST(PageBudgetTest, CapsTheSlotsHeldAtOnce) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(2);
  std::optional<PageSlot> a = budget->TryAcquire();
  std::optional<PageSlot> b = budget->TryAcquire();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(a->held());
  EXPECT_FALSE(budget->TryAcquire().has_value());
  EXPECT_EQ(budget->held(), 2u);
  a->Release();
  EXPECT_FALSE(a->held());
  EXPECT_EQ(budget->held(), 1u);
  EXPECT_TRUE(budget->TryAcquire().has_value());  // released again at once
  EXPECT_EQ(budget->peak_held(), 2u);
}

TEST(PageBudgetTest, ZeroSlotsMeansNoCap) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(0);
  std::vector<PageSlot> slots;
  for (int i = 0; i < 100; ++i) {
    std::optional<PageSlot> s = budget->TryAcquire();
    ASSERT_TRUE(s.has_value());
    slots.push_back(*std::move(s));
  }
  EXPECT_EQ(budget->held(), 100u);
}

TEST(PageBudgetTest, AMovedSlotIsReleasedOnce) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> a = budget->TryAcquire();
  ASSERT_TRUE(a.has_value());
  PageSlot moved = *std::move(a);
  a.reset();  // the moved-from slot releases nothing
  EXPECT_EQ(budget->held(), 1u);
  PageSlot assigned;
  assigned = std::move(moved);
  EXPECT_EQ(budget->held(), 1u);
  assigned = PageSlot();  // releases
  EXPECT_EQ(budget->held(), 0u);
}

TEST(PageBudgetTest, BuffersAreReusedWithTheirCapacity) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(2);
  const std::string* first = nullptr;
  {
    std::optional<PageSlot> s = budget->TryAcquire();
    ASSERT_TRUE(s.has_value());
    s->buffer()->assign(1 << 20, 'x');
    first = s->buffer();
  }
  EXPECT_EQ(budget->idle_buffers(), 1u);
  std::optional<PageSlot> s = budget->TryAcquire();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->buffer(), first);
  EXPECT_GE(s->buffer()->capacity(), size_t{1} << 20);
  EXPECT_EQ(budget->idle_buffers(), 0u);
}

TEST(PageBudgetTest, AReturnedBufferServesTheNextSlotWhileTheFirstIsHeld) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(2);
  std::optional<PageSlot> a = budget->TryAcquire();
  ASSERT_TRUE(a.has_value());
  std::string* buffer = a->buffer();
  a->ReturnBuffer();  // parsed: the wire text is no longer needed
  EXPECT_TRUE(a->held());
  std::optional<PageSlot> b = budget->TryAcquire();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->buffer(), buffer);
  EXPECT_EQ(budget->held(), 2u);
}

TEST(PageBudgetTest, KeepsAtMostItsSlotsInIdleBuffers) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(0);  // uncapped: keeps at most 2
  {
    std::vector<PageSlot> slots;
    for (int i = 0; i < 5; ++i) {
      slots.push_back(*budget->TryAcquire());
      slots.back().buffer();
    }
  }
  EXPECT_EQ(budget->idle_buffers(), 2u);
}

TEST(PageBudgetTest, WaitersAreServedInArrivalOrderAndTryAcquireDoesNotJumpTheQueue) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> holder = budget->TryAcquire();
  ASSERT_TRUE(holder.has_value());
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification let_go;  // each waiter keeps its slot until then
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      std::optional<PageSlot> s = budget->Acquire(Never);
      ASSERT_TRUE(s.has_value());
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      let_go.WaitForNotification();
    });
    AwaitWaiting(*budget, static_cast<size_t>(i + 1));  // arrival order 0, 1, 2
  }
  holder->Release();
  // The slot freed is the first waiter's, whether it has run yet or not: a TryAcquire
  // must not take it.
  EXPECT_FALSE(budget->TryAcquire().has_value());
  let_go.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(budget->held(), 0u);
}

TEST(PageBudgetTest, ACancelledWaiterLeavesTheQueueAndTheNextIsServed) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> holder = budget->TryAcquire();
  ASSERT_TRUE(holder.has_value());
  std::atomic<bool> cancel_first{false};
  std::optional<PageSlot> first_result;
  std::thread first([&] {
    first_result = budget->Acquire([&] { return cancel_first.load(); });
  });
  AwaitWaiting(*budget, 1);
  absl::Notification second_done;
  std::thread second([&] {
    std::optional<PageSlot> s = budget->Acquire(Never);
    EXPECT_TRUE(s.has_value());
    second_done.Notify();
  });
  AwaitWaiting(*budget, 2);
  cancel_first.store(true);
  budget->WakeWaiters();
  first.join();
  EXPECT_FALSE(first_result.has_value());
  EXPECT_EQ(budget->waiting(), 1u);  // the second still waits: no slot is free
  EXPECT_FALSE(second_done.HasBeenNotified());
  holder->Release();
  second.join();
  EXPECT_TRUE(second_done.HasBeenNotified());
}

// Only a waiter looks at its own cancellation, on its own thread: the threads that take
// and give back slots and buffers do no work per waiting caller (with an absl::Condition
// per waiter, every unlock evaluated every waiter's: consumer/page_budget_bench).
TEST(PageBudgetTest, OthersUsingTheBudgetDoNoWorkForItsWaiters) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> holder = budget->TryAcquire();
  ASSERT_TRUE(holder.has_value());
  std::atomic<int> evaluated_elsewhere{0};
  std::atomic<bool> cancel{false};
  std::thread::id waiter_id;
  absl::Notification waiter_started;
  std::thread waiter([&] {
    waiter_id = std::this_thread::get_id();
    waiter_started.Notify();
    budget->Acquire([&] {
      if (std::this_thread::get_id() != waiter_id) evaluated_elsewhere.fetch_add(1);
      return cancel.load();
    });
  });
  waiter_started.WaitForNotification();
  AwaitWaiting(*budget, 1);
  for (int i = 0; i < 100; ++i) {
    holder->buffer();
    holder->ReturnBuffer();
    EXPECT_FALSE(budget->TryAcquire().has_value());
  }
  cancel.store(true);
  budget->WakeWaiters();
  waiter.join();
  EXPECT_EQ(evaluated_elsewhere.load(), 0);
}

TEST(PageBudgetTest, ASlotKeepsItsBudgetAlive) {
  std::optional<PageSlot> slot;
  {
    std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
    slot = budget->TryAcquire();
    ASSERT_TRUE(slot.has_value());
    slot->buffer()->assign("page");
  }  // the provider that owned the budget is gone; its page is not
  EXPECT_EQ(*slot->buffer(), "page");
  slot->Release();
}

TEST(PageBudgetTest, ManyThreadsNeverHoldMoreThanTheCap) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(3);
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        std::optional<PageSlot> s = budget->Acquire(Never);
        ASSERT_TRUE(s.has_value());
        const int now = inside.fetch_add(1) + 1;
        int m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {
        }
        inside.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_LE(budget->peak_held(), 3u);
  EXPECT_EQ(budget->held(), 0u);
}

}  // namespace
}  // namespace handoff::consumer
