// UnpublishedWrites: how far a gated source's delivery stage may read its outbox.
//
// The delivery gate reads outbox entries up to the published (durable) applied position
// (SourceWorker::DeliveryLoop), which holds only while every entry below that position is
// durable. A page that rewinds the applied position (a correction, or the replacement of
// an abandoned attempt's work) and the pages after it write below the highest applied
// position before they are published, their fsyncs still in flight. The ingest thread
// notes each such step here before it commits (Note); the delivery stage reads strictly
// below the lowest write noted for a page not yet published (Current), and drops a read
// during which a write was noted (Unchanged is false: the generation moved).
//
// Invariant: a delivery read that Unchanged() accepts saw no outbox entry of a page that
// was unpublished when the read ended, except at positions the caller read below the cap.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_UNPUBLISHED_WRITES_H_
#define HANDOFF_CONSUMER_UNPUBLISHED_WRITES_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/position.h"

namespace handoff::consumer {

class UnpublishedWrites {
 public:
  struct Cap {
    uint64_t generation = 0;
    // Read strictly below this position (nullopt: no cap).
    std::optional<Position> below;
  };

  // Ingest, before committing a step of page `page_seq` (increasing) whose lowest outbox
  // write is `low`, at or below the highest applied position so far.
  void Note(uint64_t page_seq, Position low) ABSL_LOCKS_EXCLUDED(mu_);
  // Ingest: page `page_seq` and every page before it are published.
  void Published(uint64_t page_seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Ingest: page `page_seq`'s attempt ended without committing its barrier (a lost race):
  // it left no unsynced write (only a barrier's step is deferred), so its notes go.
  void Discard(uint64_t page_seq) ABSL_LOCKS_EXCLUDED(mu_);

  // Delivery: the cap now, before a read.
  Cap Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Delivery: true if no write was noted since `cap` was taken (after the read).
  bool Unchanged(const Cap& cap) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // (page_seq, lowest write of its steps), by page_seq.
  std::deque<std::pair<uint64_t, Position>> pending_ ABSL_GUARDED_BY(mu_);
};

// The last position strictly below `p`; nullopt for {0, 0}.
std::optional<Position> PositionBefore(Position p);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_UNPUBLISHED_WRITES_H_
