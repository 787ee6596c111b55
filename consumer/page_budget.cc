#include "consumer/page_budget.h"

#include <algorithm>
#include <utility>

namespace handoff::consumer {

PageSlot::PageSlot(PageSlot&& other) noexcept
    : budget_(std::move(other.budget_)), buffer_(std::move(other.buffer_)) {}

PageSlot& PageSlot::operator=(PageSlot&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::move(other.budget_);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

std::string* PageSlot::buffer() {
  if (buffer_ == nullptr) buffer_ = budget_->LendBuffer();
  return buffer_.get();
}

void PageSlot::ReturnBuffer() {
  if (budget_ != nullptr && buffer_ != nullptr) budget_->KeepBuffer(std::move(buffer_));
}

void PageSlot::Release() {
  if (budget_ == nullptr) return;
  std::shared_ptr<PageBudget> budget = std::move(budget_);
  budget->Return(std::move(buffer_));
}

// One caller waiting in Acquire: ready when its ticket is first and a slot is free, or
// when it was cancelled. Evaluated by whichever thread unlocks the budget's mutex.
struct PageBudget::Waiter {
  const PageBudget* budget;
  uint64_t ticket;
  absl::FunctionRef<bool()> cancelled;

  bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS {  // called with budget->mu_ held
    return (budget->queue_.front() == ticket && budget->Free()) || cancelled();
  }
};

PageBudget::PageBudget(size_t slots) : slots_(slots), max_idle_buffers_(std::max<size_t>(slots, 2)) {}

std::shared_ptr<PageBudget> PageBudget::Create(size_t slots) {
  return std::shared_ptr<PageBudget>(new PageBudget(slots));
}

PageSlot PageBudget::Grant() {
  ++held_;
  peak_held_ = std::max(peak_held_, held_);
  return PageSlot(shared_from_this());
}

std::optional<PageSlot> PageBudget::Acquire(absl::FunctionRef<bool()> cancelled) {
  absl::MutexLock lock(&mu_);
  if (queue_.empty() && Free()) return Grant();
  const Waiter waiter{this, next_ticket_++, cancelled};
  queue_.push_back(waiter.ticket);
  mu_.Await(absl::Condition(&waiter, &Waiter::Ready));
  const bool granted = queue_.front() == waiter.ticket && Free();
  queue_.erase(std::find(queue_.begin(), queue_.end(), waiter.ticket));
  // Granted even if also cancelled: the caller releases it; a slot left unused by a
  // cancelled first waiter would otherwise need a wake-up of the next one anyway.
  if (granted) return Grant();
  return std::nullopt;
}

std::optional<PageSlot> PageBudget::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (queue_.empty() && Free()) return Grant();
  return std::nullopt;
}

void PageBudget::WakeWaiters() {
  // Unlocking makes absl::Mutex evaluate the waiters' conditions.
  absl::MutexLock lock(&mu_);
}

void PageBudget::Return(std::unique_ptr<std::string> buffer) {
  absl::MutexLock lock(&mu_);
  --held_;
  KeepBufferLocked(std::move(buffer));
}

void PageBudget::KeepBuffer(std::unique_ptr<std::string> buffer) {
  absl::MutexLock lock(&mu_);
  KeepBufferLocked(std::move(buffer));
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
