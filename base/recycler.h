// Recycler<T>: objects given back for reuse, handed out again newest first.
//
// The pools of the ingest and delivery paths share this shape: a connection, or a message
// whose fields keep their memory, is worth keeping for the next user instead of being
// made again, but only a bounded number of them (CurlSessionPool,
// BatchCallPool).
//
// Invariants:
//  - At most `max_held` objects are held; giving one more frees the oldest held (0: none
//    is kept). So the recycler's memory is bounded by max_held objects at their largest.
//  - An object is handed out at most once: Take() removes it.
//  - Objects are freed outside the lock.
//
// Thread-safe.
#ifndef HANDOFF_BASE_RECYCLER_H_
#define HANDOFF_BASE_RECYCLER_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace handoff {

template <typename T>
class Recycler {
 public:
  explicit Recycler(size_t max_held) : max_held_(max_held) {}

  Recycler(const Recycler&) = delete;
  Recycler& operator=(const Recycler&) = delete;

  // The most recently given object, or null when none is held.
  std::unique_ptr<T> Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (held_.empty()) return nullptr;
    std::unique_ptr<T> object = std::move(held_.back());
    held_.pop_back();
    return object;
  }

  // Keeps `object` (null is ignored); beyond max_held the oldest held is freed.
  void Give(std::unique_ptr<T> object) ABSL_LOCKS_EXCLUDED(mu_) {
    if (object == nullptr) return;
    std::unique_ptr<T> evicted;  // freed after the lock is released
    absl::MutexLock lock(&mu_);
    if (max_held_ == 0) {
      evicted = std::move(object);
      return;
    }
    if (held_.size() >= max_held_) {
      evicted = std::move(held_.front());
      held_.erase(held_.begin());
    }
    held_.push_back(std::move(object));
  }

  size_t held() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  const size_t max_held_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<T>> held_ ABSL_GUARDED_BY(mu_);  // back = newest
};

}  // namespace handoff

#endif  // HANDOFF_BASE_RECYCLER_H_
