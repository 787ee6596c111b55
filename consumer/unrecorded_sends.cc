#include "consumer/unrecorded_sends.h"

#include <algorithm>
#include <utility>

#include "base/status_macros.h"

namespace handoff::consumer {

UnrecordedSends::UnrecordedSends(store::Store* store, std::string source_id)
    : store_(store), source_id_(std::move(source_id)) {}

absl::StatusOr<bool> UnrecordedSends::RegisterIfCurrent(uint64_t read_epoch,
                                                        const std::vector<Position>& positions) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<store::CheckpointRecord> delivery =
      store_->LoadCheckpoint(source_id_, store::Stage::kDelivery);
  if (absl::IsNotFound(delivery.status())) return false;  // rebuilt meanwhile
  RETURN_IF_ERROR(delivery.status());
  if (delivery->outbox_epoch() != read_epoch) return false;
  sent_.insert(positions.begin(), positions.end());
  return true;
}

void UnrecordedSends::Forget(const std::vector<Position>& positions) {
  absl::MutexLock lock(&mu_);
  for (const Position& pos : positions) sent_.erase(pos);
}

absl::StatusOr<std::optional<Position>> UnrecordedSends::CommitUnlessSent(
    const std::vector<Position>& orphans, absl::FunctionRef<void()> commit) {
  absl::MutexLock lock(&mu_);
  std::optional<Position> first;
  if (!orphans.empty()) {
    RETURN_IF_ERROR(store_->ScanStaged(
        store::StagedFamily::kReceipts, source_id_, store::Stage::kDelivery, orphans.front(),
        orphans.back(), [&](Position pos, absl::string_view) {
          if (!std::binary_search(orphans.begin(), orphans.end(), pos)) return true;
          first = pos;
          return false;
        }));
    for (const Position& pos : orphans) {
      if (first.has_value() && !(pos < *first)) break;
      if (sent_.count(pos) > 0) first = pos;
    }
  }
  if (first.has_value()) return first;
  commit();
  return std::nullopt;
}

size_t UnrecordedSends::size() const {
  absl::MutexLock lock(&mu_);
  return sent_.size();
}

}  // namespace handoff::consumer
