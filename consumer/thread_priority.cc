#include "consumer/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace handoff::consumer {
namespace {

// On Linux, PRIO_PROCESS with a thread id addresses that one thread.
id_t ThisThread() { return static_cast<id_t>(syscall(SYS_gettid)); }

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
  sched_param param{};
  param.sched_priority = 0;
  // pid 0: the calling thread (Linux schedules threads, not processes).
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    return absl::InternalError(absl::StrCat("sched_setscheduler(SCHED_IDLE): ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool CurrentThreadIsIdleScheduled() { return sched_getscheduler(0) == SCHED_IDLE; }

}  // namespace handoff::consumer
