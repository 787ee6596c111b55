#include "consumer/page_budget.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "consumer/slot_limit.h"
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

// A budget whose slots adapt, read from a clock the test moves.
struct AdaptiveBudget {
  absl::Time now = absl::UnixEpoch();
  std::shared_ptr<PageBudget> budget;

  AdaptiveBudget(size_t slots, size_t min) {
    PageBudget::Options options;
    options.slots = slots;
    options.adaptive_min = min;
    options.clock = [this] { return now; };
    budget = PageBudget::Create(std::move(options));
  }

  // One polled fetch under `slot`: its buffer lent, `bytes` received in `latency`, the
  // buffer given back once the page is parsed.
  void Fetch(PageSlot* slot, size_t bytes, absl::Duration latency) {
    slot->buffer()->assign(bytes, 'x');
    now += latency;
    slot->ReturnBuffer();
  }
};

TEST(PageBudgetTest, AnAdaptiveBudgetStartsAtItsMinimum) {
  AdaptiveBudget a(8, 2);
  EXPECT_EQ(a.budget->slots(), 8u);
  EXPECT_EQ(a.budget->limit(), 2u);
  std::optional<PageSlot> x = a.budget->TryAcquire();
  std::optional<PageSlot> y = a.budget->TryAcquire();
  ASSERT_TRUE(x.has_value() && y.has_value());
  EXPECT_FALSE(a.budget->TryAcquire().has_value());
  // A fixed budget (and one whose minimum is not below its slots) uses every slot.
  EXPECT_EQ(PageBudget::Create(8)->limit(), 8u);
  AdaptiveBudget fixed(4, 4);
  EXPECT_EQ(fixed.budget->limit(), 4u);
}

// Fetches as fast with two in flight as the first ones: the limit grows, and the slot
// it adds goes to the first source in line.
TEST(PageBudgetTest, FlatFetchLatencyGrowsTheLimitForTheNextWaiter) {
  AdaptiveBudget a(8, 2);
  std::optional<PageSlot> x = a.budget->TryAcquire();
  std::optional<PageSlot> y = a.budget->TryAcquire();
  ASSERT_TRUE(x.has_value() && y.has_value());
  std::optional<PageSlot> served;
  std::thread waiter([&] { served = a.budget->Acquire(Never); });
  AwaitWaiting(*a.budget, 1);
  for (size_t i = 0; i < SlotLimit::kMinWindowFetches; ++i) {
    a.Fetch(&*x, PageBudget::kMinSampledPageBytes, absl::Milliseconds(10));
  }
  waiter.join();
  EXPECT_TRUE(served.has_value());
  EXPECT_EQ(a.budget->limit(), 3u);
  EXPECT_EQ(a.budget->held(), 3u);
}

// A slot moved while its buffer is lent (a page handed on) still times its fetch from
// the lend: a flat latency grows the limit, a bogus one from the epoch would not.
TEST(PageBudgetTest, AMovedSlotKeepsItsFetchStart) {
  AdaptiveBudget a(8, 2);
  std::optional<PageSlot> x = a.budget->TryAcquire();
  ASSERT_TRUE(x.has_value());
  a.now += absl::Hours(1000);
  for (size_t i = 0; i < SlotLimit::kMinWindowFetches; ++i) {
    a.Fetch(&*x, PageBudget::kMinSampledPageBytes, absl::Milliseconds(10));
  }
  ASSERT_EQ(a.budget->limit(), 3u);  // the base: 10 ms
  for (size_t i = 0; i < SlotLimit::kMinWindowFetches; ++i) {
    x->buffer()->assign(PageBudget::kMinSampledPageBytes, 'x');
    PageSlot moved = *std::move(x);
    a.now += absl::Milliseconds(10);
    moved.ReturnBuffer();
    x = std::move(moved);
  }
  EXPECT_EQ(a.budget->limit(), 4u);
}

// A caught-up source's "nothing new" answers are small and quick: they are not
// samples, or every full page would look queued behind them.
TEST(PageBudgetTest, SmallPagesDoNotMoveTheLimit) {
  AdaptiveBudget a(8, 2);
  std::optional<PageSlot> x = a.budget->TryAcquire();
  ASSERT_TRUE(x.has_value());
  for (int i = 0; i < 100; ++i) {
    a.Fetch(&*x, PageBudget::kMinSampledPageBytes - 1, absl::Milliseconds(10));
  }
  EXPECT_EQ(a.budget->limit(), 2u);
  // Its buffers are still lent and kept as before.
  EXPECT_EQ(a.budget->idle_buffers(), 1u);
}

// Fetches that take longer the more are in flight (they share the CPU): the limit,
// grown while they did not, comes back down; the slots held above it are not taken
// back, new callers wait until enough are released.
TEST(PageBudgetTest, LatencyGrowingWithTheSlotsShrinksTheLimit) {
  AdaptiveBudget a(8, 2);
  std::vector<PageSlot> held;
  for (int i = 0; i < 2; ++i) held.push_back(*a.budget->TryAcquire());
  while (a.budget->limit() < 8) {
    a.Fetch(&held[0], PageBudget::kMinSampledPageBytes, absl::Milliseconds(1));
    if (std::optional<PageSlot> s = a.budget->TryAcquire()) held.push_back(*std::move(s));
  }
  ASSERT_EQ(held.size(), 8u);
  for (int i = 0; i < 200 && a.budget->limit() > 3; ++i) {
    a.Fetch(&held[0], PageBudget::kMinSampledPageBytes,
            absl::Milliseconds(1) * static_cast<double>(a.budget->limit()));
  }
  EXPECT_LE(a.budget->limit(), 3u);
  EXPECT_EQ(a.budget->held(), 8u);
  EXPECT_FALSE(a.budget->TryAcquire().has_value());
  while (held.size() > a.budget->limit()) held.pop_back();
  EXPECT_FALSE(a.budget->TryAcquire().has_value());  // at the limit exactly
  held.pop_back();
  EXPECT_TRUE(a.budget->TryAcquire().has_value());
}

}  // namespace
}  // namespace handoff::consumer
