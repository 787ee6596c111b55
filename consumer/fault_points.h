// Named fault points of the engine, for crash-injection tests (RocksDB's sync points,
// in miniature).
//
// Product code marks the places where a process could die between durable steps:
//
//   if (FaultPoints::Hit("ingest.before_barrier")) return Crashed();
//
// Nothing is armed in production: Hit() is one relaxed atomic load then. A test arms a
// point with a predicate; when it fires, the engine abandons the worker at once, with
// no cleanup of in-flight work and no further write, as a killed process would. The
// test then reopens the database from disk in a fresh engine.
//
// Points: ingest.after_fetch,
// ingest.before_event_commit, ingest.after_event_commit, ingest.before_quarantine_commit,
// ingest.after_quarantine_commit, ingest.after_deliver, ingest.before_barrier,
// ingest.after_barrier, delivery.after_deliver, delivery.before_commit,
// delivery.after_commit. Interleaving points, whose answer is ignored:
// ledger.between_scans (ReceiptLedger::Load, between its outcome and hold scans);
// delivery.early_answers_used and delivery.early_answers_dropped (PageAttempt, the
// answers of a call sent ahead: see EarlyDelivery); delivery.idle (SourceWorker's
// delivery loop found nothing deliverable and waits); delivery.woken (its wait on a hold
// or a retry ended); delivery.read_below_gate_dropped (a read dropped because a write
// below the gate was noted during it, UnpublishedWrites).
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_FAULT_POINTS_H_
#define HANDOFF_CONSUMER_FAULT_POINTS_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace handoff::consumer {

class FaultPoints {
 public:
  // Returns true when the test armed `name` and its predicate fires now.
  static bool Hit(absl::string_view name) {
    if (!armed_.load(std::memory_order_relaxed)) return false;
    return HitSlow(name);
  }

  // Arms `name`: `fire` is called on every hit and returns whether to crash there.
  static void Arm(absl::string_view name, std::function<bool()> fire);
  // Crash on the `n`-th hit (1-based) of `name`.
  static void ArmNth(absl::string_view name, int n);
  // Counts hits of every point, armed or not (tests use this to choose crash points).
  static void CountHits(bool on);
  static int Hits(absl::string_view name);
  static void DisarmAll();

 private:
  static bool HitSlow(absl::string_view name);
  static std::atomic<bool> armed_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_FAULT_POINTS_H_
