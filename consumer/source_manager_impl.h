// SourceManagerImpl: the SourceManager of handoffd (see source_manager.h for the
// contract). Holds the specs in the store, the workers in memory, and a ProgressBoard
// that every worker publishes to.
//
// Lock order: ops_mu_ (shared by every admin operation that starts, stops, updates,
// rebuilds or deletes a worker, exclusive for Recover), then create_mu_ (CreateSource
// only: the source count), then the source's lock in source_ops_ (operations on one
// source run one at a time; on different sources they overlap, so their synced writes
// share group commits instead of queueing one after another), then mu_ (guards the
// worker map); the store's per-source locks are taken inside store calls only. Workers
// never take ops_mu_ or source_ops_.
#ifndef HANDOFF_CONSUMER_SOURCE_MANAGER_IMPL_H_
#define HANDOFF_CONSUMER_SOURCE_MANAGER_IMPL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "consumer/deferred_deleter.h"
#include "consumer/idle_poller.h"
#include "consumer/keyed_mutex.h"
#include "consumer/progress_board.h"
#include "consumer/source_manager.h"
#include "consumer/source_worker.h"

namespace handoff::consumer {

class SourceManagerImpl final : public SourceManager {
 public:
  explicit SourceManagerImpl(SourceManagerOptions options);
  ~SourceManagerImpl() override;

  absl::Status Recover() override;
  void Shutdown() override;
  std::vector<std::string> ShutdownBy(absl::Time deadline) override;

  absl::StatusOr<handoff::v1::Source> CreateSource(
      const handoff::v1::CreateSourceRequest& request) override;
  absl::StatusOr<handoff::v1::Source> UpdateSource(const handoff::v1::SourceSpec& spec) override;
  absl::StatusOr<handoff::v1::Source> StartSource(absl::string_view id) override;
  absl::StatusOr<handoff::v1::Source> StopSource(absl::string_view id) override;
  absl::Status DeleteSource(absl::string_view id) override;
  absl::StatusOr<handoff::v1::Source> GetSource(absl::string_view id) override;
  absl::StatusOr<handoff::v1::ListSourcesResponse> ListSources(
      const handoff::v1::ListSourcesRequest& request) override;
  absl::StatusOr<handoff::v1::Progress> GetProgress(absl::string_view id) override;
  absl::StatusOr<handoff::v1::Progress> WaitProgress(absl::string_view id, uint64_t* generation,
                                                    absl::Time deadline) override;
  absl::StatusOr<handoff::v1::ListHoldsResponse> ListHolds(
      const handoff::v1::ListHoldsRequest& request) override;
  absl::StatusOr<handoff::v1::Hold> GetHold(const handoff::v1::GetHoldRequest& request) override;
  absl::StatusOr<handoff::v1::ResolveHoldResponse> ResolveHold(
      const handoff::v1::ResolveHoldRequest& request, absl::string_view actor) override;
  absl::StatusOr<handoff::v1::ListQuarantineResponse> ListQuarantine(
      const handoff::v1::ListQuarantineRequest& request) override;
  absl::StatusOr<handoff::v1::Source> RebuildSource(
      const handoff::v1::RebuildSourceRequest& request) override;
  absl::StatusOr<handoff::v1::QueryEventsResponse> QueryEvents(
      const handoff::v1::QueryEventsRequest& request) override;
  std::vector<handoff::v1::Progress> AllProgress() override;
  void HaltOnStoreFailure(const absl::Status& failure) override;

