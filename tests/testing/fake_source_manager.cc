#include "tests/testing/fake_source_manager.h"

#include "absl/strings/str_join.h"
#include "consumer/spec_validation.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace handoff::testing {
namespace {

using handoff::v1::Source;

bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 63) return false;
  if (!absl::ascii_isdigit(id[0]) && !absl::ascii_islower(id[0])) return false;
  for (const char c : id) {
    if (!absl::ascii_isdigit(c) && !absl::ascii_islower(c) && c != '-') return false;
  }
  return true;
}

std::string Key(absl::string_view id) { return std::string(id.data(), id.size()); }

}  // namespace

absl::Status FakeSourceManager::Recover() {
  absl::MutexLock lock(&mu_);
  ++recover_calls_;
  return absl::OkStatus();
}

void FakeSourceManager::Shutdown() {
  absl::MutexLock lock(&mu_);
  ++shutdown_calls_;
  shut_down_ = true;
}

absl::StatusOr<Source> FakeSourceManager::CreateSource(
    const handoff::v1::CreateSourceRequest& request) {
  const handoff::v1::SourceSpec& spec = request.spec();
  if (!ValidId(spec.id())) {
    return absl::InvalidArgumentError("spec.id: must match [a-z0-9][a-z0-9-]{0,62}");
  }
  if (spec.provider_url().empty()) {
    return absl::InvalidArgumentError("spec.provider_url: required");
  }
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(spec.id());
  if (it != sources_.end()) {
    if (it->second.source.spec().SerializeAsString() != spec.SerializeAsString()) {
      return absl::AlreadyExistsError(
          absl::StrCat("source ", spec.id(), " exists with a different spec"));
    }
    return it->second.source;
  }
  Entry entry;
  *entry.source.mutable_spec() = spec;
  entry.source.set_desired_running(request.start());
  entry.source.mutable_progress()->set_source_id(spec.id());
  entry.source.mutable_progress()->set_state(request.start()
                                                 ? handoff::v1::SOURCE_STATE_RUNNING
                                                 : handoff::v1::SOURCE_STATE_STOPPED);
  Source out = entry.source;
  sources_.emplace(spec.id(), std::move(entry));
  return out;
}

absl::StatusOr<Source> FakeSourceManager::UpdateSource(const handoff::v1::SourceSpec& spec) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(spec.id());
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", spec.id()));
  std::vector<std::string> unsafe = consumer::UnsafeSpecChanges(it->second.source.spec(), spec);
  if (!unsafe.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("source '", spec.id(), "': changing ", absl::StrJoin(unsafe, ", "),
                     " needs a new source or a RebuildSource"));
  }
  *it->second.source.mutable_spec() = spec;
  return it->second.source;
}

absl::StatusOr<Source> FakeSourceManager::StartSource(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(Key(id));
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  it->second.source.set_desired_running(true);
  it->second.source.mutable_progress()->set_state(handoff::v1::SOURCE_STATE_RUNNING);
  ++it->second.generation;
  return it->second.source;
}

absl::StatusOr<Source> FakeSourceManager::StopSource(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(Key(id));
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  it->second.source.set_desired_running(false);
  it->second.source.mutable_progress()->set_state(handoff::v1::SOURCE_STATE_STOPPED);
  ++it->second.generation;
  return it->second.source;
}

absl::Status FakeSourceManager::DeleteSource(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(Key(id));
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  if (it->second.source.desired_running()) {
    return absl::FailedPreconditionError(absl::StrCat("source ", id, " is running"));
  }
  sources_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Source> FakeSourceManager::GetSource(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("source_id: required");
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(Key(id));
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  return it->second.source;
}

absl::StatusOr<handoff::v1::ListSourcesResponse> FakeSourceManager::ListSources(
    const handoff::v1::ListSourcesRequest& request) {
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError("page_size: must be 1..1000");
  }
  const int limit = request.page_size() == 0 ? 100 : request.page_size();
  handoff::v1::ListSourcesResponse response;
  absl::MutexLock lock(&mu_);
  auto it = sources_.upper_bound(request.page_token());
  for (; it != sources_.end() && response.sources_size() < limit; ++it) {
    *response.add_sources() = it->second.source;
  }
  if (it != sources_.end() && response.sources_size() > 0) {
    response.set_next_page_token(response.sources(response.sources_size() - 1).spec().id());
  }
  return response;
}

