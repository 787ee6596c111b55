// Thread priority: the data plane yields, the control plane answers at once.
//
// handoffd runs two kinds of work on the same cores: the data plane (workers fetching,
// parsing and committing pages, which use all the CPU they get) and the control plane
// (admin RPCs, health checks, metrics scrapes, which must answer within milliseconds
// while ingest runs at full speed: a Kubernetes probe that times out restarts the pod).
//
// Data plane. Raising the workers' nice value shifts CPU shares to everything else; it
// costs them nothing when the CPU is not contended and needs no privilege. SCHED_IDLE
// goes further (a woken normal thread preempts them at once) at the price of starving
// them while normal threads keep the cores busy.
//
// Control plane. Nice values only shift shares: a woken admin thread may still wait for
// a running worker's slice to end, and on two saturated cores that wait is the admin
// tail. A thread under SCHED_RR runs as soon as it wakes, before any normal thread.
// Using it needs CAP_SYS_NICE (or an RLIMIT_RTPRIO of at least the priority), and it
// must only ever cover short work: a real-time thread that keeps a core busy takes it
// from every normal thread, up to the kernel's real-time throttle (95 % by default).
// UseRealtimeSchedulingForCurrentThread therefore sets SCHED_RESET_ON_FORK as well: a
// thread started by a real-time thread begins under the normal policy, so no worker
// started by an admin call inherits it.
//
// Linux keeps a nice value and a policy per thread, and a new thread inherits its
// creator's (except as above), so a worker that lowers its own priority also lowers
// that of the provider threads it starts (poll prefetch, SSE reader).
#ifndef HANDOFF_BASE_THREAD_PRIORITY_H_
#define HANDOFF_BASE_THREAD_PRIORITY_H_

#include <sys/types.h>

#include "absl/status/status.h"

namespace handoff {

// ---- Data plane ----

// Adds `increment` (0..19) to the calling thread's nice value (capped at 19).
absl::Status LowerCurrentThreadPriority(int increment);

// The calling thread's nice value.
int CurrentThreadNice();

// Moves the calling thread to the SCHED_IDLE policy: it runs only when no normal thread
// of its CPU group wants the core, and a normal thread that wakes up (an admin RPC, a
// health check, a RocksDB flush) preempts it at once. Threads it starts inherit the
// policy. Needs no privilege.
absl::Status UseIdleSchedulingForCurrentThread();

// Whether the calling thread runs under SCHED_IDLE.
bool CurrentThreadIsIdleScheduled();

// ---- Control plane ----

// The real-time priorities SCHED_RR accepts.
inline constexpr int kMinRealtimePriority = 1;
inline constexpr int kMaxRealtimePriority = 99;

// Moves the calling thread to SCHED_RR at `priority` (kMinRealtimePriority..
// kMaxRealtimePriority), with SCHED_RESET_ON_FORK. PERMISSION_DENIED without
// CAP_SYS_NICE or a high enough RLIMIT_RTPRIO; INVALID_ARGUMENT outside the range.
absl::Status UseRealtimeSchedulingForCurrentThread(int priority);

// The same for thread `tid` of this process (a kernel thread id: base/thread_name.h), for
// threads a library starts and Handoff cannot run code on. NOT_FOUND when it has ended.
absl::Status UseRealtimeSchedulingForThread(pid_t tid, int priority);

// Moves the calling thread back to the normal policy (SCHED_OTHER); its nice value is
// kept. Always permitted.
absl::Status UseNormalSchedulingForCurrentThread();

// Whether the calling thread, or thread `tid` of this process, runs under SCHED_RR.
bool CurrentThreadIsRealtimeScheduled();
bool ThreadIsRealtimeScheduled(pid_t tid);

// Whether this process may run threads under SCHED_RR at `priority`: tried on a
// short-lived thread, so no thread of the caller changes. OK, or why not.
absl::Status CheckRealtimeSchedulingAllowed(int priority);

}  // namespace handoff

#endif  // HANDOFF_BASE_THREAD_PRIORITY_H_
