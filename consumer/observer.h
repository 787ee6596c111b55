// EngineObserver: hooks through which the engine reports events worth counting
// (metrics, logs) without knowing about Prometheus or log formats.
//
// Callbacks run on worker threads and must be cheap and thread-safe.
#ifndef HANDOFF_CONSUMER_OBSERVER_H_
#define HANDOFF_CONSUMER_OBSERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A durable step committed `events` events in `latency` (write + sync).
  virtual void OnCommit(absl::string_view source_id, int events, absl::Duration latency) {}
  // A page barrier promoted the cursor.
  virtual void OnPageCommitted(absl::string_view source_id) {}
  // The provider refused a fetch (`code` is the provider's code, or "network",
  // "malformed_page", ...).
  virtual void OnRefusal(absl::string_view source_id, absl::string_view code) {}
  // A retry is scheduled (fetch or delivery).
  virtual void OnRetry(absl::string_view source_id) {}
  // A correction page replaced committed events `depth` blocks deep; called once its
  // step is durable (Progress.counters.corrections counts the same pages).
  virtual void OnCorrection(absl::string_view source_id, uint64_t depth) {}
  // The worker changed state.
  virtual void OnStateChange(absl::string_view source_id, handoff::v1::SourceState state,
                             absl::string_view reason) {}
  // An error worth logging (never contains a secret).
  virtual void OnError(absl::string_view source_id, const absl::Status& status) {}
  // The source was deleted: called by DeleteSource once the deletion is durable, while no
  // worker of the source runs and before a source of the same id can be created again
  // (so no other callback for `source_id` runs meanwhile). An observer keeping state per
  // source drops it here (metrics: the source's series), so that a source re-created
  // under the same id starts fresh. Not called by RebuildSource (the source stays).
  virtual void OnSourceDeleted(absl::string_view source_id) {}
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_OBSERVER_H_
