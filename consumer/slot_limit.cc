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
  if (base_ == 0 || median <= base_) {
    base_ = median;
    above_base_at_min_ = 0;
  } else if (limit_ == min_) {
    least_above_base_ = above_base_at_min_ == 0 ? median : std::min(least_above_base_, median);
    if (++above_base_at_min_ >= kRelearnWindows) {
      base_ = least_above_base_;
      above_base_at_min_ = 0;
    }
  } else {
    above_base_at_min_ = 0;
  }
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
