#include "base/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace handoff {
namespace {

// On Linux, PRIO_PROCESS with a thread id addresses that one thread.
id_t ThisThread() { return static_cast<id_t>(syscall(SYS_gettid)); }

// Sets the calling thread's policy (pid 0: the calling thread; Linux schedules threads,
// not processes). EPERM is PERMISSION_DENIED.
absl::Status SetCurrentThreadPolicy(int policy, int priority, absl::string_view name) {
  sched_param param{};
  param.sched_priority = priority;
  if (sched_setscheduler(0, policy, &param) != 0) {
    const int error = errno;
    const std::string what =
        absl::StrCat("sched_setscheduler(", name, "): ", std::strerror(error));
    return error == EPERM ? absl::PermissionDeniedError(what) : absl::InternalError(what);
  }
  return absl::OkStatus();
}

// The calling thread's policy, without the SCHED_RESET_ON_FORK flag.
int CurrentThreadPolicy() { return sched_getscheduler(0) & ~SCHED_RESET_ON_FORK; }

}  // namespace

int CurrentThreadNice() {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, ThisThread());
  return errno == 0 ? nice : 0;
}

absl::Status LowerCurrentThreadPriority(int increment) {
  if (increment < 0 || increment > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("nice increment ", increment, " is outside 0..19"));
  }
  if (increment == 0) return absl::OkStatus();
  const int target = std::min(19, CurrentThreadNice() + increment);
  if (setpriority(PRIO_PROCESS, ThisThread(), target) != 0) {
    return absl::InternalError(absl::StrCat("setpriority(", target, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status UseIdleSchedulingForCurrentThread() {
  return SetCurrentThreadPolicy(SCHED_IDLE, 0, "SCHED_IDLE");
}

bool CurrentThreadIsIdleScheduled() { return CurrentThreadPolicy() == SCHED_IDLE; }

absl::Status UseRealtimeSchedulingForCurrentThread(int priority) {
  if (priority < kMinRealtimePriority || priority > kMaxRealtimePriority) {
    return absl::InvalidArgumentError(absl::StrCat("real-time priority ", priority,
                                                   " is outside ", kMinRealtimePriority,
                                                   "..", kMaxRealtimePriority));
  }
  absl::Status status = SetCurrentThreadPolicy(SCHED_RR | SCHED_RESET_ON_FORK, priority,
                                               absl::StrCat("SCHED_RR, ", priority));
  if (absl::IsPermissionDenied(status)) {
    return absl::PermissionDeniedError(absl::StrCat(
        status.message(), " (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= ", priority, ")"));
  }
  return status;
}

absl::Status UseNormalSchedulingForCurrentThread() {
  return SetCurrentThreadPolicy(SCHED_OTHER, 0, "SCHED_OTHER");
}

bool CurrentThreadIsRealtimeScheduled() { return CurrentThreadPolicy() == SCHED_RR; }

absl::Status CheckRealtimeSchedulingAllowed(int priority) {
  absl::Status status;
  std::thread probe([&] { status = UseRealtimeSchedulingForCurrentThread(priority); });
  probe.join();
  return status;
}

}  // namespace handoff
