#include "consumer/slot_limit.h"

#include <algorithm>

namespace handoff::consumer {

SlotLimit::SlotLimit(size_t min, size_t max)
    : min_(std::max<size_t>(1, min)), max_(std::max(min_, max)), limit_(min_) {}

bool SlotLimit::Record(absl::Duration latency) {
  window_.push_back(std::max<int64_t>(1, absl::ToInt64Nanoseconds(latency)));
  if (window_.size() < std::max(limit_, kMinWindowFetches)) return false;
  auto mid = window_.begin() + window_.size() / 2;
  std::nth_element(window_.begin(), mid, window_.end());
  const int64_t median = *mid;
  window_.clear();
  base_ = limit_ == min_ || base_ == 0 ? median : std::min(base_, median);
  const double queued = static_cast<double>(limit_) *
                        (1.0 - static_cast<double>(base_) / static_cast<double>(median));
  const size_t before = limit_;
  if (queued < kGrowBelow && limit_ < max_) {
    ++limit_;
  } else if (queued > kShrinkAbove && limit_ > min_) {
    --limit_;
  }
  return limit_ != before;
}

}  // namespace handoff::consumer