  // Tests: the worker of `id`, or nullptr.
  SourceWorker* WorkerForTest(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // StartLocked and StopLocked: the caller also holds the source's lock in source_ops_
  // (or ops_mu_ exclusively).
  // A start refused by the source's own configuration (an unreadable API key, a spec
  // the provider adapter refuses, an identity that changed since the checkpoint) halts
  // the source as CONFIG_INVALID, on the board and in the store, and sets
  // *config_invalid when given: the source exists, and its state says why it does not
  // run (source.proto). The status is returned either way.
  // *shutting_down (when given) is set when the start is refused only because Shutdown
  // has begun (UNAVAILABLE).
  absl::Status StartLocked(const handoff::v1::Source& source, bool* config_invalid = nullptr,
                           bool* shutting_down = nullptr) ABSL_SHARED_LOCKS_REQUIRED(ops_mu_);
  // StartLocked for an admin operation that has already recorded desired_running (and its
  // other writes): a start refused only because Shutdown has begun is no error, since the
  // next start's Recover starts the source as recorded. The answer is then the source
  // STOPPED with desired_running set, not UNAVAILABLE (which asks for a retry of a call
  // that was applied).
  absl::Status StartRecordedLocked(const handoff::v1::Source& source,
                                   bool* config_invalid = nullptr)
      ABSL_SHARED_LOCKS_REQUIRED(ops_mu_);
  // Clears the halt (state, reason, error, funding action) the store keeps for `id`, if
  // any: a worker about to start has none. Writes nothing when there is none.
  absl::Status ClearStoredHalt(absl::string_view id);
  // Records `why` as the CONFIG_INVALID halt of `id` and returns it.
  absl::Status HaltUnstartable(absl::string_view id, absl::Status why, bool* config_invalid);
  // Stops and forgets the worker of `id` (if any). DEADLINE_EXCEEDED if it did not
  // reach a safe point in time.
  absl::Status StopLocked(absl::string_view id) ABSL_SHARED_LOCKS_REQUIRED(ops_mu_);
  bool IsRunning(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<handoff::v1::Progress> ProgressFromStore(const handoff::v1::Source& source);
  absl::StatusOr<handoff::v1::Source> WithProgress(handoff::v1::Source source);
  // Recover: removes the record of `id` if CreateSource was cut short after writing it
  // and before its checkpoints (no ingest checkpoint, no rows); true if it did.
  absl::StatusOr<bool> RemoveIfCreationCutShort(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  absl::Status InitCheckpoints(const handoff::v1::SourceSpec& spec, uint64_t start_block,
                               bool latest);
  void PersistHalt(const handoff::v1::Progress& progress);
  absl::Status CheckOpen() const;
  // The IdlePoller of the sources polling `provider_url` (created at the first).
  std::shared_ptr<IdlePoller> IdlePollerFor(const std::string& provider_url)
      ABSL_LOCKS_EXCLUDED(pollers_mu_);
  // Holds or quarantine records; returns the next page token.
  template <typename Record, typename AddFn>
  absl::StatusOr<std::string> ListStaged(store::StagedFamily family, const std::string& source_id,
                                         int page_size, const std::string& page_token,
                                         const AddFn& add);

  const SourceManagerOptions options_;
  store::Store* const store_;
  ProgressBoard board_;
  // Destroys the workers' finished pages off their ingest threads; declared before
  // workers_ so it outlives them. Four pending pages at most (see the memory formula).
  DeferredDeleter deleter_;
  // Polls the caught-up polling sources (idle_poller.h): one IdlePoller, one thread, per
  // provider URL, so that a provider that stops answering delays only its own sources'
  // polls. Created at the first polling source of a URL, owned by the workers that use it
  // (the last one's end ends its thread: sources created and deleted with ever new URLs
  // leave no thread behind); the entries of those gone are dropped at the next lookup.
  absl::Mutex pollers_mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<IdlePoller>> idle_pollers_
      ABSL_GUARDED_BY(pollers_mu_);

  absl::Mutex ops_mu_ ABSL_ACQUIRED_BEFORE(create_mu_, mu_);
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  KeyedMutex source_ops_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<SourceWorker>> workers_ ABSL_GUARDED_BY(mu_);
  // Workers ShutdownBy gave up on (still running): freed by the destructor once they end,
  // before the board, the deleter and the pollers they use (declared above).
  std::vector<std::unique_ptr<SourceWorker>> abandoned_ ABSL_GUARDED_BY(ops_mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SOURCE_MANAGER_IMPL_H_
