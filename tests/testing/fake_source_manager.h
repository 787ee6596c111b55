// FakeSourceManager: an in-memory consumer::SourceManager for the server's unit tests.
//
// It keeps sources in a map, validates only what the tests need (spec.id's pattern,
// the page_size ranges), and lets a test drive progress (SetProgress bumps the
// generation and wakes WaitProgress callers) and inspect what the adapter passed in
// (last ResolveHold actor, calls made). Other RPCs answer from canned values.
//
// Thread-safe.
#ifndef HANDOFF_TESTS_TESTING_FAKE_SOURCE_MANAGER_H_
#define HANDOFF_TESTS_TESTING_FAKE_SOURCE_MANAGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "consumer/source_manager.h"

namespace handoff::testing {

class FakeSourceManager final : public consumer::SourceManager {
 public:
  FakeSourceManager() = default;

  // ---- consumer::SourceManager ----
  absl::Status Recover() override;
  void Shutdown() override;
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
  // Records the failure (store_failures()).
  void HaltOnStoreFailure(const absl::Status& failure) override;

  // ---- Test controls ----
  // Replaces a source's progress (source_id taken from `progress`), bumps its
  // generation and wakes every WaitProgress caller. NOT_FOUND for an unknown source.
  absl::Status SetProgress(const handoff::v1::Progress& progress);
  // The actor of the last ResolveHold call.
  std::string last_actor() const;
  int recover_calls() const;
  int shutdown_calls() const;
  // Every HaltOnStoreFailure call's failure, in order.
  std::vector<absl::Status> store_failures() const;
  // Calls of WaitProgress currently blocked.
  int waiters() const;
  // Blocks until at least `n` WaitProgress calls are blocked (tests use it to know a
  // stream is parked before acting).
  void AwaitWaiters(int n) const;

 private:
  struct Entry {
    handoff::v1::Source source;
    uint64_t generation = 1;
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> sources_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_actor_ ABSL_GUARDED_BY(mu_);
  int recover_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int shutdown_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> store_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::testing

#endif  // HANDOFF_TESTS_TESTING_FAKE_SOURCE_MANAGER_H_
