// Thread priority of the data plane.
//
// handoffd runs two kinds of work on the same cores: the data plane (workers fetching,
// parsing and committing pages, which use all the CPU they get) and the control plane
// (admin RPCs, health checks, metrics scrapes, which must answer within milliseconds
// while ingest runs at full speed: a Kubernetes probe that times out restarts the pod).
// Raising the data plane's nice value lets the kernel's scheduler run a woken control
// plane thread first; it costs the data plane nothing when the CPU is not contended.
//
// Linux keeps a nice value per thread, and a new thread inherits its creator's, so a
// worker that lowers its own priority also lowers that of the provider threads it
// starts (poll prefetch, SSE reader). Raising a nice value needs no privilege.
#ifndef HANDOFF_CONSUMER_THREAD_PRIORITY_H_
#define HANDOFF_CONSUMER_THREAD_PRIORITY_H_

#include "absl/status/status.h"

namespace handoff::consumer {

// Adds `increment` (0..19) to the calling thread's nice value (capped at 19).
absl::Status LowerCurrentThreadPriority(int increment);

// The calling thread's nice value.
int CurrentThreadNice();

// Moves the calling thread to the SCHED_IDLE policy: it runs only when no normal thread
// of its CPU group wants the core, and a normal thread that wakes up (an admin RPC, a
// health check, a RocksDB flush) preempts it at once, where a nice value only shifts
// shares and the woken thread may wait for the running thread's slice to end. Threads
// it starts inherit the policy. Needs no privilege. The price: while normal threads
// keep the cores busy (an admin flood), the data plane gets almost nothing.
absl::Status UseIdleSchedulingForCurrentThread();

// Whether the calling thread runs under SCHED_IDLE.
bool CurrentThreadIsIdleScheduled();

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_THREAD_PRIORITY_H_
