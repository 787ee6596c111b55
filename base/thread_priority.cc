#include "base/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/thread_name.h"

namespace handoff {
namespace {

// Sets thread `tid`'s policy (0: the calling thread; Linux schedules threads, not
// processes). EPERM is PERMISSION_DENIED, ESRCH (the thread ended) NOT_FOUND.
absl::Status SetThreadPolicy(pid_t tid, int policy, int priority, absl::string_view name) {
  sched_param param{};
  param.sched_priority = priority;
  if (sched_setscheduler(tid, policy, &param) != 0) {
    const int error = errno;
    const std::string target = tid == 0 ? "" : absl::StrCat("thread ", tid, ", ");
    const std::string what =
        absl::StrCat("sched_setscheduler(", target, name, "): ", std::strerror(error));
    if (error == EPERM) return absl::PermissionDeniedError(what);
    return error == ESRCH ? absl::NotFoundError(what) : absl::InternalError(what);
  }
  return absl::OkStatus();
}

// Thread `tid`'s policy (0: the calling thread), without the SCHED_RESET_ON_FORK flag.
int ThreadPolicy(pid_t tid) { return sched_getscheduler(tid) & ~SCHED_RESET_ON_FORK; }

}  // namespace

// On Linux, PRIO_PROCESS with a thread id addresses that one thread.
int CurrentThreadNice() {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, CurrentThreadId());
  return errno == 0 ? nice : 0;
}

absl::Status LowerCurrentThreadPriority(int increment) {
  if (increment < 0 || increment > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("nice increment ", increment, " is outside 0..19"));
  }
  if (increment == 0) return absl::OkStatus();
  const int target = std::min(19, CurrentThreadNice() + increment);
  if (setpriority(PRIO_PROCESS, CurrentThreadId(), target) != 0) {
    return absl::InternalError(absl::StrCat("setpriority(", target, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status UseIdleSchedulingForCurrentThread() {
  return SetThreadPolicy(0, SCHED_IDLE, 0, "SCHED_IDLE");
}

bool CurrentThreadIsIdleScheduled() { return ThreadPolicy(0) == SCHED_IDLE; }

absl::Status UseRealtimeSchedulingForThread(pid_t tid, int priority) {
  if (priority < kMinRealtimePriority || priority > kMaxRealtimePriority) {
    return absl::InvalidArgumentError(absl::StrCat("real-time priority ", priority,
                                                   " is outside ", kMinRealtimePriority,
                                                   "..", kMaxRealtimePriority));
  }
  absl::Status status = SetThreadPolicy(tid, SCHED_RR | SCHED_RESET_ON_FORK, priority,
                                        absl::StrCat("SCHED_RR, ", priority));
  if (absl::IsPermissionDenied(status)) {
    return absl::PermissionDeniedError(absl::StrCat(
        status.message(), " (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= ", priority, ")"));
  }
  return status;
}

absl::Status UseRealtimeSchedulingForCurrentThread(int priority) {
  return UseRealtimeSchedulingForThread(0, priority);
}

absl::Status UseNormalSchedulingForCurrentThread() {
  return SetThreadPolicy(0, SCHED_OTHER, 0, "SCHED_OTHER");
}

bool ThreadIsRealtimeScheduled(pid_t tid) { return ThreadPolicy(tid) == SCHED_RR; }

bool CurrentThreadIsRealtimeScheduled() { return ThreadIsRealtimeScheduled(0); }

absl::Status CheckRealtimeSchedulingAllowed(int priority) {
  absl::Status status;
  std::thread probe([&] { status = UseRealtimeSchedulingForCurrentThread(priority); });
  probe.join();
  return status;
}

}  // namespace handoff
