#include "store/wal_syncer.h"

#include <utility>

#include "absl/time/clock.h"
#include "base/thread_name.h"

namespace handoff::store {

WalSyncer::WalSyncer(std::function<absl::Status()> sync, absl::Duration min_interval)
    : sync_(std::move(sync)), min_interval_(min_interval), thread_([this] { Run(); }) {}

WalSyncer::~WalSyncer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

SyncTicket WalSyncer::Written() {
  absl::MutexLock lock(&mu_);
  return SyncTicket{++written_};
}

absl::Status WalSyncer::Await(SyncTicket ticket) {
  absl::MutexLock lock(&mu_);
  auto settled = [this, ticket]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return synced_ >= ticket.value || !failure_.ok();
  };
  if (!settled()) {
    ++waiters_;  // ends a paced sync's wait: somebody needs it now
    mu_.Await(absl::Condition(&settled));
    --waiters_;
  }
  if (synced_ >= ticket.value) return absl::OkStatus();
  return failure_;
}

bool WalSyncer::IsSynced(SyncTicket ticket) const {
  absl::MutexLock lock(&mu_);
  return synced_ >= ticket.value;
}

uint64_t WalSyncer::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

void WalSyncer::Run() {
  NameCurrentThread("wal-sync").IgnoreError();  // best effort: only for operators
  absl::MutexLock lock(&mu_);
  while (true) {
    auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || (written_ > synced_ && failure_.ok());
    };
    mu_.Await(absl::Condition(&work));
    if (written_ == synced_ || !failure_.ok()) {
      if (stopping_) return;
      continue;
    }
    // Paced: the tickets that arrive meanwhile share this sync.
    auto needed_now = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || waiters_ > 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&needed_now), last_start_ + min_interval_);
    last_start_ = absl::Now();
    // Every ticket taken by now belongs to a write that has returned: this sync,
    // beginning after, covers them all. Later tickets wait for the next one.
    const uint64_t target = written_;
    mu_.Unlock();
    absl::Status s = sync_();
    mu_.Lock();
    if (s.ok()) {
      synced_ = target;
      ++syncs_;
    } else {
      failure_ = s;
    }
  }
}

}  // namespace handoff::store
