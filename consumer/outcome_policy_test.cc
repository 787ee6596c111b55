#include "consumer/outcome_policy.h"

#include "consumer/backoff.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

// A sink's RETRY_LATER may ask for any delay (retry_after_ms is a uint32: ~50 days); the
// source's failure policy bounds it by its own maximum backoff.
TEST(BackoffOf, ASinksRequestedDelayIsBoundedByThePolicysMaximum) {
  handoff::v1::FailurePolicy policy;
  policy.set_initial_backoff_ms(10);
  policy.set_max_backoff_ms(2000);
  Backoff backoff(BackoffOf(policy));
  EXPECT_LE(backoff.Next(absl::Milliseconds(4294967295u)), absl::Milliseconds(2000));
  EXPECT_GE(backoff.Next(absl::Milliseconds(1500)), absl::Milliseconds(1500))
      << "a request within the maximum is honoured";
}

}  // namespace
}  // namespace handoff::consumer
