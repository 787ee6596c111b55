// SinkCore: the sample downstream service's behaviour, with no gRPC in it (the service
// adapters in sample_sink.cc are thin). It answers EventSink calls from a durable
// idempotency table (RecordStore) and applies the configured faults (FaultConfig).
//
// Invariants:
//  * An idempotency key is recorded at most once: the first Apply of a key answers
//    APPLIED and writes the record; every later one answers ALREADY_APPLIED and only raises
//    the record's attempt count. Check-and-write is serialised, so concurrent calls with
//    the same key cannot both answer APPLIED.
//  * An event is answered APPLIED only after its record is durable (one WriteBatch and one
//    sync per call, whatever the number of events).
//  * Events answered REJECTED, NEEDS_REVIEW, IGNORED or RETRY_LATER, and calls failed with
//    an error status, record nothing.
//
// Thread-safe.
#ifndef HANDOFF_SIM_SAMPLE_SINK_SINK_CORE_H_
#define HANDOFF_SIM_SAMPLE_SINK_SINK_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "handoff/v1/event_sink.pb.h"
#include "sim/sample_sink/record_store.h"
#include "sim/sample_sink/sample_sink_admin.pb.h"

namespace handoff::sim {

class SinkCore {
 public:
  struct Options {
    // RocksDB folder of the idempotency table (created if missing). Required.
    std::string db_path;
    // fsync every write (the point of the sink); off only for throwaway runs.
    bool sync = true;
    handoff::sim::v1::FaultConfig faults;
    // Called instead of std::abort() when a die_* fault fires (in-process tests). If it
    // returns, the core behaves as a dead process: every later call fails UNAVAILABLE.
    std::function<void()> crash_hook;
  };

  static absl::StatusOr<std::unique_ptr<SinkCore>> Open(Options options);

  SinkCore(const SinkCore&) = delete;
  SinkCore& operator=(const SinkCore&) = delete;
  ~SinkCore();

  // Answers one call: Apply (`batch` false, one request) or ApplyBatch. Returns one
  // response per request answered (ApplyBatch may answer a prefix, batch_answer_limit), or
  // a call-level error: UNAVAILABLE (fail_next, crashed, stopping, storage failure),
  // UNIMPLEMENTED (batch_unimplemented). May block for delay_ms (cut short by Shutdown).
  absl::StatusOr<std::vector<handoff::v1::ApplyResponse>> Apply(
      absl::Span<const handoff::v1::ApplyRequest* const> requests, bool batch);

  // Replaces the fault configuration; fail_next_calls starts counting anew.
  void SetFaults(const handoff::sim::v1::FaultConfig& faults);
  handoff::sim::v1::FaultConfig faults() const;

  handoff::sim::v1::Stats stats() const;

  // Every record (durable), by idempotency key.
  absl::StatusOr<std::map<std::string, SinkRecord>> Records() const;

  // Blocks until at least `n` calls have been received (counted on arrival, before any
  // delay) or `timeout` passes; returns whether they were.
  bool WaitForCalls(uint64_t n, absl::Duration timeout) const;

  // Wakes delayed calls and fails every later call with UNAVAILABLE. Idempotent.
  void Shutdown();

 private:
  SinkCore(Options options, std::unique_ptr<RecordStore> store);

  // Answers the events of one call against the table. REQUIRES: write_mu_ is held.
  absl::StatusOr<std::vector<handoff::v1::ApplyResponse>> ApplyEvents(
      absl::Span<const handoff::v1::ApplyRequest* const> requests,
      const handoff::sim::v1::FaultConfig& faults) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // Writes what a call recorded so far (one batch, one sync); `new_keys` of them are new.
  absl::Status Commit(const std::vector<std::pair<std::string, SinkRecord>>& writes,
                      uint64_t new_keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // Fires a die_* fault: the hook (or abort), then the dead state.
  void Crash() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // Constant after construction.
  const std::function<void()> crash_hook_;
  const std::unique_ptr<RecordStore> store_;

  // Serialises the check-then-write of the idempotency table. Acquired before mu_.
  absl::Mutex write_mu_;
  // New records written by this process (the die_* counters).
  uint64_t new_records_ ABSL_GUARDED_BY(write_mu_) = 0;

  mutable absl::Mutex mu_;
  handoff::sim::v1::FaultConfig faults_ ABSL_GUARDED_BY(mu_);
  handoff::sim::v1::Stats stats_ ABSL_GUARDED_BY(mu_);
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SAMPLE_SINK_SINK_CORE_H_
