// PageBudget: the process-wide cap on pages held between their fetch and their release,
// shared by every source, with the receive buffers that go with them.
//
// Without it every source keeps its own page-sized buffers (a receive buffer, the page
// being committed, the prefetched ones): page memory grows with the number of sources,
// and 64 sources catching up at once hold 128 pages where two vCPUs can work on a few.
// With it a page is fetched only under a PageSlot, and the slot travels with the Page
// (Page::slot) until the page is destroyed, so at most `slots` pages exist whatever the
// number of sources; receive buffers are lent by slot and reused, so the same memory
// serves every source instead of each source faulting in its own (bench/HISTORY.md 75).
//
// Invariants:
//  - At most `slots` PageSlots are alive at once (0: no cap, slots are only counted).
//  - Waiters are served first come, first served: Acquire never lets a later caller
//    (nor TryAcquire) take a slot while an earlier Acquire waits, so a source waits only
//    for the callers ahead of it in line to be served, never forever.
//  - A caller never waits for a slot while holding one it could only give back after the
//    wait (the provider acquires for its own Fetch only when it holds none, and only
//    ever tries for a prefetch): every slot is released by something that does not wait
//    for the budget, so there is no deadlock. And no slot is held for an unbounded
//    time: a page whose attempt waits for an operator's hold or a retry gives its slot
//    back (PageAttempt::ReleasePageSlot) and keeps its memory, and the pages its source
//    fetched ahead are dropped (Provider::DropReadAhead).
//  - Idle receive buffers kept for reuse: at most max(slots, 2), so the budget's own
//    memory is bounded by what its slots may hold.
//  - With an adaptive minimum, the slots that may be held (limit()) move between that
//    minimum and `slots` by SlotLimit's rule, one at a time, from the latency of the
//    polled fetches made under slots (request to page parsed, pages of at least
//    kMinSampledPageBytes). `slots` stays the cap the memory bound counts; a limit that
//    shrinks below the slots held takes none back, it only makes new callers wait.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_PAGE_BUDGET_H_
#define HANDOFF_CONSUMER_PAGE_BUDGET_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consumer/slot_limit.h"

namespace handoff::consumer {

class PageBudget;

// The right to hold one page, and the receive buffer lent with it. Move-only; gives
// both back when destroyed. A default-constructed slot is empty (not counted).
class PageSlot {
 public:
  PageSlot() = default;
  PageSlot(PageSlot&& other) noexcept;
  PageSlot& operator=(PageSlot&& other) noexcept;
  PageSlot(const PageSlot&) = delete;
  PageSlot& operator=(const PageSlot&) = delete;
  ~PageSlot() { Release(); }

  // True for a slot lent by a budget (not yet released).
  bool held() const { return budget_ != nullptr; }
  // The receive buffer lent with this slot, taken from the budget's idle ones on first
  // use (its capacity from an earlier page is kept). Contents unspecified. Only on a
  // held slot.
  std::string* buffer();
  // Gives the receive buffer back (the page no longer needs its wire text once parsed),
  // keeping the slot.
  void ReturnBuffer();
  // Gives the slot (and its buffer) back now.
  void Release();

 private:
  friend class PageBudget;
  explicit PageSlot(std::shared_ptr<PageBudget> budget) : budget_(std::move(budget)) {}

  // Keeps the budget alive: a page may outlive the provider that fetched it.
  std::shared_ptr<PageBudget> budget_;
  std::unique_ptr<std::string> buffer_;
  // When buffer() first lent the buffer: the fetch's start.
  absl::Time lent_at_;
};

class PageBudget : public std::enable_shared_from_this<PageBudget> {
 public:
  // Fetches of smaller bodies are not sampled for the adaptive limit.
  static constexpr size_t kMinSampledPageBytes = 16 << 10;

  // `slots`: pages held at once, at most; 0 for no cap. Slots keep their budget alive.
  static std::shared_ptr<PageBudget> Create(size_t slots);
  struct Options {
    // Pages held at once, at most; 0 for no cap.
    size_t slots = 0;
    // When at least 1 and below `slots`: the slots that may be held adapt between this
    // and `slots` to the latency of the fetches made under them (SlotLimit).
    size_t adaptive_min = 0;
    // Where fetch latencies are read (tests replace it).
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };
  static std::shared_ptr<PageBudget> Create(Options options);
  PageBudget(const PageBudget&) = delete;
  PageBudget& operator=(const PageBudget&) = delete;

  // Waits, in arrival order, for a free slot. nullopt once `cancelled()` returns true;
  // `cancelled` is evaluated by the waiting thread under the budget's lock, so it must
  // only read atomics; whoever makes it true must call WakeWaiters() after.
  std::optional<PageSlot> Acquire(absl::FunctionRef<bool()> cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  // A slot if one is free and nobody waits for one; else nullopt, at once.
  std::optional<PageSlot> TryAcquire() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes waiters re-evaluate their `cancelled` (after a cancellation flag was set).
  void WakeWaiters() ABSL_LOCKS_EXCLUDED(mu_);

  size_t slots() const { return slots_; }
  // Slots that may be held now: slots(), or SlotLimit's limit where it adapts.
  size_t limit() const ABSL_LOCKS_EXCLUDED(mu_);
  // Slots held now; and the most held at once since construction.
  size_t held() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t peak_held() const ABSL_LOCKS_EXCLUDED(mu_);
  // Callers waiting in Acquire now.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  // Idle receive buffers kept for reuse.
  size_t idle_buffers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PageSlot;
  struct Waiter;

  explicit PageBudget(Options options);

  bool Free() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slots_ == 0 || held_ < (limit_ != nullptr ? limit_->limit() : slots_);
  }
  PageSlot Grant() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Signals the first waiter if a slot is free for it.
  void WakeFirstLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(std::unique_ptr<std::string> buffer) ABSL_LOCKS_EXCLUDED(mu_);
  void KeepBuffer(std::unique_ptr<std::string> buffer, absl::Duration fetch)
      ABSL_LOCKS_EXCLUDED(mu_);
  void KeepBufferLocked(std::unique_ptr<std::string> buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<std::string> LendBuffer() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t slots_;
  const size_t max_idle_buffers_;
  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  const std::unique_ptr<SlotLimit> limit_ ABSL_PT_GUARDED_BY(mu_);
  size_t held_ ABSL_GUARDED_BY(mu_) = 0;
  size_t peak_held_ ABSL_GUARDED_BY(mu_) = 0;
  // The callers waiting in Acquire, oldest first (each Waiter lives on its caller's
  // stack until it leaves the queue).
  std::deque<Waiter*> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<std::string>> idle_buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PAGE_BUDGET_H_
