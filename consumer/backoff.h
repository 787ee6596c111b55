// The one retry/backoff policy of Handoff: capped exponential backoff with full jitter.
//
// Used for every wait the project makes: provider refusals without a retry_after,
// non-advancing cursors, sink RETRY_LATER without a delay, storage-free retries.
// A delay the other side asked for (retry_after, Retry-After, SSE retry, a sink's delay)
// is honoured as a floor, up to a bound: the wait is
// max(min(requested, max_requested), jittered backoff).
//
// Thread-compatible.
#ifndef HANDOFF_CONSUMER_BACKOFF_H_
#define HANDOFF_CONSUMER_BACKOFF_H_

#include <cstdint>
#include <optional>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace handoff::consumer {

// The longest wait a requested delay imposes unless the policy's own max is longer
// (BackoffPolicy::max_requested). The other side may ask for anything: a provider's
// `retry_after: 999999999` or a sink's retry_after_ms of 2^32-1 (~50 days) would park
// ingest or an event that long while the source looks healthy. Asking again sooner than
// asked costs one more refused request.
inline constexpr absl::Duration kMaxRequestedDelay = absl::Hours(1);

struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(200);
  absl::Duration max = absl::Seconds(30);
  double multiplier = 2.0;
  // The delay is uniform in [jitter_floor * ceiling, ceiling]. 0 is full jitter: retries
  // after a failure spread out as widely as possible. 0.5 ("equal jitter") suits a
  // steady wait such as polling at the head: never much sooner than the ceiling.
  double jitter_floor = 0.0;
  // Timer coalescing for NextDeadline: the deadline of a wait at least 4 * coalesce long
  // is rounded up to a multiple of `coalesce` on the clock (since the Unix epoch), so
  // the long waits of many sources in a process end together and one wake-up of the
  // machine serves a burst of them. What it saves: a caught-up poll cost ~350 us of CPU
  // when polls came one at a time 20 ms apart, ~105 us in bursts of 11 every 250 ms
  // (idle_poll_bench; back to back ~60-90 us): the rest is waking an idle machine.
  // A wait grows by less than `coalesce`, so by at most a quarter; shorter waits are
  // left as they are. Zero: off.
  absl::Duration coalesce = absl::ZeroDuration();
  // A requested delay longer than this is cut to it (kMaxRequestedDelay). Never below
  // `max` (raised to it): a request is honoured at least as far as the policy's own
  // waits reach. Set it to `max` to bound requests by the policy itself.
  absl::Duration max_requested = kMaxRequestedDelay;
};

// now + wait, rounded up to a multiple of `grid` since the Unix epoch when
// wait >= 4 * grid (BackoffPolicy::coalesce); now + wait otherwise or when grid is zero.
absl::Time CoalescedDeadline(absl::Time now, absl::Duration wait, absl::Duration grid);

class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy, uint64_t seed = 0);

  // The delay before the next attempt: uniform in [jitter_floor * c, c] with
  // c = min(max, initial * mult^n) and
  // n the number of consecutive failures so far, but never below `requested` (cut to
  // max_requested) nor below initial / 2 (so a tight loop is impossible).
  absl::Duration Next(std::optional<absl::Duration> requested = std::nullopt);

  // now + Next(requested), coalesced (BackoffPolicy::coalesce).
  absl::Time NextDeadline(absl::Time now,
                          std::optional<absl::Duration> requested = std::nullopt);

  // A success: the next failure starts from `initial` again.
  void Reset() { failures_ = 0; }

  int failures() const { return failures_; }

  // The un-jittered cap for the attempt number `failures` (exposed for tests).
  absl::Duration Ceiling(int failures) const;

 private:
  BackoffPolicy policy_;
  int failures_ = 0;
  // Seeded at the first jittered wait: seeding reads the process's entropy pool, and
  // most backoffs (one per page attempt) never wait.
  std::optional<absl::BitGen> bitgen_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_BACKOFF_H_
