#include "consumer/row_pool.h"

#include <utility>

#include "consumer/memory_bound.h"

namespace handoff::consumer {

RowPool& RowPool::Default() {
  static RowPool* pool = new RowPool(kPooledRowPages);
  return *pool;
}

std::vector<handoff::v1::EventRow> RowPool::Take() {
  absl::MutexLock lock(&mu_);
  if (held_.empty()) return {};
  std::vector<handoff::v1::EventRow> rows = std::move(held_.back());
  held_.pop_back();
  return rows;
}

void RowPool::Give(std::vector<handoff::v1::EventRow> rows) {
  if (rows.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    if (held_.size() >= max_vectors_) return;  // `rows` is freed on return
  }
  // Fields this build does not know (a row decoded from a newer writer's value) would
  // survive an overwrite of the known ones.
  for (handoff::v1::EventRow& row : rows) {
    if (!row.GetReflection()->GetUnknownFields(row).empty()) row.Clear();
  }
  absl::MutexLock lock(&mu_);
  if (held_.size() < max_vectors_) held_.push_back(std::move(rows));
}

size_t RowPool::held() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

}  // namespace handoff::consumer
