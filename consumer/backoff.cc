#include "consumer/backoff.h"

#include <algorithm>
#include <cmath>

namespace handoff::consumer {

Backoff::Backoff(BackoffPolicy policy, uint64_t /*seed*/) : policy_(policy) {
  if (policy_.initial <= absl::ZeroDuration()) policy_.initial = absl::Milliseconds(1);
  if (policy_.max < policy_.initial) policy_.max = policy_.initial;
  if (policy_.multiplier < 1.0) policy_.multiplier = 1.0;
  policy_.jitter_floor = std::clamp(policy_.jitter_floor, 0.0, 1.0);
  if (policy_.max_requested < policy_.max) policy_.max_requested = policy_.max;
}

absl::Duration Backoff::Ceiling(int failures) const {
  double factor = std::pow(policy_.multiplier, std::min(failures, 62));
  double ms = absl::ToDoubleMilliseconds(policy_.initial) * factor;
  return std::min(policy_.max, absl::Milliseconds(std::min(ms, 1e12)));
}

absl::Duration Backoff::Next(std::optional<absl::Duration> requested) {
  absl::Duration ceiling = Ceiling(failures_);
  ++failures_;
  const double ceiling_ms = absl::ToDoubleMilliseconds(ceiling);
  const double floor_ms = policy_.jitter_floor * ceiling_ms;
  double jittered_ms = ceiling_ms;
  if (floor_ms < ceiling_ms) {
    if (!bitgen_.has_value()) bitgen_.emplace();
    jittered_ms = absl::Uniform<double>(*bitgen_, floor_ms, ceiling_ms);
  }
  absl::Duration d = std::max(absl::Milliseconds(jittered_ms), policy_.initial / 2);
  if (requested.has_value()) d = std::max(d, std::min(*requested, policy_.max_requested));
  return d;
}

absl::Time Backoff::NextDeadline(absl::Time now, std::optional<absl::Duration> requested) {
  return CoalescedDeadline(now, Next(requested), policy_.coalesce);
}

absl::Time CoalescedDeadline(absl::Time now, absl::Duration wait, absl::Duration grid) {
  const absl::Time at = now + wait;
  if (grid <= absl::ZeroDuration() || wait < 4 * grid) return at;
  const absl::Duration since_epoch = at - absl::UnixEpoch();
  const absl::Duration past_grid = since_epoch % grid;  // in [0, grid) after the epoch
  return past_grid == absl::ZeroDuration() ? at : at + (grid - past_grid);
}

}  // namespace handoff::consumer
