// WalSyncer: makes writes that were committed without a sync durable in the background,
// so that the writer can prepare its next step while the fsync of this one runs, and
// one fsync covers every such write that completed before it began (a group commit
// across sources).
//
// Each unsynced write that returned OK takes a ticket (Written()); a single thread
// syncs whenever a ticket is newer than the last sync, and Await(ticket) blocks until a
// sync covers it.
//
// Sync pacing (`min_interval`): while nobody waits in Await, a sync begins no sooner
// than `min_interval` after the previous one began, so writes that arrive faster than
// that share a sync instead of each paying one (an fsync took ~0.3 ms of CPU here for
// a 100-event page and ~0.6 ms for a 1000-event one, much of it the virtual disk's
// queue kick and flush; bench/HISTORY.md 109). A
// ticket after a quiet spell is synced at once, and a caller blocked in Await, or the
// destructor, ends the wait at once: pacing only groups writes nobody is waiting for,
// so it delays no caller that waits, and a write's bytes stay unsynced at most
// `min_interval` plus one sync longer than without it.
//
// Invariants kept here:
//  * Await(t) returns OK only after a sync that began after ticket t was taken, i.e.
//    after its write returned (its bytes were handed to the file then), completed OK.
//  * After a failed sync, every ticket not covered by an earlier successful sync fails
//    with that error, for good: nothing waits on a sync whose pages the kernel may have
//    dropped, and nothing is synced again (the caller's store refuses writes by then).
//  * The destructor makes every ticket taken so far durable (one last sync) unless a
//    sync failed, then stops the thread; no Await may run concurrently with it.
//
// Thread-safe.
#ifndef HANDOFF_STORE_WAL_SYNCER_H_
#define HANDOFF_STORE_WAL_SYNCER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace handoff::store {

// Names one unsynced write. 0 means "nothing to wait for".
struct SyncTicket {
  uint64_t value = 0;
};

class WalSyncer {
 public:
  // `sync` makes every write that returned before the call durable (the store's
  // DB::SyncWAL, which it keeps apart from writes: Store::SyncWal).
  // `min_interval` paces the syncs nobody waits for (see above); zero syncs at once.
  explicit WalSyncer(std::function<absl::Status()> sync,
                     absl::Duration min_interval = absl::ZeroDuration());
  ~WalSyncer();
  WalSyncer(const WalSyncer&) = delete;
  WalSyncer& operator=(const WalSyncer&) = delete;

  // Call after an unsynced write returned OK: its ticket. Starts a sync if none runs.
  // Also a read barrier: every write visible to reads now is durable once it is awaited.
  SyncTicket Written() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `ticket` is durable; the failed sync's error otherwise.
  absl::Status Await(SyncTicket ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ticket` is durable now (does not wait).
  bool IsSynced(SyncTicket ticket) const ABSL_LOCKS_EXCLUDED(mu_);
  // Syncs completed OK so far (tests: one sync serves many tickets).
  uint64_t syncs() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<absl::Status()> sync_;
  const absl::Duration min_interval_;

  mutable absl::Mutex mu_;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // the newest ticket
  uint64_t synced_ ABSL_GUARDED_BY(mu_) = 0;   // every ticket up to this one is durable
  uint64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;  // callers blocked in Await
  absl::Time last_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // of a sync

  std::thread thread_;  // last: starts once the fields above are initialised
};

}  // namespace handoff::store

#endif  // HANDOFF_STORE_WAL_SYNCER_H_