absl::StatusOr<handoff::v1::Progress> FakeSourceManager::GetProgress(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(Key(id));
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  return it->second.source.progress();
}

absl::StatusOr<handoff::v1::Progress> FakeSourceManager::WaitProgress(absl::string_view id,
                                                                      uint64_t* generation,
                                                                      absl::Time deadline) {
  const std::string key = Key(id);
  absl::MutexLock lock(&mu_);
  ++waiters_;
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_) return true;
    auto it = sources_.find(key);
    return it == sources_.end() || it->second.generation > *generation;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  --waiters_;
  if (shut_down_) return absl::CancelledError("shutting down");
  auto it = sources_.find(key);
  if (it == sources_.end()) return absl::NotFoundError(absl::StrCat("source ", id));
  *generation = it->second.generation;
  return it->second.source.progress();
}

absl::StatusOr<handoff::v1::ListHoldsResponse> FakeSourceManager::ListHolds(
    const handoff::v1::ListHoldsRequest& request) {
  if (request.page_size() < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  return handoff::v1::ListHoldsResponse();
}

absl::StatusOr<handoff::v1::Hold> FakeSourceManager::GetHold(
    const handoff::v1::GetHoldRequest& request) {
  return absl::NotFoundError(absl::StrCat("no hold at ", request.block_number(), ":",
                                          request.log_index()));
}

absl::StatusOr<handoff::v1::ResolveHoldResponse> FakeSourceManager::ResolveHold(
    const handoff::v1::ResolveHoldRequest& request, absl::string_view actor) {
  absl::MutexLock lock(&mu_);
  last_actor_ = Key(actor);
  if (request.reason().empty()) return absl::InvalidArgumentError("reason: required");
  handoff::v1::ResolveHoldResponse response;
  handoff::v1::QuarantineRecord* record = response.mutable_record();
  record->set_source_id(request.source_id());
  record->set_actor(last_actor_);
  record->set_reason(request.reason());
  record->set_from_hold_version(request.hold_version());
  return response;
}

absl::StatusOr<handoff::v1::ListQuarantineResponse> FakeSourceManager::ListQuarantine(
    const handoff::v1::ListQuarantineRequest& request) {
  return handoff::v1::ListQuarantineResponse();
}

absl::StatusOr<Source> FakeSourceManager::RebuildSource(
    const handoff::v1::RebuildSourceRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(request.source_id());
  if (it == sources_.end()) {
    return absl::NotFoundError(absl::StrCat("source ", request.source_id()));
  }
  return it->second.source;
}

absl::StatusOr<handoff::v1::QueryEventsResponse> FakeSourceManager::QueryEvents(
    const handoff::v1::QueryEventsRequest& request) {
  absl::MutexLock lock(&mu_);
  if (sources_.find(request.source_id()) == sources_.end()) {
    return absl::NotFoundError(absl::StrCat("source ", request.source_id()));
  }
  return handoff::v1::QueryEventsResponse();
}

void FakeSourceManager::HaltOnStoreFailure(const absl::Status& failure) {
  absl::MutexLock lock(&mu_);
  store_failures_.push_back(failure);
}

std::vector<absl::Status> FakeSourceManager::store_failures() const {
  absl::MutexLock lock(&mu_);
  return store_failures_;
}

std::vector<handoff::v1::Progress> FakeSourceManager::AllProgress() {
  std::vector<handoff::v1::Progress> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : sources_) out.push_back(entry.source.progress());
  return out;
}

absl::Status FakeSourceManager::SetProgress(const handoff::v1::Progress& progress) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(progress.source_id());
  if (it == sources_.end()) {
    return absl::NotFoundError(absl::StrCat("source ", progress.source_id()));
  }
  *it->second.source.mutable_progress() = progress;
  ++it->second.generation;
  return absl::OkStatus();
}

std::string FakeSourceManager::last_actor() const {
  absl::MutexLock lock(&mu_);
  return last_actor_;
}

int FakeSourceManager::recover_calls() const {
  absl::MutexLock lock(&mu_);
  return recover_calls_;
}

int FakeSourceManager::shutdown_calls() const {
  absl::MutexLock lock(&mu_);
  return shutdown_calls_;
}

int FakeSourceManager::waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_;
}

void FakeSourceManager::AwaitWaiters(int n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiters_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

}  // namespace handoff::testing
