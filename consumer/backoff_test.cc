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

TEST(BackoffTest, ResetStartsFromTheInitialDelayAgain) {
  Backoff b(Policy(1.0));  // no jitter: the delay is the ceiling
  for (int i = 0; i < 5; ++i) b.Next();
  EXPECT_EQ(b.Next(), absl::Milliseconds(3200));
  b.Reset();
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

}  // namespace
}  // namespace handoff::consumer
