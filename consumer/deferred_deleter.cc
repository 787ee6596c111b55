#include "consumer/deferred_deleter.h"

#include <utility>

#include "base/thread_priority.h"

namespace handoff::consumer {

DeferredDeleter::DeferredDeleter(size_t max_pending, int thread_nice)
    : max_pending_(max_pending), thread_nice_(thread_nice), thread_([this] { Run(); }) {}

DeferredDeleter::~DeferredDeleter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

size_t DeferredDeleter::inline_deletes() const {
  absl::MutexLock lock(&mu_);
  return inline_deletes_;
}

void DeferredDeleter::Enqueue(std::unique_ptr<Erased> object) {
  {
    absl::MutexLock lock(&mu_);
    if (pending_.size() < max_pending_ && !stopping_) {
      pending_.push_back(std::move(object));
      return;
    }
    ++inline_deletes_;
  }
  object.reset();  // outside the lock
}

void DeferredDeleter::Run() {
  // Best effort: at worst the thread keeps its creator's priority.
  LowerCurrentThreadPriority(thread_nice_).IgnoreError();
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty() || stopping_;
  };
  while (true) {
    std::unique_ptr<Erased> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work));
      if (pending_.empty()) return;  // stopping, and everything is destroyed
      next = std::move(pending_.front());
      pending_.pop_front();
    }
    next.reset();  // outside the lock: Enqueue never waits for a destructor
  }
}

}  // namespace handoff::consumer
