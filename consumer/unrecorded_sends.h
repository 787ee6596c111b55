// UnrecordedSends: what a FINALIZED source's sink may have applied that no durable record
// shows yet, the events its delivery stage sent whose answers no committed step has
// recorded, so that an ingest correction that would replace one of them halts as it does
// for a recorded delivery ("finalized blocks never reorg": it breaks the provider
// contract, and the sink would be sent both forks' events at one position).
//
// Invariant: an ingest correction and a delivery never miss each other. The correction
// checks the sent and the recorded events and commits holding this object's lock
// (CommitUnlessSent); the delivery stage registers a call under the same lock, before
// it goes out, only while the delivery checkpoint's outbox epoch is still the one its
// rows were read at (RegisterIfCurrent: a correction that deletes outbox entries fences
// the stage, which moves the epoch, in its own commit). So either the registration comes
// first and the correction sees it, or the correction commits first and the call, whose
// rows it may have replaced, is not sent.
//
// Limit: the registry lives in memory, with the worker. After a crash, an event that was
// sent and answered but not recorded is unknown until the delivery stage sends it again.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_UNRECORDED_SENDS_H_
#define HANDOFF_CONSUMER_UNRECORDED_SENDS_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/position.h"
#include "store/store.h"

namespace handoff::consumer {

class UnrecordedSends {
 public:
  // `store` must outlive this object.
  UnrecordedSends(store::Store* store, std::string source_id);

  UnrecordedSends(const UnrecordedSends&) = delete;
  UnrecordedSends& operator=(const UnrecordedSends&) = delete;

  // Delivery stage, before a sink call: registers `positions` as sent if the stored
  // delivery checkpoint's outbox epoch is still `read_epoch`, the epoch at which the
  // call's rows were read. False (nothing registered) when a correction has fenced the
  // stage since: the call must not go out.
  absl::StatusOr<bool> RegisterIfCurrent(uint64_t read_epoch,
                                         const std::vector<Position>& positions)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Delivery stage: a committed step recorded the sink's answers at `positions`.
  void Forget(const std::vector<Position>& positions) ABSL_LOCKS_EXCLUDED(mu_);

  // Ingest stage, for a step that deletes `orphans` (sorted): the first of them that has
  // a recorded delivery or is registered as sent, and then `commit` is not run;
  // otherwise runs `commit` under the lock and returns nullopt.
  absl::StatusOr<std::optional<Position>> CommitUnlessSent(const std::vector<Position>& orphans,
                                                           absl::FunctionRef<void()> commit)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The number of positions registered (tests).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  store::Store* const store_;
  const std::string source_id_;
  mutable absl::Mutex mu_;
  std::set<Position> sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_UNRECORDED_SENDS_H_
