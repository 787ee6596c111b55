// SourceManager: the core of handoffd. Owns one worker per running source and offers
// every admin operation, with no knowledge of gRPC (server/ adapts it).
//
// Invariants:
//  * A source's spec is persisted before its worker starts; a worker starts only from
//    its durable checkpoint, and only if the checkpoint's identity hash matches the
//    spec's identity (else FAILED_PRECONDITION until RebuildSource).
//  * At most one worker per source in this process. Across processes, the checkpoint
//    compare-and-swap fences stale writers (see README, "One owner per source").
//  * StopSource returns only once the worker has left its loop at a safe point; it never
//    promotes a barrier without durability.
//  * Hold resolutions are fenced by the hold's version: a stale version is ABORTED and
//    changes nothing.
//
// Thread-safe. Request validation happens here (messages name the field), so the gRPC
// layer and the configuration file share it.
#ifndef HANDOFF_CONSUMER_SOURCE_MANAGER_H_
#define HANDOFF_CONSUMER_SOURCE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "consumer/observer.h"
#include "consumer/page_budget.h"
#include "consumer/provider.h"
#include "consumer/sink.h"
#include "consumer/source_worker.h"
#include "handoff/v1/consumer_admin.pb.h"
#include "handoff/v1/source.pb.h"
#include "store/store.h"

namespace handoff::consumer {

// Builds the provider adapter and the external sink of a source. Production uses the
// libcurl adapter and the gRPC EventSink client; tests substitute fakes.
struct Factories {
  std::function<absl::StatusOr<std::unique_ptr<Provider>>(const handoff::v1::SourceSpec&)>
      provider;
  // May return nullptr for sources whose sink is local rows.
  std::function<absl::StatusOr<std::unique_ptr<ExternalSink>>(const handoff::v1::SourceSpec&)>
      external_sink;
  // The budget the providers fetch pages under, for observation (/metrics); may be null.
  std::shared_ptr<const PageBudget> page_budget;
};

struct SourceManagerOptions {
  store::Store* store = nullptr;  // not owned; outlives the manager
  Factories factories;
  EngineObserver* observer = nullptr;  // optional, not owned
  int max_sources = 10000;
  // Events per durable step when every event of a run is applied (group commit). 1
  // commits each event on its own (the crash tests use both).
  int max_events_per_step = 1000;
  // Stop waits at most this long for a worker to reach a safe point.
  absl::Duration stop_timeout = absl::Seconds(30);
  // Worker tuning (backoff between fetch retries, delivery runs, ...).
  WorkerOptions worker;
  // Tests: an extra transactional effect staged with every applied event (not owned).
  TransactionalEffect* effect = nullptr;
  // Tests: asked by RebuildSource once the checkpoints are reset, before the source's
  // record is written for the last time; true abandons the rebuild there with nothing
  // more written, as a process killed at that point would (the test reopens the store).
  std::function<bool()> crash_after_rebuild_reset;
  // Tests: asked by CreateSource of a new source between its two writes (the source's
  // record and its checkpoints); true abandons the creation there, as a process killed
  // at that point would (the test reopens the store).
  std::function<bool()> crash_mid_create;
};

class SourceManager {
 public:
  static absl::StatusOr<std::unique_ptr<SourceManager>> Create(SourceManagerOptions options);
  virtual ~SourceManager() = default;

  // Starts the workers of every source that was running when the process stopped.
  virtual absl::Status Recover() = 0;

  // Stops every worker at a safe point (process shutdown). Idempotent.
  virtual void Shutdown() = 0;
  // Shutdown within a deadline (--shutdown_grace): every worker is asked to stop at once
  // and waited for until `deadline`; one that has not stopped by then (a provider or
  // sink call that ignores its cancellation, a write stuck in the disk) is abandoned:
  // left running, and its source id returned. An abandoned worker's threads may still use
  // the store, the observer and this manager: none of them may be destroyed until it
  // ends. The manager's destructor waits for it; handoffd instead exits the process
  // without destroying any of them (server.h). Idempotent (a second call returns none).
  virtual std::vector<std::string> ShutdownBy(absl::Time deadline) {
    Shutdown();
    return {};
  }

  // `actor` is the caller's name for audit trails (a token's name, never the token).
  virtual absl::StatusOr<handoff::v1::Source> CreateSource(
      const handoff::v1::CreateSourceRequest& request) = 0;
  // Replaces the spec of an existing source when the change is safe (see
  // UnsafeSpecChanges in spec_validation.h); a running worker restarts at a safe point
  // with the new spec. Codes: NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION (an
  // unsafe change: the message names the fields). A safe change whose spec cannot start
  // (an api_key naming an unset variable, ...) is saved all the same: the source halts
  // as CONFIG_INVALID with the reason, and the answer is the source in that state.
  virtual absl::StatusOr<handoff::v1::Source> UpdateSource(const handoff::v1::SourceSpec& spec) {
    return absl::UnimplementedError("UpdateSource");
  }
  virtual absl::StatusOr<handoff::v1::Source> StartSource(absl::string_view id) = 0;
  virtual absl::StatusOr<handoff::v1::Source> StopSource(absl::string_view id) = 0;
  virtual absl::Status DeleteSource(absl::string_view id) = 0;
  virtual absl::StatusOr<handoff::v1::Source> GetSource(absl::string_view id) = 0;
  virtual absl::StatusOr<handoff::v1::ListSourcesResponse> ListSources(
      const handoff::v1::ListSourcesRequest& request) = 0;

  virtual absl::StatusOr<handoff::v1::Progress> GetProgress(absl::string_view id) = 0;
  // Blocks until the source's progress generation exceeds `*generation` or `deadline`
  // passes (then returns the current snapshot unchanged). Updates `*generation`.
  // CANCELLED when the manager shuts down; NOT_FOUND when the source is deleted.
  virtual absl::StatusOr<handoff::v1::Progress> WaitProgress(absl::string_view id,
                                                            uint64_t* generation,
                                                            absl::Time deadline) = 0;

  virtual absl::StatusOr<handoff::v1::ListHoldsResponse> ListHolds(
      const handoff::v1::ListHoldsRequest& request) = 0;
  virtual absl::StatusOr<handoff::v1::Hold> GetHold(const handoff::v1::GetHoldRequest& request) = 0;
  virtual absl::StatusOr<handoff::v1::ResolveHoldResponse> ResolveHold(
      const handoff::v1::ResolveHoldRequest& request, absl::string_view actor) = 0;
  virtual absl::StatusOr<handoff::v1::ListQuarantineResponse> ListQuarantine(
      const handoff::v1::ListQuarantineRequest& request) = 0;
  virtual absl::StatusOr<handoff::v1::Source> RebuildSource(
      const handoff::v1::RebuildSourceRequest& request) = 0;
  virtual absl::StatusOr<handoff::v1::QueryEventsResponse> QueryEvents(
      const handoff::v1::QueryEventsRequest& request) = 0;

  // Progress of every source (metrics scrapes, health).
  virtual std::vector<handoff::v1::Progress> AllProgress() = 0;

  // The store failed (its health is `failure`): every running source halts as
  // STORAGE_FAILED now, not at its next write, which a caught-up source may not make
  // for hours. Idempotent (the health ticker calls it while the store stays failed).
  virtual void HaltOnStoreFailure(const absl::Status& failure) {}
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SOURCE_MANAGER_H_
