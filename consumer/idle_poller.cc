#include "consumer/idle_poller.h"

#include <optional>
#include <utility>

#include "base/thread_name.h"
#include "base/thread_priority.h"

namespace handoff::consumer {

IdlePoller::IdlePoller(int thread_nice)
    : thread_nice_(thread_nice), thread_([this] { Run(); }) {}

IdlePoller::~IdlePoller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  thread_.join();
}

void IdlePoller::Park(ParkedPoll* p) {
  absl::MutexLock lock(&mu_);
  const bool earliest = due_.empty() || p->at < due_.begin()->first;
  due_.emplace(p->at, p);
  // Otherwise the poller already wakes before this deadline: no wake-up for it now.
  if (earliest) cv_.Signal();
}

void IdlePoller::Unpark(ParkedPoll* p) {
  absl::MutexLock lock(&mu_);
  due_.erase({p->at, p});
  if (in_flight_ != p) return;
  in_flight_unparked_ = true;
  while (in_flight_ == p) cv_.Wait(&mu_);
}

size_t IdlePoller::parked() const {
  absl::MutexLock lock(&mu_);
  return due_.size() + (in_flight_ != nullptr ? 1 : 0);
}

int64_t IdlePoller::idle_polls() const {
  absl::MutexLock lock(&mu_);
  return idle_polls_;
}

void IdlePoller::Run() {
  NameCurrentThread("idle-poller").IgnoreError();
  // Best effort: at worst the thread keeps its creator's priority.
  LowerCurrentThreadPriority(thread_nice_).IgnoreError();
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    if (const absl::Time at = due_.begin()->first; absl::Now() < at) {
      cv_.WaitWithDeadline(&mu_, at);
      continue;
    }
    ParkedPoll* p = due_.begin()->second;
    due_.erase(due_.begin());
    in_flight_ = p;
    in_flight_unparked_ = false;
    mu_.Unlock();
    // Outside the lock, still in flight: Unpark waits for this to end.
    FetchResult fetched = p->provider->Fetch(p->cursor);
    const bool nothing_new = fetched.page.has_value() && p->nothing_new(*fetched.page);
    std::optional<absl::Time> next;
    if (nothing_new) {
      fetched = FetchResult();  // the empty page and its budget slot go now
      next = p->backoff->NextDeadline(absl::Now());
      p->on_nothing_new(*next);
    } else {
      p->on_result(std::move(fetched));
    }
    mu_.Lock();
    if (nothing_new) {
      ++idle_polls_;
      if (!in_flight_unparked_) {
        p->at = *next;
        due_.emplace(p->at, p);
      }
    }
    in_flight_ = nullptr;
    cv_.SignalAll();  // an Unpark waiting for this Fetch
  }
}

}  // namespace handoff::consumer
