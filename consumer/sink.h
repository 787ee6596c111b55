// Sinks: where an event's effect goes beyond the source's derived rows.
//
// Every source materialises its events as rows (the local rows effect), written in the
// same batch as their receipts, so the row effect is exactly-once by construction. A
// source may add one more effect:
//
//  * A TransactionalEffect stages its writes into the same StepBatch as the receipt:
//    exactly-once, like the rows.
//  * An ExternalSink (a downstream handoff.v1.EventSink service) is called with an
//    idempotency key that is stable across retries and restarts, and its answer is
//    recorded only after it is known. Exactly-once holds only if the sink dedupes on
//    the key; Handoff gives at-least-once delivery.
#ifndef HANDOFF_CONSUMER_SINK_H_
#define HANDOFF_CONSUMER_SINK_H_

#include <future>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "handoff/v1/event_sink.pb.h"
#include "handoff/v1/source.pb.h"
#include "store/step_batch.h"

namespace handoff::consumer {

// Adds an effect to the step that records the event's receipt. Called once per
// event commit attempt; the staged writes are durable iff the step commits.
class TransactionalEffect {
 public:
  virtual ~TransactionalEffect() = default;
  virtual absl::Status Stage(absl::string_view source_id, const handoff::v1::EventRow& row,
                             store::StepBatch* step) = 0;
};

// A sink's answer for one event. kTransportError (deadline, unavailable, connection
// loss, a missing answer in a batch) is retried and never recorded as an outcome.
struct SinkAnswer {
  enum class Kind {
    kApplied,
    kAlreadyApplied,
    kIgnored,
    kRetryLater,
    kRejected,
    kNeedsReview,
    kTransportError,
  };
  Kind kind = Kind::kTransportError;
  std::string message;
  std::optional<absl::Duration> retry_after;
};

struct Delivery {
  std::string idempotency_key;
  const handoff::v1::EventRow* row = nullptr;
  handoff::v1::Finality finality = handoff::v1::FINALITY_UNSPECIFIED;
};

class ExternalSink {
 public:
  virtual ~ExternalSink() = default;
  // Delivers `deliveries` (one source, source order) and returns one answer per
  // delivery, in order. Thread-compatible; called by one worker at a time.
  virtual std::vector<SinkAnswer> Deliver(absl::string_view source_id,
                                          absl::Span<const Delivery> deliveries) = 0;
  // Sends `deliveries` as Deliver does but returns as soon as they no longer need their
  // rows (the caller may reuse them then); the answers come through the future, which
  // the caller waits for before its next Send or Deliver, and before destroying the sink
  // (Cancel() makes that wait short). An empty answer means nothing
  // was recorded for them: deliver them again. The default runs Deliver over copies of
  // the rows on a thread of its own.
  virtual std::future<std::vector<SinkAnswer>> Send(absl::string_view source_id,
                                                    absl::Span<const Delivery> deliveries);
  // The most deliveries worth sending in one call (1 without a batch API).
  virtual int max_batch() const = 0;
  // Unblocks a Deliver in progress (answers kTransportError). Any thread.
  virtual void Cancel() = 0;
};

// "<source_id>/<block_hash>/<log_index>": stable across retries, restarts and crashes,
// and different for a reorged event at the same position.
std::string IdempotencyKey(absl::string_view source_id, const handoff::v1::EventRow& row);

// The delivery of `row` (which must outlive it) under its idempotency key.
Delivery MakeDelivery(absl::string_view source_id, const handoff::v1::EventRow& row,
                      handoff::v1::Finality finality);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SINK_H_
