#include "consumer/page_budget.h"

#include <algorithm>
#include <utility>

namespace handoff::consumer {

PageSlot::PageSlot(PageSlot&& other) noexcept
    : budget_(std::move(other.budget_)),
      buffer_(std::move(other.buffer_)),
      lent_at_(other.lent_at_) {}

PageSlot& PageSlot::operator=(PageSlot&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::move(other.budget_);
    buffer_ = std::move(other.buffer_);
    lent_at_ = other.lent_at_;
  }
  return *this;
}

std::string* PageSlot::buffer() {
  if (buffer_ == nullptr) {
    buffer_ = budget_->LendBuffer();
    lent_at_ = budget_->clock_();
  }
  return buffer_.get();
}

void PageSlot::ReturnBuffer() {
  if (budget_ != nullptr && buffer_ != nullptr) {
    const absl::Duration fetch = budget_->clock_() - lent_at_;
    budget_->KeepBuffer(std::move(buffer_), fetch);
  }
}

void PageSlot::Release() {
  if (budget_ == nullptr) return;
  std::shared_ptr<PageBudget> budget = std::move(budget_);
  budget->Return(std::move(buffer_));
}

// One caller waiting in Acquire, woken by its own condition variable: only the first in
// line is signalled when a slot frees, so an unlock of the budget's lock costs the same
// however many callers wait (an absl::Condition per waiter was evaluated by every
// unlocking thread, for every waiter: consumer/page_budget_bench).
struct PageBudget::Waiter {
  absl::CondVar wake;
};

PageBudget::PageBudget(Options options)
    : slots_(options.slots),
      max_idle_buffers_(std::max<size_t>(options.slots, 2)),
      clock_(std::move(options.clock)),
      limit_(options.slots > 0 && options.adaptive_min > 0 &&
                     options.adaptive_min < options.slots
                 ? std::make_unique<SlotLimit>(options.adaptive_min, options.slots)
                 : nullptr) {}

std::shared_ptr<PageBudget> PageBudget::Create(size_t slots) {
  Options options;
  options.slots = slots;
  return Create(std::move(options));
}

std::shared_ptr<PageBudget> PageBudget::Create(Options options) {
  return std::shared_ptr<PageBudget>(new PageBudget(std::move(options)));
}

PageSlot PageBudget::Grant() {
  ++held_;
  peak_held_ = std::max(peak_held_, held_);
  return PageSlot(shared_from_this());
}

std::optional<PageSlot> PageBudget::Acquire(absl::FunctionRef<bool()> cancelled) {
  absl::MutexLock lock(&mu_);
  if (queue_.empty() && Free()) return Grant();
  Waiter waiter;
  queue_.push_back(&waiter);
  auto served = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.front() == &waiter && Free();
  };
  while (!served() && !cancelled()) waiter.wake.Wait(&mu_);
  // Granted even if also cancelled: the caller releases it.
  std::optional<PageSlot> slot;
  if (served()) slot = Grant();
  queue_.erase(std::find(queue_.begin(), queue_.end(), &waiter));
  // The next in line may be served now: it became first, or a cancelled first waiter
  // left a free slot behind.
  WakeFirstLocked();
  return slot;
}

std::optional<PageSlot> PageBudget::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (queue_.empty() && Free()) return Grant();
  return std::nullopt;
}

void PageBudget::WakeWaiters() {
  absl::MutexLock lock(&mu_);
  for (Waiter* waiter : queue_) waiter->wake.Signal();
}

void PageBudget::WakeFirstLocked() {
  if (!queue_.empty() && Free()) queue_.front()->wake.Signal();
}

void PageBudget::Return(std::unique_ptr<std::string> buffer) {
  absl::MutexLock lock(&mu_);
  --held_;
  KeepBufferLocked(std::move(buffer));
  WakeFirstLocked();
}

void PageBudget::KeepBuffer(std::unique_ptr<std::string> buffer, absl::Duration fetch) {
  absl::MutexLock lock(&mu_);
  // An empty or small page says little about how long pages take: an idle source's
  // quick "nothing new" would make every full page look queued behind it.
  const bool sample = buffer != nullptr && buffer->size() >= kMinSampledPageBytes;
  KeepBufferLocked(std::move(buffer));
  // A limit grown by one may serve the first in line.
  if (sample && limit_ != nullptr && limit_->Record(fetch)) WakeFirstLocked();
}

void PageBudget::KeepBufferLocked(std::unique_ptr<std::string> buffer) {
  if (buffer != nullptr && idle_buffers_.size() < max_idle_buffers_) {
    idle_buffers_.push_back(std::move(buffer));
  }  // else freed here
}

std::unique_ptr<std::string> PageBudget::LendBuffer() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_buffers_.empty()) {
      std::unique_ptr<std::string> b = std::move(idle_buffers_.back());
      idle_buffers_.pop_back();
      return b;
    }
  }
  return std::make_unique<std::string>();
}

size_t PageBudget::limit() const {
  absl::MutexLock lock(&mu_);
  return limit_ != nullptr ? limit_->limit() : slots_;
}

size_t PageBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

size_t PageBudget::peak_held() const {
  absl::MutexLock lock(&mu_);
  return peak_held_;
}

size_t PageBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

size_t PageBudget::idle_buffers() const {
  absl::MutexLock lock(&mu_);
  return idle_buffers_.size();
}

}  // namespace handoff::consumer
