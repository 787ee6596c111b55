#include "consumer/unpublished_writes.h"

#include <algorithm>
#include <limits>

namespace handoff::consumer {

void UnpublishedWrites::Note(uint64_t page_seq, Position low) {
  absl::MutexLock lock(&mu_);
  ++generation_;
  if (!pending_.empty() && pending_.back().first == page_seq) {
    pending_.back().second = std::min(pending_.back().second, low);
  } else {
    pending_.emplace_back(page_seq, low);
  }
}

void UnpublishedWrites::Published(uint64_t page_seq) {
  absl::MutexLock lock(&mu_);
  while (!pending_.empty() && pending_.front().first <= page_seq) pending_.pop_front();
}

void UnpublishedWrites::Discard(uint64_t page_seq) {
  absl::MutexLock lock(&mu_);
  if (!pending_.empty() && pending_.back().first == page_seq) pending_.pop_back();
}

UnpublishedWrites::Cap UnpublishedWrites::Current() const {
  absl::MutexLock lock(&mu_);
  Cap cap;
  cap.generation = generation_;
  for (const auto& [seq, low] : pending_) {
    if (!cap.below.has_value() || low < *cap.below) cap.below = low;
  }
  return cap;
}

bool UnpublishedWrites::Unchanged(const Cap& cap) const {
  absl::MutexLock lock(&mu_);
  return generation_ == cap.generation;
}

std::optional<Position> PositionBefore(Position p) {
  if (p.log_index > 0) return Position{p.block, p.log_index - 1};
  if (p.block == 0) return std::nullopt;
  return Position{p.block - 1, std::numeric_limits<uint64_t>::max()};
}

}  // namespace handoff::consumer
