// AdminCallScheduling: the scheduling policy of the gRPC threads that answer admin calls.
//
// Under full ingest the workers keep every core busy. A sync-server thread woken by an
// admin request, at normal priority, waits for a running worker's slice to end before
// it runs, and on two cores that wait made GetProgress's p99 2-3 ms while its handler
// takes 0.2 ms (bench/HISTORY.md 73, 76). When enabled, a gRPC thread that has answered
// an admin call waits for its next one under SCHED_RR (base/thread_priority.h), so a
// request runs as soon as it arrives.
//
// What runs real-time is kept short, because a real-time thread takes its core from
// every worker for as long as it runs:
//   - a point read (one source's progress, one source, one hold: a key or two, tens of
//     microseconds) runs its handler real-time;
//   - every other call (writes that wait for a sync, lists, scans, rebuilds, streams)
//     runs its handler under the normal policy and goes back to SCHED_RR when it ends.
// A request is not always read by the thread that answers it, though. gRPC's epoll1
// engine has one epoll set per process, and any thread waiting on a completion queue may
// be the one woken to read the next request and hand it on: a sync-server thread of
// either server (the admin port's, the health port's), or one of gRPC's callback threads
// ("nexting_thread", the pollers of the queue its callback API uses, which the default
// health service brings into every server and an external sink's client uses too).
// Under full ingest a callback thread read 49 of the 52 GetProgress calls slower than
// 1 ms, and at normal priority it waited behind the workers for up to 4.7 ms before it
// handed the call on (bench/HISTORY.md 110). RaiseGrpcPollerThreads therefore puts every
// such thread under SCHED_RR once the servers have started. A sync-server thread gRPC
// starts later (when its pool's only poller takes a call) begins at normal priority and
// waits real-time once it has answered a point read; the health port's pool serves only
// reflection calls (health checks run on the callback threads), so it keeps its first.
//
// Invariant: an admin thread is real-time only while it waits for a call or answers a
// point read (or one of gRPC's own small calls the same threads serve: a health check,
// a reflection request); no thread a handler starts inherits the policy (it runs normal
// then, and SCHED_RESET_ON_FORK holds besides). gRPC's callback threads are real-time
// always: they wait for network events and run gRPC's short callbacks (a health check,
// an external sink's answer taken off the wire), never a handler or a worker.
//
// Needs CAP_SYS_NICE (or RLIMIT_RTPRIO): Create checks once, and without it every scope
// is a no-op and status() says why. Per-thread state is thread-local; the object is
// immutable and thread-safe.
#ifndef HANDOFF_SERVER_ADMIN_CALL_SCHEDULING_H_
#define HANDOFF_SERVER_ADMIN_CALL_SCHEDULING_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/thread_name.h"

namespace handoff::server {

class AdminCallScheduling {
 public:
  // Restores the thread's waiting policy when a call ends. Move-only.
  class [[nodiscard]] Scope {
   public:
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope();

   private:
    friend class AdminCallScheduling;
    explicit Scope(int restore_priority) : restore_priority_(restore_priority) {}
    int restore_priority_;  // 0: nothing to restore
  };

  // Disabled: every scope is a no-op.
  AdminCallScheduling() = default;

  // Real-time at `realtime_priority` (1..99) if this process may use it; 0, or a process
  // without the privilege, gives a disabled object whose status() says why.
  static AdminCallScheduling Create(int realtime_priority);

  bool enabled() const { return priority_ > 0; }
  // OK when enabled or turned off on purpose; otherwise why real-time was refused.
  const absl::Status& status() const { return status_; }
  // For the start log: "SCHED_RR 1" or "normal".
  std::string Describe() const;

  // Enter a call that answers from a key or two: the thread runs it real-time.
  Scope PointRead() const;
  // Enter any other call: the thread runs it under the normal policy, and is real-time
  // again once the scope ends.
  Scope OtherCall() const;

  // The names gRPC gives the threads that wait on its completion queues: its callback
  // threads and a sync server's pool.
  static constexpr const char kGrpcCallbackThreadName[] = "nexting_thread";
  static constexpr const char kGrpcSyncServerThreadName[] = "grpcpp_sync_ser";

  // Moves every thread of this process with one of those names under SCHED_RR at this
  // object's priority (with SCHED_RESET_ON_FORK); the number moved, 0 when disabled. Call
  // on the thread that started the servers, once they have (gRPC starts its callback
  // threads with the first server or channel that uses its callback API), with the
  // threads listed before they started: gRPC names a thread from inside it, once it
  // runs, and until then it carries its creator's name, so this first waits (at most
  // `naming_limit`) until every thread started since `before` has a name of its own. A
  // thread that ended meanwhile is skipped.
  absl::StatusOr<int> RaiseGrpcPollerThreads(const std::vector<ThreadInfo>& before,
                                             absl::Duration naming_limit) const;

 private:
  AdminCallScheduling(int priority, absl::Status status)
      : priority_(priority), status_(std::move(status)) {}

  int priority_ = 0;
  absl::Status status_;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_ADMIN_CALL_SCHEDULING_H_
