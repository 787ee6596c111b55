// DeferredDeleter: destroys objects on a background thread, so that a hot loop does not
// pay for freeing large object graphs. A 1000-event page is ~10,000 heap blocks (each
// EventRow's strings); freeing it took ~19 % of the ingest thread's CPU (perf, bench
// scenario 1), on the critical path between two commits.
//
// Invariants:
// - At most `max_pending` objects wait. Delete() on a full queue destroys the object
//   inline: the caller pays, and memory stays bounded (max_pending pages per process).
// - Objects are destroyed in the order given, each exactly once; ~DeferredDeleter
//   destroys everything still pending before it returns.
// - A deferred object's destructor must not touch anything the caller may free in the
//   meantime (a PageAttempt's destructor frees its own members only).
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_DEFERRED_DELETER_H_
#define HANDOFF_CONSUMER_DEFERRED_DELETER_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace handoff::consumer {

class DeferredDeleter {
 public:
  // The thread runs `thread_nice` above its creator's nice value (base/thread_priority.h):
  // freeing memory is data-plane work.
  explicit DeferredDeleter(size_t max_pending, int thread_nice = 0);
  ~DeferredDeleter();

  DeferredDeleter(const DeferredDeleter&) = delete;
  DeferredDeleter& operator=(const DeferredDeleter&) = delete;

  template <typename T>
  void Delete(std::unique_ptr<T> object) {
    if (object == nullptr) return;
    Enqueue(std::make_unique<Holder<T>>(std::move(object)));
  }

  // Objects destroyed inline because the queue was full (for tests and metrics).
  size_t inline_deletes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Erased {
    virtual ~Erased() = default;
  };
  template <typename T>
  struct Holder final : Erased {
    explicit Holder(std::unique_ptr<T> p) : object(std::move(p)) {}
    std::unique_ptr<T> object;
  };

  void Enqueue(std::unique_ptr<Erased> object) ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_pending_;
  const int thread_nice_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Erased>> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t inline_deletes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_DEFERRED_DELETER_H_
