#include "server/admin_call_scheduling.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/thread_name.h"
#include "base/thread_priority.h"

namespace handoff::server {
namespace {

// Whether the calling thread is under SCHED_RR by this class's doing; saves a system
// call per point read on a thread that already is.
thread_local bool thread_is_realtime = false;

void EnterRealtime(int priority) {
  if (!thread_is_realtime && UseRealtimeSchedulingForCurrentThread(priority).ok()) {
    thread_is_realtime = true;
  }
}

}  // namespace

AdminCallScheduling::Scope::Scope(Scope&& other) noexcept
    : restore_priority_(std::exchange(other.restore_priority_, 0)) {}

AdminCallScheduling::Scope::~Scope() {
  if (restore_priority_ > 0) EnterRealtime(restore_priority_);
}

AdminCallScheduling AdminCallScheduling::Create(int realtime_priority) {
  if (realtime_priority == 0) return AdminCallScheduling();
  absl::Status allowed = CheckRealtimeSchedulingAllowed(realtime_priority);
  if (!allowed.ok()) return AdminCallScheduling(0, std::move(allowed));
  return AdminCallScheduling(realtime_priority, absl::OkStatus());
}

std::string AdminCallScheduling::Describe() const {
  return enabled() ? absl::StrCat("SCHED_RR ", priority_) : "normal";
}

AdminCallScheduling::Scope AdminCallScheduling::PointRead() const {
  if (enabled()) EnterRealtime(priority_);
  return Scope(0);
}

AdminCallScheduling::Scope AdminCallScheduling::OtherCall() const {
  if (!enabled()) return Scope(0);
  if (thread_is_realtime && UseNormalSchedulingForCurrentThread().ok()) {
    thread_is_realtime = false;
  }
  return Scope(priority_);
}

absl::StatusOr<int> AdminCallScheduling::RaiseGrpcPollerThreads(
    const std::vector<ThreadInfo>& before, absl::Duration naming_limit) const {
  if (!enabled()) return 0;
  absl::flat_hash_set<pid_t> old_ids;
  for (const ThreadInfo& thread : before) old_ids.insert(thread.id);
  old_ids.insert(CurrentThreadId());  // the caller carries its own name
  const std::string creator_name = CurrentThreadName();
  const absl::Time deadline = absl::Now() + naming_limit;
  std::vector<ThreadInfo> threads = ListThreads();
  auto unnamed = [&] {
    return std::any_of(threads.begin(), threads.end(), [&](const ThreadInfo& t) {
      return t.name == creator_name && !old_ids.contains(t.id);
    });
  };
  while (unnamed() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));  // the new threads have yet to run
    threads = ListThreads();
  }
  int moved = 0;
  for (const ThreadInfo& thread : threads) {
    if (thread.name != kGrpcCallbackThreadName && thread.name != kGrpcSyncServerThreadName) {
      continue;
    }
    absl::Status s = UseRealtimeSchedulingForThread(thread.id, priority_);
    if (absl::IsNotFound(s)) continue;  // it ended since it was listed
    if (!s.ok()) return s;
    ++moved;
  }
  return moved;
}

}  // namespace handoff::server
