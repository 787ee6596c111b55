// KeyedMutex: one mutex per key (a source id), so that operations on different keys
// never wait for each other while operations on one key run one at a time.
//
// The admin operations of SourceManagerImpl hold their source's lock across a synced
// store write; under full ingest that write waits behind the other sources' page
// commits (~80 ms measured with 64 sources, bench/HISTORY.md item 38). With one lock for
// all sources those waits added up (64 StartSource calls took 5.25 s); per source, calls
// on different sources overlap and their writes share group commits.
//
// Invariants: a key's mutex exists while some Lock holds or waits for it, and is
// dropped with the last one, so memory stays proportional to the keys in use.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_KEYED_MUTEX_H_
#define HANDOFF_CONSUMER_KEYED_MUTEX_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace handoff::consumer {

class KeyedMutex {
 public:
  KeyedMutex() = default;
  KeyedMutex(const KeyedMutex&) = delete;
  KeyedMutex& operator=(const KeyedMutex&) = delete;

  // Holds the mutex of `key` for its lifetime.
  class Lock {
   public:
    Lock(KeyedMutex* owner, absl::string_view key);
    ~Lock();
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    KeyedMutex* const owner_;
    const std::string key_;
    absl::Mutex* mu_;
  };

  // Keys with a holder or a waiter (tests).
  size_t keys_in_use() const ABSL_LOCKS_EXCLUDED(map_mu_);

 private:
  struct Entry {
    absl::Mutex mu;
    int users = 0;  // holders and waiters
  };

  mutable absl::Mutex map_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(map_mu_);
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_KEYED_MUTEX_H_
