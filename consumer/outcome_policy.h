// OutcomePolicy: the one mapping from a sink's answer to the page procedure's outcome.
//
//   APPLIED, ALREADY_APPLIED  -> applied (durable receipt: terminal)
//   IGNORED                   -> ignored (durable ignore receipt: terminal)
//   REJECTED                  -> quarantined (terminal) or an operator-review hold, as
//                                the source's FailurePolicy.on_rejection says
//   NEEDS_REVIEW              -> operator-review hold (blocks the barrier)
//   RETRY_LATER               -> retrying with backoff (attempts persisted in a hold)
//                                until max_attempts, then a retryable dead-letter hold
//   transport errors          -> retrying with backoff, indefinitely: a sink that is
//                                down is never turned into receipts or dead letters
#ifndef HANDOFF_CONSUMER_OUTCOME_POLICY_H_
#define HANDOFF_CONSUMER_OUTCOME_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "consumer/backoff.h"
#include "consumer/sink.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

struct Decision {
  enum class Kind { kApplied, kIgnored, kQuarantined, kReview, kDeadLetter, kRetry };
  Kind kind = Kind::kRetry;
  std::string reason;
  std::optional<absl::Duration> retry_after;

  bool terminal() const {
    return kind == Kind::kApplied || kind == Kind::kIgnored || kind == Kind::kQuarantined;
  }
};

// `attempts` counts deliveries of this event including the one that produced `answer`.
Decision Classify(const SinkAnswer& answer, uint32_t attempts,
                  const handoff::v1::FailurePolicy& policy);

// The policy with defaults filled in (max_attempts 5, backoff 200 ms .. 30 s, HOLD).
handoff::v1::FailurePolicy NormalizedPolicy(const handoff::v1::FailurePolicy& policy);
BackoffPolicy BackoffOf(const handoff::v1::FailurePolicy& policy);

const char* AnswerName(SinkAnswer::Kind kind);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_OUTCOME_POLICY_H_
