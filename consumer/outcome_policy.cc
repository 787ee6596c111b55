#include "consumer/outcome_policy.h"

#include "absl/strings/str_cat.h"

namespace handoff::consumer {

const char* AnswerName(SinkAnswer::Kind kind) {
  switch (kind) {
    case SinkAnswer::Kind::kApplied:
      return "APPLIED";
    case SinkAnswer::Kind::kAlreadyApplied:
      return "ALREADY_APPLIED";
    case SinkAnswer::Kind::kIgnored:
      return "IGNORED";
    case SinkAnswer::Kind::kRetryLater:
      return "RETRY_LATER";
    case SinkAnswer::Kind::kRejected:
      return "REJECTED";
    case SinkAnswer::Kind::kNeedsReview:
      return "NEEDS_REVIEW";
    case SinkAnswer::Kind::kTransportError:
      return "TRANSPORT_ERROR";
  }
  return "UNKNOWN";
}

handoff::v1::FailurePolicy NormalizedPolicy(const handoff::v1::FailurePolicy& in) {
  handoff::v1::FailurePolicy p = in;
  if (p.max_attempts() == 0) p.set_max_attempts(5);
  if (p.initial_backoff_ms() == 0) p.set_initial_backoff_ms(200);
  if (p.max_backoff_ms() == 0) p.set_max_backoff_ms(30000);
  if (p.max_backoff_ms() < p.initial_backoff_ms()) p.set_max_backoff_ms(p.initial_backoff_ms());
  if (p.on_rejection() == handoff::v1::REJECTION_POLICY_UNSPECIFIED) {
    p.set_on_rejection(handoff::v1::REJECTION_POLICY_HOLD);
  }
  return p;
}

BackoffPolicy BackoffOf(const handoff::v1::FailurePolicy& in) {
  handoff::v1::FailurePolicy p = NormalizedPolicy(in);
  BackoffPolicy b;
  b.initial = absl::Milliseconds(p.initial_backoff_ms());
  b.max = absl::Milliseconds(p.max_backoff_ms());
  // A sink's RETRY_LATER delay is honoured up to the source's own maximum backoff.
  b.max_requested = b.max;
  return b;
}

Decision Classify(const SinkAnswer& answer, uint32_t attempts,
                  const handoff::v1::FailurePolicy& in) {
  const handoff::v1::FailurePolicy policy = NormalizedPolicy(in);
  Decision d;
  d.reason = answer.message.empty() ? AnswerName(answer.kind)
                                    : absl::StrCat(AnswerName(answer.kind), ": ", answer.message);
  switch (answer.kind) {
    case SinkAnswer::Kind::kApplied:
    case SinkAnswer::Kind::kAlreadyApplied:
      d.kind = Decision::Kind::kApplied;
      break;
    case SinkAnswer::Kind::kIgnored:
      d.kind = Decision::Kind::kIgnored;
      break;
    case SinkAnswer::Kind::kRejected:
      d.kind = policy.on_rejection() == handoff::v1::REJECTION_POLICY_QUARANTINE
                   ? Decision::Kind::kQuarantined
                   : Decision::Kind::kReview;
      break;
    case SinkAnswer::Kind::kNeedsReview:
      d.kind = Decision::Kind::kReview;
      break;
    case SinkAnswer::Kind::kRetryLater:
      d.kind = attempts >= policy.max_attempts() ? Decision::Kind::kDeadLetter
                                                 : Decision::Kind::kRetry;
      d.retry_after = answer.retry_after;
      break;
    case SinkAnswer::Kind::kTransportError:
      d.kind = Decision::Kind::kRetry;
      break;
  }
  return d;
}

}  // namespace handoff::consumer
