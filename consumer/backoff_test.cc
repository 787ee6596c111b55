#include "consumer/backoff.h"

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

BackoffPolicy Policy(double jitter_floor) {
  BackoffPolicy p;
  p.initial = absl::Milliseconds(100);
  p.max = absl::Seconds(10);
  p.multiplier = 2.0;
  p.jitter_floor = jitter_floor;
  return p;
}

TEST(BackoffTest, CeilingGrowsGeometricallyUpToTheCap) {
  Backoff b(Policy(0));
  EXPECT_EQ(b.Ceiling(0), absl::Milliseconds(100));
  EXPECT_EQ(b.Ceiling(3), absl::Milliseconds(800));
  EXPECT_EQ(b.Ceiling(7), absl::Seconds(10));
  EXPECT_EQ(b.Ceiling(1000), absl::Seconds(10));
}

TEST(BackoffTest, FullJitterStaysWithinHalfTheInitialAndTheCeiling) {
  Backoff b(Policy(0));
  absl::Duration lowest = absl::InfiniteDuration();
  for (int i = 0; i < 200; ++i) {
    const absl::Duration ceiling = b.Ceiling(b.failures());
    const absl::Duration d = b.Next();
    EXPECT_GE(d, absl::Milliseconds(50)) << i;
    EXPECT_LE(d, ceiling) << i;
    if (i >= 10) lowest = std::min(lowest, d);
  }
  // Full jitter reaches far below the cap (200 draws at the 10 s cap).
  EXPECT_LT(lowest, absl::Seconds(2));
}

TEST(BackoffTest, EqualJitterNeverWaitsLessThanHalfTheCeiling) {
  Backoff b(Policy(0.5));
  for (int i = 0; i < 200; ++i) {
    const absl::Duration ceiling = b.Ceiling(b.failures());
    const absl::Duration d = b.Next();
    EXPECT_GE(d, ceiling / 2) << i;
    EXPECT_LE(d, ceiling) << i;
  }
}

TEST(BackoffTest, ARequestedDelayIsAFloor) {
  Backoff b(Policy(0));
  EXPECT_GE(b.Next(absl::Seconds(30)), absl::Seconds(30));
}

// A provider's retry_after or Retry-After, or a sink's retry_after_ms, may ask for any
// delay (2^32-1 ms is ~50 days); honoured whole, it would park a source's ingest or an
// event that long while the source reports nothing wrong. Asking again earlier costs
// at most one more refusal, so a request is honoured up to an hour.
TEST(BackoffTest, ARequestedDelayIsHonouredUpToAnHour) {
  Backoff b(Policy(0));
  EXPECT_EQ(kMaxRequestedDelay, absl::Hours(1));
  EXPECT_EQ(b.Next(absl::Milliseconds(4294967295)), absl::Hours(1));
  EXPECT_EQ(b.Next(absl::Seconds(999999999)), absl::Hours(1));
  EXPECT_EQ(b.Next(absl::InfiniteDuration()), absl::Hours(1));
  EXPECT_EQ(b.Next(absl::Hours(1)), absl::Hours(1));
  const absl::Duration d = b.Next(absl::Minutes(59));
  EXPECT_GE(d, absl::Minutes(59));
  EXPECT_LE(d, absl::Hours(1));
}

TEST(BackoffTest, TheBoundOfRequestsIsNeverBelowThePolicysMax) {
  BackoffPolicy p = Policy(1.0);
  p.max = absl::Hours(2);
  Backoff b(p);
  EXPECT_EQ(b.Next(absl::Hours(24)), absl::Hours(2));
}

TEST(BackoffTest, ARequestBoundedByThePolicysMax) {
  BackoffPolicy p = Policy(0);  // max 10 s
  p.max_requested = p.max;
  Backoff b(p);
  EXPECT_EQ(b.Next(absl::Milliseconds(4294967295)), absl::Seconds(10));
  EXPECT_EQ(b.Next(absl::Seconds(7)), absl::Seconds(7));  // under the bound: a floor
}

TEST(BackoffTest, ResetStartsFromTheInitialDelayAgain) {
  Backoff b(Policy(1.0));  // no jitter: the delay is the ceiling
  for (int i = 0; i < 5; ++i) b.Next();
  EXPECT_EQ(b.Next(), absl::Milliseconds(3200));
  b.Reset();
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

TEST(BackoffTest, LongWaitsEndOnTheCoalescingGrid) {
  const absl::Duration grid = absl::Milliseconds(250);
  // An instant between grid points, as a clock would give.
  const absl::Time now = absl::FromUnixNanos(1'764'500'000'123'456'789);
  for (absl::Duration wait : {absl::Seconds(1), absl::Milliseconds(2777), absl::Seconds(30)}) {
    const absl::Time at = CoalescedDeadline(now, wait, grid);
    EXPECT_GE(at, now + wait) << wait;
    EXPECT_LT(at, now + wait + grid) << wait;
    EXPECT_EQ((at - absl::UnixEpoch()) % grid, absl::ZeroDuration()) << wait;
  }
  // Two sources whose waits end within one grid step wake together.
  EXPECT_EQ(CoalescedDeadline(now, absl::Milliseconds(20'010), grid),
            CoalescedDeadline(now, absl::Milliseconds(20'100), grid));
}

TEST(BackoffTest, ShortWaitsAndAZeroGridAreNotCoalesced) {
  const absl::Time now = absl::FromUnixNanos(1'764'500'000'123'456'789);
  EXPECT_EQ(CoalescedDeadline(now, absl::Milliseconds(999), absl::Milliseconds(250)),
            now + absl::Milliseconds(999));
  EXPECT_EQ(CoalescedDeadline(now, absl::Seconds(20), absl::ZeroDuration()),
            now + absl::Seconds(20));
  // A deadline already on the grid stays where it is.
  const absl::Time on_grid = absl::FromUnixSeconds(1'764'500'000);
  EXPECT_EQ(CoalescedDeadline(on_grid - absl::Seconds(5), absl::Seconds(5),
                              absl::Milliseconds(250)),
            on_grid);
}

TEST(BackoffTest, NextDeadlineCoalescesThePolicysWait) {
  BackoffPolicy p = Policy(1.0);  // no jitter: 100 ms, 200 ms, ... up to 10 s
  p.coalesce = absl::Milliseconds(250);
  Backoff b(p);
  const absl::Time now = absl::FromUnixNanos(1'764'500'000'123'456'789);
  // 100 ms is shorter than four grid steps: exact.
  EXPECT_EQ(b.NextDeadline(now), now + absl::Milliseconds(100));
  for (int i = 0; i < 4; ++i) b.Next();  // 200, 400, 800, 1600 ms
  const absl::Time at = b.NextDeadline(now);  // 3.2 s: on the grid
  EXPECT_GE(at, now + absl::Milliseconds(3200));
  EXPECT_LT(at, now + absl::Milliseconds(3450));
  EXPECT_EQ((at - absl::UnixEpoch()) % p.coalesce, absl::ZeroDuration());
}

}  // namespace
}  // namespace handoff::consumer
