// ProgressBoard: the latest progress of every source, with a generation per source so
// that watchers (WatchProgress) wait for changes without polling.
//
// Generations come from one counter of the board, so they never repeat, not even for a
// source deleted and created again: each entry remembers the first generation it had,
// and a watcher holding a generation older than that watched an earlier incarnation of
// the id, which was removed (kRemoved), not this one.
//
// Workers publish after each durable step or state change; readers copy snapshots.
// Thread-safe.
#ifndef HANDOFF_CONSUMER_PROGRESS_BOARD_H_
#define HANDOFF_CONSUMER_PROGRESS_BOARD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

class ProgressBoard {
 public:
  // Applies `mutate` to the source's progress (created empty if absent) and bumps its
  // generation.
  void Update(absl::string_view id, const std::function<void(handoff::v1::Progress*)>& mutate)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<handoff::v1::Progress> Get(absl::string_view id) const ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<handoff::v1::Progress> All() const ABSL_LOCKS_EXCLUDED(mu_);

  enum class WaitResult { kChanged, kTimeout, kRemoved, kClosed };
  // Waits until the generation of `id` exceeds `*generation`, the deadline passes, the
  // source is removed or the board is closed. Updates `*generation` and `*out`.
  // `*generation` is 0 for a new watcher, else one this call returned: kRemoved when it
  // is of an entry removed since, also if the id has an entry again.
  WaitResult Wait(absl::string_view id, uint64_t* generation, absl::Time deadline,
                  handoff::v1::Progress* out) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until the published ingest checkpoint of `id` is at `version` or later; false
  // if the deadline passes, the source leaves the board or the board closes first.
  bool AwaitCheckpointVersion(absl::string_view id, uint64_t version, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiter with kClosed (shutdown).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    handoff::v1::Progress progress;
    uint64_t generation = 0;
    // The generation of its first update: older ones are of an entry removed before.
    uint64_t first_generation = 0;
  };
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The last generation given to any entry.
  uint64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PROGRESS_BOARD_H_
