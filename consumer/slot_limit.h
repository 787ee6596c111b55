// SlotLimit: how many of the PageBudget's slots may be held at once, adapted to what
// the fetches made under them show (TCP Vegas's congestion rule, applied to pages).
//
// The budget's slot count caps page memory. How many pages should be in flight below
// that cap depends on where the time of a fetch goes. A provider far away makes a fetch
// wait on the network: more pages in flight mean more pages a second, at the same
// latency each. A provider on the same machine, or a process whose cores are busy,
// makes the fetches share the CPU: more pages in flight mean the same pages a second,
// each taking longer, and a larger working set (64 sources on 2 vCPUs with 8 slots spent
// 12-16% more CPU per event than with 3; bench/HISTORY.md item 116).
//
// Vegas tells the two apart by latency. Each window of `limit` fetches (at least
// kMinWindowFetches) gives a median latency. The base is a fetch's latency with as
// little queued ahead of it as the limit allows: the first window's median (taken at
// the minimum limit, where it starts), lowered by any smaller median since. Little's law
// then estimates the pages queued behind the work, `limit * (1 - base / median)`: below
// kGrowBelow the limit grows by one (more in flight still means more done), above
// kShrinkAbove it shrinks by one. A base rises only once kRelearnWindows windows in a
// row at the minimum limit all measured more (a provider moved farther away for good:
// the limit came down to its minimum reading the longer fetches as queueing), to the
// least of them. Raised from one window at the minimum instead, a noisy sample made
// "nothing queued" of the next windows, and 64 sources sharing two vCPUs swung between
// 3 and 8 slots every few tens of ms (bench/HISTORY.md 121).
//
// Invariant: min <= limit() <= max, at every moment; each update moves it by at most 1.
//
// Not thread-safe: the PageBudget calls it under its lock.
#ifndef HANDOFF_CONSUMER_SLOT_LIMIT_H_
#define HANDOFF_CONSUMER_SLOT_LIMIT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace handoff::consumer {

class SlotLimit {
 public:
  // Fetches a window needs at least, whatever the limit (a median of fewer is noise).
  static constexpr size_t kMinWindowFetches = 6;
  // Windows in a row at the minimum limit, each measuring more than the base, that
  // raise it.
  static constexpr int kRelearnWindows = 3;
  // Estimated pages queued (Vegas's alpha and beta).
  static constexpr double kGrowBelow = 1.0;
  static constexpr double kShrinkAbove = 2.0;

  // REQUIRES: 1 <= min <= max.
  SlotLimit(size_t min, size_t max);

  size_t limit() const { return limit_; }
  size_t min() const { return min_; }
  size_t max() const { return max_; }

  // One fetch made under a slot, from its request to its page parsed. Returns true when
  // the limit changed.
  bool Record(absl::Duration latency);

 private:
  const size_t min_;
  const size_t max_;
  size_t limit_;
  std::vector<int64_t> window_;  // latencies (ns) since the last update
  int64_t base_ = 0;             // ns; 0 until the first window
  // Windows in a row at the minimum that measured more than the base, and the least of
  // their medians.
  int above_base_at_min_ = 0;
  int64_t least_above_base_ = 0;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SLOT_LIMIT_H_
