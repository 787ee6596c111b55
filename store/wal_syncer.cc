#include "store/wal_syncer.h"

#include <utility>

#include "base/thread_name.h"

namespace handoff::store {

WalSyncer::WalSyncer(std::function<absl::Status()> sync)
    : sync_(std::move(sync)), thread_([this] { Run(); }) {}

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
  mu_.Await(absl::Condition(&settled));
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
