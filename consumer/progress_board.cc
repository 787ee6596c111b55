#include "consumer/progress_board.h"

#include "absl/time/clock.h"

namespace handoff::consumer {

void ProgressBoard::Update(absl::string_view id,
                           const std::function<void(handoff::v1::Progress*)>& mutate) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[id];
  e.progress.set_source_id(std::string(id));
  mutate(&e.progress);
  e.progress.set_updated_unix_ms(absl::ToUnixMillis(absl::Now()));
  e.generation = ++last_generation_;
  if (e.first_generation == 0) e.first_generation = e.generation;
  changed_.SignalAll();
}

std::optional<handoff::v1::Progress> ProgressBoard::Get(absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.progress;
}

void ProgressBoard::Remove(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(id);
  changed_.SignalAll();
}

std::vector<handoff::v1::Progress> ProgressBoard::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<handoff::v1::Progress> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e.progress);
  return out;
}

bool ProgressBoard::AwaitCheckpointVersion(absl::string_view id, uint64_t version,
                                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = entries_.find(id);
    if (closed_ || it == entries_.end()) return false;
    if (it->second.progress.checkpoint().checkpoint_version() >= version) return true;
    if (changed_.WaitWithDeadline(&mu_, deadline)) return false;  // timed out
  }
}

ProgressBoard::WaitResult ProgressBoard::Wait(absl::string_view id, uint64_t* generation,
                                              absl::Time deadline, handoff::v1::Progress* out) {
  absl::MutexLock lock(&mu_);
  bool timed_out = false;
  while (true) {
    if (closed_) return WaitResult::kClosed;
    auto it = entries_.find(id);
    // Gone, or there again since: the watcher's source was removed either way.
    if (it == entries_.end() ||
        (*generation != 0 && *generation < it->second.first_generation)) {
      return WaitResult::kRemoved;
    }
    if (it->second.generation > *generation) {
      *generation = it->second.generation;
      *out = it->second.progress;
      return WaitResult::kChanged;
    }
    if (timed_out) {
      *out = it->second.progress;
      return WaitResult::kTimeout;
    }
    timed_out = changed_.WaitWithDeadline(&mu_, deadline);
  }
}

void ProgressBoard::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  changed_.SignalAll();
}

}  // namespace handoff::consumer
