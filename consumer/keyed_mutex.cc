#include "consumer/keyed_mutex.h"

namespace handoff::consumer {

KeyedMutex::Lock::Lock(KeyedMutex* owner, absl::string_view key) : owner_(owner), key_(key) {
  {
    absl::MutexLock lock(&owner_->map_mu_);
    std::unique_ptr<Entry>& entry = owner_->entries_[key_];
    if (entry == nullptr) entry = std::make_unique<Entry>();
    ++entry->users;
    mu_ = &entry->mu;  // stable: the entry lives while users > 0
  }
  mu_->Lock();
}

KeyedMutex::Lock::~Lock() {
  mu_->Unlock();
  absl::MutexLock lock(&owner_->map_mu_);
  auto it = owner_->entries_.find(key_);
  if (--it->second->users == 0) owner_->entries_.erase(it);
}

size_t KeyedMutex::keys_in_use() const {
  absl::MutexLock lock(&map_mu_);
  return entries_.size();
}

}  // namespace handoff::consumer
