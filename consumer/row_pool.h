// RowPool: recycles the event rows of finished pages for the parsing of later ones.
//
// A parsed 1000-event page is ~8,000 heap blocks: every EventRow holds its hashes,
// address, topics and data as separate strings. Allocating them while parsing and
// freeing them after the commit was ~20 % of the fetching thread's CPU and most of the
// deleter thread's (perf, bench scenario 1). A recycled EventRow keeps its strings'
// capacity, so a parser that fills recycled rows allocates almost nothing once the pool
// is warm. Rows are not cleared on the way in: clearing touched every string of every
// row once more (~1 MB per 1000-event page, ~6 % of the CPU of an ingest), on a core
// whose memory traffic slows the commit beside it; the one user overwrites them anyway.
//
// Invariants:
//  - Rows handed out by Take() keep the values of their last use, and no unknown
//    fields: whoever fills one sets every field and clears `topics` first (the page
//    parser does: every EventRow field is required on the wire).
//  - At most `max_vectors` vectors are held; Give() on a full pool frees the rows, so
//    the pool's memory is bounded by max_vectors pages of rows.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_ROW_POOL_H_
#define HANDOFF_CONSUMER_ROW_POOL_H_

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

class RowPool {
 public:
  explicit RowPool(size_t max_vectors) : max_vectors_(max_vectors) {}

  // The process-wide pool the page parser and the page procedure share: at most 32
  // pages of rows (~0.8 MB each at 1000 events), held only while no parse wants them.
  // With 64 sources a pool of 64 instead of 8 gave 5-7 % more events/s (bench
  // scenario 2); 32 keeps most of that and bounds the idle memory at ~26 MB.
  static RowPool& Default();

  // Used rows to overwrite (any number, possibly none); see the invariants above.
  std::vector<handoff::v1::EventRow> Take() ABSL_LOCKS_EXCLUDED(mu_);

  // Clears `rows` (on the calling thread) and keeps them if there is room.
  void Give(std::vector<handoff::v1::EventRow> rows) ABSL_LOCKS_EXCLUDED(mu_);

  size_t held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_vectors_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<handoff::v1::EventRow>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_ROW_POOL_H_
