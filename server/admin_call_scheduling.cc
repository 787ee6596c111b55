#include "server/admin_call_scheduling.h"

#include "absl/strings/str_cat.h"
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

}  // namespace handoff::server
