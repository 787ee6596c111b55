#include "consumer/source_manager_impl.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "consumer/memory_bound.h"
#include "consumer/spec_validation.h"
#include "google/protobuf/util/message_differencer.h"
#include "store/keys.h"
#include "store/records.pb.h"
#include "store/row_codec.h"

namespace handoff::consumer {
namespace {

// A listing's reply ends before its records pass this many bytes (always with one at
// least), and says where to go on: gRPC clients refuse replies over 4 MiB by default,
// and a reply is built whole in memory. Rows and holds carry a log's data, unbounded.
constexpr size_t kMaxReplyBytes = 3 << 20;

// A spec that leaves the gate unset means "the default" for a new source; an existing
// source keeps the gate it was created with (sources created when the default was
// IMMEDIATE, declared in a config that never named a gate, stay as they were instead of
// reading as a gate change that needs a rebuild).
void KeepStoredGateWhenUnset(const handoff::v1::SourceSpec& requested,
                             const handoff::v1::SourceSpec& stored,
                             handoff::v1::SourceSpec* normalized) {
  if (requested.sink().gate() == handoff::v1::DELIVERY_GATE_UNSPECIFIED &&
      requested.sink().kind_case() == stored.sink().kind_case()) {
    normalized->mutable_sink()->set_gate(stored.sink().gate());
  }
}

constexpr uint64_t kMaxIndex = std::numeric_limits<uint64_t>::max();

bool IsGated(const handoff::v1::SourceSpec& spec) {
  return spec.sink().has_downstream() &&
         (spec.sink().gate() == handoff::v1::DELIVERY_GATE_SAFE ||
          spec.sink().gate() == handoff::v1::DELIVERY_GATE_FINALIZED);
}


store::Stage StageOf(handoff::v1::Stage stage) {
  return stage == handoff::v1::STAGE_DELIVERY ? store::Stage::kDelivery : store::Stage::kIngest;
}

// A page token is "<call>:<scope>\n<where the next page starts>", base64. Each call takes
// back only its own tokens for the same scope (source, range): another call's or
// source's would page silently through the wrong list (an empty page, or rows out of
// the asked range).
std::string EncodeToken(absl::string_view call, absl::string_view scope, absl::string_view next) {
  return absl::WebSafeBase64Escape(absl::StrCat(call, ":", scope, "\n", next));
}

// Where the next page starts ("" without a token).
absl::StatusOr<std::string> DecodeToken(absl::string_view token, absl::string_view call,
                                        absl::string_view scope) {
  if (token.empty()) return std::string();
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) {
    return absl::InvalidArgumentError("page_token: not a token returned by this API");
  }
  const std::string header = absl::StrCat(call, ":", scope, "\n");
  if (!absl::StartsWith(raw, header)) {
    return absl::InvalidArgumentError(
        "page_token: returned for another call, source or range; repeat the request that "
        "returned it, or start without one");
  }
  return raw.substr(header.size());
}

absl::Status RequireStage(handoff::v1::Stage stage) {
  if (stage != handoff::v1::STAGE_INGEST && stage != handoff::v1::STAGE_DELIVERY) {
    return absl::InvalidArgumentError("stage: STAGE_INGEST or STAGE_DELIVERY required");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SourceManager>> SourceManager::Create(
    SourceManagerOptions options) {
  if (options.store == nullptr) return absl::InvalidArgumentError("SourceManager: no store");
  if (!options.factories.provider) {
    return absl::InvalidArgumentError("SourceManager: no provider factory");
  }
  return std::unique_ptr<SourceManager>(new SourceManagerImpl(std::move(options)));
}

SourceManagerImpl::SourceManagerImpl(SourceManagerOptions options)
    : options_(std::move(options)),
      store_(options_.store),
      deleter_(/*max_pending=*/kDeleterPages, options_.worker.thread_nice) {}

SourceManagerImpl::~SourceManagerImpl() {
  Shutdown();
  // Workers abandoned by ShutdownBy still use the board, the deleter, the pollers and the
  // store: they end (their blocked call returns) before any of it goes.
  std::vector<std::unique_ptr<SourceWorker>> abandoned;
  {
    absl::MutexLock ops(&ops_mu_);
    abandoned.swap(abandoned_);
  }
  abandoned.clear();  // ~SourceWorker joins without a deadline
}

std::shared_ptr<IdlePoller> SourceManagerImpl::IdlePollerFor(const std::string& provider_url) {
  absl::MutexLock lock(&pollers_mu_);
  for (auto it = idle_pollers_.begin(); it != idle_pollers_.end();) {
    if (it->second.expired()) {
      idle_pollers_.erase(it++);
    } else {
      ++it;
    }
  }
  std::weak_ptr<IdlePoller>& entry = idle_pollers_[provider_url];
  std::shared_ptr<IdlePoller> poller = entry.lock();
  if (poller == nullptr) {
    poller = std::make_shared<IdlePoller>(options_.worker.thread_nice);
    entry = poller;
  }
  return poller;
}

absl::Status SourceManagerImpl::CheckOpen() const {
  absl::MutexLock lock(const_cast<absl::Mutex*>(&mu_));
  if (shut_down_) return absl::UnavailableError("the server is shutting down");
  return absl::OkStatus();
}

absl::Status SourceManagerImpl::Recover() {
  absl::MutexLock ops(&ops_mu_);
  std::string after;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<handoff::v1::Source> page, store_->ListSources(after, 256));
    if (page.empty()) break;
    for (const handoff::v1::Source& source : page) {
      after = source.spec().id();
      ASSIGN_OR_RETURN(bool removed, RemoveIfCreationCutShort(after));
      if (removed) continue;
      // Publish the stored state so GetProgress works before the worker reports.
      absl::StatusOr<handoff::v1::Progress> p = ProgressFromStore(source);
      if (p.ok()) board_.Update(source.spec().id(), [&](handoff::v1::Progress* out) { *out = *p; });
      if (!source.desired_running()) continue;
      absl::Status s = StartLocked(source);
      if (!s.ok() && options_.observer != nullptr) options_.observer->OnError(after, s);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SourceManagerImpl::RemoveIfCreationCutShort(const std::string& id) {
  absl::StatusOr<store::CheckpointRecord> cp = store_->LoadCheckpoint(id, store::Stage::kIngest);
  if (!absl::IsNotFound(cp.status())) return false;
  // Never a source that ingested anything (whatever else lost its checkpoint): only the
  // record CreateSource writes before the checkpoints, with nothing after it.
  bool has_rows = false;
  RETURN_IF_ERROR(store_->ScanRows(id, Position{0, 0}, Position{kMaxIndex, kMaxIndex},
                                   [&](Position, absl::string_view) {
                                     has_rows = true;
                                     return false;
                                   }));
  if (has_rows) return false;
  RETURN_IF_ERROR(store_->DeleteSource(id));
  if (options_.observer != nullptr) {
    options_.observer->OnError(
        id, absl::AbortedError("a CreateSource cut short (no checkpoint written) was removed; "
                               "create the source again"));
  }
  return true;
}

void SourceManagerImpl::Shutdown() { ShutdownBy(absl::InfiniteFuture()); }

std::vector<std::string> SourceManagerImpl::ShutdownBy(absl::Time deadline) {
  {
    // Refuse new operations and stop everything first, so the workers reach their safe
    // points in parallel.
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, worker] : workers_) worker->RequestStop();
  }
  // Operations in flight (a StopSource joining its worker) finish before the workers
  // are taken: none of them is joined or freed under another.
  absl::MutexLock ops(&ops_mu_);
  std::vector<std::pair<std::string, std::unique_ptr<SourceWorker>>> workers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, worker] : workers_) workers.emplace_back(id, std::move(worker));
    workers_.clear();
  }
  for (auto& [id, w] : workers) w->RequestStop();  // idempotent; any started meanwhile too
  // Every worker was asked to stop above: each has had the whole time since, in parallel.
  std::vector<std::string> abandoned;
  for (auto& [id, w] : workers) {
    if (w->Join(std::max(deadline - absl::Now(), absl::ZeroDuration()))) continue;
    abandoned.push_back(id);
    abandoned_.push_back(std::move(w));  // never freed while it runs (see the destructor)
  }
  board_.Close();
  return abandoned;
}
void SourceManagerImpl::HaltOnStoreFailure(const absl::Status& failure) {
  // Under the lock, as Shutdown stops them: no worker is reaped meanwhile, and a halt
  // takes no lock of the manager's (PersistHalt's write is refused by the failed store).
  absl::MutexLock lock(&mu_);
  for (auto& [id, worker] : workers_) {
    if (!worker->finished()) worker->HaltForStoreFailure(failure);
  }
}

bool SourceManagerImpl::IsRunning(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  // A halted worker publishes its state just before its threads exit, and a worker whose
  // StopSource timed out is still leaving: each counts as stopped (StopLocked joins it).
  return it != workers_.end() && !it->second->finished() && !it->second->stop_requested();
}

SourceWorker* SourceManagerImpl::WorkerForTest(absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second.get();
}

void SourceManagerImpl::PersistHalt(const handoff::v1::Progress& progress) {
  absl::StatusOr<handoff::v1::Source> source = store_->GetSource(progress.source_id());
  if (!source.ok()) return;
  handoff::v1::Progress* p = source->mutable_progress();
  p->set_state(progress.state());
  p->set_reason(progress.reason());
  p->set_funding_action(progress.funding_action());
  *p->mutable_last_error() = progress.last_error();
  // A failed store refuses this write; the halt is then reported from memory only.
  store_->PutSource(*source).IgnoreError();
}

absl::Status SourceManagerImpl::InitCheckpoints(const handoff::v1::SourceSpec& spec,
                                                uint64_t start_block, bool latest) {
  store::CheckpointRecord ingest;
  ingest.set_resume_cursor(latest ? "latest" : std::to_string(start_block));
  ingest.set_identity_hash(store::IdentityHash(spec));
  ingest.set_start_block(start_block);
  if (!latest && start_block > 0) {
    ingest.set_has_covered(true);
    ingest.set_covered_through(start_block - 1);
  }
  std::optional<store::CheckpointRecord> delivery;
  if (IsGated(spec)) {
    delivery.emplace();
    delivery->set_identity_hash(ingest.identity_hash());
  }
  return store_->ResetSource(spec.id(), ingest, delivery);
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::CreateSource(
    const handoff::v1::CreateSourceRequest& request) {
  RETURN_IF_ERROR(CheckOpen());
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  ASSIGN_OR_RETURN(handoff::v1::SourceSpec spec, NormalizeSpec(request.spec()));
  {
    absl::ReaderMutexLock ops(&ops_mu_);
    absl::MutexLock create(&create_mu_);
    KeyedMutex::Lock source_op(&source_ops_, spec.id());
    absl::StatusOr<handoff::v1::Source> existing = store_->GetSource(spec.id());
    if (existing.ok()) {
      KeepStoredGateWhenUnset(request.spec(), existing->spec(), &spec);
      if (!google::protobuf::util::MessageDifferencer::Equals(existing->spec(), spec)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "spec.id: source '", spec.id(), "' exists with a different spec"));
      }
      if (request.start() && !IsRunning(spec.id())) {
        existing->set_desired_running(true);
        RETURN_IF_ERROR(store_->PutSource(*existing));
        bool config_invalid = false;
        absl::Status s = StartRecordedLocked(*existing, &config_invalid);
        if (!s.ok() && !config_invalid) return s;
      }
    } else if (!absl::IsNotFound(existing.status())) {
      return existing.status();
    } else {
      std::vector<handoff::v1::Source> all;
      ASSIGN_OR_RETURN(all, store_->ListSources("", options_.max_sources));
      if (static_cast<int>(all.size()) >= options_.max_sources) {
        return absl::ResourceExhaustedError(
            absl::StrCat("at most ", options_.max_sources, " sources (--max_sources)"));
      }
      handoff::v1::Source source;
      *source.mutable_spec() = spec;
      source.set_desired_running(request.start());
      source.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
      source.mutable_progress()->set_state(handoff::v1::SOURCE_STATE_STOPPED);
      // The record first, then the checkpoints: a crash between the two leaves a record
      // with no checkpoint, which Recover removes (RemoveIfCreationCutShort). The other
      // order left checkpoints with no record, which nothing lists, counts or removes.
      // Meanwhile readers (GetSource, ListSources) take the progress published here: they
      // read the board before the checkpoint.
      board_.Update(spec.id(), [&](handoff::v1::Progress* out) {
        out->Clear();
        out->set_source_id(spec.id());
        out->set_state(handoff::v1::SOURCE_STATE_STOPPED);
      });
      absl::Status written = store_->PutSource(source);
      if (written.ok()) {
        if (options_.crash_mid_create && options_.crash_mid_create()) {
          return absl::AbortedError("test: crashed between CreateSource's writes");
        }
        written = InitCheckpoints(spec, spec.start().block(), spec.start().has_latest());
        // Undone at once when the store still takes writes; else by the next Recover.
        if (!written.ok()) store_->DeleteSource(spec.id()).IgnoreError();
      }
      if (!written.ok()) {
        board_.Remove(spec.id());
        return written;
      }
      absl::StatusOr<handoff::v1::Progress> p = ProgressFromStore(source);
      if (p.ok()) board_.Update(spec.id(), [&](handoff::v1::Progress* out) { *out = *p; });
      if (request.start()) {
        // Created either way: a start its own configuration refuses leaves the source
        // halted as CONFIG_INVALID, which GetSource shows with the reason.
        bool config_invalid = false;
        absl::Status s = StartRecordedLocked(source, &config_invalid);
        if (!s.ok() && !config_invalid) return s;
      }
    }
  }
  return GetSource(spec.id());
}

absl::Status SourceManagerImpl::HaltUnstartable(absl::string_view id, absl::Status why,
                                                bool* config_invalid) {
  handoff::v1::Progress halt;
  halt.set_source_id(std::string(id));
  halt.set_state(handoff::v1::SOURCE_STATE_CONFIG_INVALID);
  halt.set_reason(absl::StrCat("cannot start: ", why.message()));
  board_.Update(id, [&](handoff::v1::Progress* out) {
    out->set_state(halt.state());
    out->set_reason(halt.reason());
  });
  PersistHalt(halt);
  if (config_invalid != nullptr) *config_invalid = true;
  return why;
}

absl::Status SourceManagerImpl::StartRecordedLocked(const handoff::v1::Source& source,
                                                    bool* config_invalid) {
  bool shutting_down = false;
  absl::Status s = StartLocked(source, config_invalid, &shutting_down);
  if (shutting_down) return absl::OkStatus();  // Recover starts it at the next start
  return s;
}

absl::Status SourceManagerImpl::StartLocked(const handoff::v1::Source& source,
                                            bool* config_invalid, bool* shutting_down) {
  const std::string& id = source.spec().id();
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      if (shutting_down != nullptr) *shutting_down = true;
      return absl::UnavailableError("the server is shutting down");
    }
    auto it = workers_.find(id);
    // A halted worker, or one whose stop timed out, may still be finishing (its other
    // thread, its persisted halt, its durable step): it is reaped below and replaced,
    // not taken for a running one.
    if (it != workers_.end() && !it->second->finished() && !it->second->stop_requested()) {
      return absl::OkStatus();
    }
  }
  // A failed store refuses writes until the process restarts, and what it holds past
  // the failure may never have reached the disk: a worker started on it would publish
  // (and a gated one deliver) a page whose sync failed. Refused before the halted worker
  // is reaped, so its STORAGE_FAILED report stays.
  if (absl::Status health = store_->health(); !health.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "source '", id, "' cannot start: the store failed (", health.message(),
        "); restart handoffd once the disk is fixed"));
  }
  RETURN_IF_ERROR(StopLocked(id));  // reap a finished (halted) worker
  ASSIGN_OR_RETURN(store::CheckpointRecord cp, store_->LoadCheckpoint(id, store::Stage::kIngest));
  if (cp.identity_hash() != store::IdentityHash(source.spec())) {
    return HaltUnstartable(
        id,
        absl::FailedPreconditionError(absl::StrCat(
            "source '", id, "': its identity (provider URL, chain, source, filter) changed "
            "since its checkpoint was written; a cursor is only valid for its identity: "
            "RebuildSource")),
        config_invalid);
  }
  SourceWorker::Parts parts;
  parts.store = store_;
  parts.observer = options_.observer;
  parts.board = &board_;
  parts.deleter = &deleter_;
  parts.persist_halt = [this](const handoff::v1::Progress& p) { PersistHalt(p); };
  absl::StatusOr<std::unique_ptr<Provider>> provider = options_.factories.provider(source.spec());
  if (!provider.ok()) return HaltUnstartable(id, provider.status(), config_invalid);
  parts.provider = *std::move(provider);
  if (parts.provider->PolledPerFetch()) {
    parts.idle_poller = IdlePollerFor(source.spec().provider_url());
  }
  if (source.spec().sink().has_downstream()) {
    if (!options_.factories.external_sink) {
      return absl::FailedPreconditionError("no EventSink client is configured in this server");
    }
    absl::StatusOr<std::unique_ptr<ExternalSink>> sink =
        options_.factories.external_sink(source.spec());
    if (!sink.ok()) return HaltUnstartable(id, sink.status(), config_invalid);
    parts.sink = *std::move(sink);
  }
  // The one place a stored halt is cleared: every start (StartSource, Recover, an
  // update's or an idempotent create's restart) begins with none, or the halt of an
  // earlier run would come back as the state of the source once it stops (the record
  // StopSource writes carries it), across restarts. Written after the halted worker is
  // reaped (its own halt may land while it leaves) and before this one starts (a halt
  // it persists at once must not be overwritten).
  RETURN_IF_ERROR(ClearStoredHalt(id));
  parts.effect = options_.effect;
  WorkerOptions wo = options_.worker;
  wo.max_events_per_step = options_.max_events_per_step;
  auto worker = std::make_unique<SourceWorker>(source.spec(), wo, std::move(parts));
  SourceWorker* raw = worker.get();
  {
    absl::MutexLock lock(&mu_);
    // Shutdown may have begun while this worker was made: it would never be stopped.
    if (shut_down_) {
      if (shutting_down != nullptr) *shutting_down = true;
      return absl::UnavailableError("the server is shutting down");
    }
    workers_[id] = std::move(worker);
  }
  raw->Start();
  return absl::OkStatus();
}

absl::Status SourceManagerImpl::ClearStoredHalt(absl::string_view id) {
  ASSIGN_OR_RETURN(handoff::v1::Source stored, store_->GetSource(id));
  const handoff::v1::Progress& p = stored.progress();
  if (!IsHaltedState(p.state()) && p.reason().empty() && !p.has_last_error() &&
      p.funding_action().empty()) {
    return absl::OkStatus();
  }
  stored.mutable_progress()->Clear();
  return store_->PutSource(stored);
}

absl::Status SourceManagerImpl::StopLocked(absl::string_view id) {
  std::unique_ptr<SourceWorker> worker;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return absl::OkStatus();
    it->second->RequestStop();
  }
  SourceWorker* raw;
  {
    absl::MutexLock lock(&mu_);
    raw = workers_[id].get();
  }
  if (!raw->Join(options_.stop_timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "source '", id, "' is still finishing its current durable step; try again"));
  }
  absl::MutexLock lock(&mu_);
  worker = std::move(workers_[id]);
  workers_.erase(std::string(id));
  return absl::OkStatus();
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::UpdateSource(
    const handoff::v1::SourceSpec& in) {
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(handoff::v1::SourceSpec spec, NormalizeSpec(in));
  {
    absl::ReaderMutexLock ops(&ops_mu_);
    KeyedMutex::Lock source_op(&source_ops_, spec.id());
    ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(spec.id()));
    KeepStoredGateWhenUnset(in, source.spec(), &spec);
    if (google::protobuf::util::MessageDifferencer::Equals(source.spec(), spec)) {
      return WithProgress(source);
    }
    std::vector<std::string> unsafe = UnsafeSpecChanges(source.spec(), spec);
    if (!unsafe.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "source '", spec.id(), "': changing ", absl::StrJoin(unsafe, ", "),
          " needs a new source or a RebuildSource (a cursor is only valid for its identity)"));
    }
    const bool running = IsRunning(spec.id());
    RETURN_IF_ERROR(StopLocked(spec.id()));
    // Read once the worker is joined: a halt it persisted while stopping stays.
    ASSIGN_OR_RETURN(source, store_->GetSource(spec.id()));
    *source.mutable_spec() = spec;
    RETURN_IF_ERROR(store_->PutSource(source));
    if (running) {
      // Updated either way: a restart the new spec's own configuration refuses (its
      // api_key names an unset variable) halts the source as CONFIG_INVALID, which the
      // answer shows with the reason. An error would fail the server's start (Recover
      // started the source; sources_config updates it) over one source.
      bool config_invalid = false;
      absl::Status s = StartRecordedLocked(source, &config_invalid);
      if (!s.ok() && !config_invalid) return s;
    }
  }
  return GetSource(spec.id());
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::StartSource(absl::string_view id) {
  RETURN_IF_ERROR(CheckOpen());
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  {
    absl::ReaderMutexLock ops(&ops_mu_);
    KeyedMutex::Lock source_op(&source_ops_, id);
    ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(id));
    if (!IsRunning(id)) {
      // Written before the worker starts: a halt it persists at once (PersistHalt) must
      // not be overwritten by this record. StartLocked clears the stored halt.
      if (!source.desired_running()) {
        source.set_desired_running(true);
        RETURN_IF_ERROR(store_->PutSource(source));
      }
      RETURN_IF_ERROR(StartRecordedLocked(source));
    }
  }
  return GetSource(id);
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::StopSource(absl::string_view id) {
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  {
    absl::ReaderMutexLock ops(&ops_mu_);
    KeyedMutex::Lock source_op(&source_ops_, id);
    RETURN_IF_ERROR(store_->GetSource(id).status());
    RETURN_IF_ERROR(StopLocked(id));
    // Read once the worker is joined: a halt it persisted while stopping stays.
    ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(id));
    if (source.desired_running()) {
      source.set_desired_running(false);
      RETURN_IF_ERROR(store_->PutSource(source));
    }
  }
  return GetSource(id);
}

absl::Status SourceManagerImpl::DeleteSource(absl::string_view id) {
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  absl::ReaderMutexLock ops(&ops_mu_);
  KeyedMutex::Lock source_op(&source_ops_, id);
  ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(id));
  if (IsRunning(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("source '", id, "' is running: StopSource first"));
  }
  RETURN_IF_ERROR(StopLocked(id));
  RETURN_IF_ERROR(store_->DeleteSource(id));
  board_.Remove(id);
  // Durable and joined; under source_op, so a CreateSource of the same id comes after.
  if (options_.observer != nullptr) options_.observer->OnSourceDeleted(id);
  return absl::OkStatus();
}

absl::StatusOr<handoff::v1::Progress> SourceManagerImpl::ProgressFromStore(
    const handoff::v1::Source& source) {
  handoff::v1::Progress p;
  p.set_source_id(source.spec().id());
  ASSIGN_OR_RETURN(store::CheckpointRecord cp,
                   store_->LoadCheckpoint(source.spec().id(), store::Stage::kIngest));
  FillProgressFromCheckpoint(cp, &p);
  if (IsGated(source.spec())) {
    absl::StatusOr<store::CheckpointRecord> d =
        store_->LoadCheckpoint(source.spec().id(), store::Stage::kDelivery);
    if (d.ok()) {
      *p.mutable_delivery_checkpoint() = PublicCheckpoint(*d);
      p.mutable_counters()->set_delivered(d->counters().delivered());
    }
  }
  if (IsHaltedState(source.progress().state())) {
    p.set_state(source.progress().state());
    p.set_reason(source.progress().reason());
    p.set_funding_action(source.progress().funding_action());
    *p.mutable_last_error() = source.progress().last_error();
  } else {
    p.set_state(handoff::v1::SOURCE_STATE_STOPPED);
  }
  return p;
}

absl::StatusOr<handoff::v1::Progress> SourceManagerImpl::GetProgress(absl::string_view id) {
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(id));
  std::optional<handoff::v1::Progress> live = board_.Get(id);
  handoff::v1::Progress p;
  if (live.has_value()) {
    p = *std::move(live);
  } else {
    ASSIGN_OR_RETURN(p, ProgressFromStore(source));
  }
  // Holds are counted from the store, the source of truth.
  uint64_t holds = 0;
  for (store::Stage stage : {store::Stage::kIngest, store::Stage::kDelivery}) {
    RETURN_IF_ERROR(store_->ScanStaged(store::StagedFamily::kHolds, id, stage, Position{0, 0},
                                       Position{kMaxIndex, kMaxIndex},
                                       [&](Position, absl::string_view) {
                                         ++holds;
                                         return true;
                                       }));
  }
  p.mutable_counters()->set_open_holds(holds);
  return p;
}

absl::StatusOr<handoff::v1::Progress> SourceManagerImpl::WaitProgress(absl::string_view id,
                                                                     uint64_t* generation,
                                                                     absl::Time deadline) {
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  handoff::v1::Progress out;
  switch (board_.Wait(id, generation, deadline, &out)) {
    case ProgressBoard::WaitResult::kChanged:
    case ProgressBoard::WaitResult::kTimeout:
      return GetProgress(id);
    case ProgressBoard::WaitResult::kRemoved:
      return absl::NotFoundError(absl::StrCat("source '", id, "' does not exist"));
    case ProgressBoard::WaitResult::kClosed:
      return absl::CancelledError("the server is shutting down");
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::WithProgress(handoff::v1::Source source) {
  ASSIGN_OR_RETURN(*source.mutable_progress(), GetProgress(source.spec().id()));
  return source;
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::GetSource(absl::string_view id) {
  RETURN_IF_ERROR(ValidateSourceId(id, "source_id"));
  absl::StatusOr<handoff::v1::Source> source = store_->GetSource(id);
  if (absl::IsNotFound(source.status())) {
    return absl::NotFoundError(absl::StrCat("source '", id, "' does not exist"));
  }
  RETURN_IF_ERROR(source.status());
  return WithProgress(*std::move(source));
}

absl::StatusOr<handoff::v1::ListSourcesResponse> SourceManagerImpl::ListSources(
    const handoff::v1::ListSourcesRequest& request) {
  ASSIGN_OR_RETURN(int size, PageSize(request.page_size(), 100, 1000, "page_size"));
  ASSIGN_OR_RETURN(std::string after, DecodeToken(request.page_token(), "ListSources", ""));
  ASSIGN_OR_RETURN(std::vector<handoff::v1::Source> sources, store_->ListSources(after, size + 1));
  handoff::v1::ListSourcesResponse response;
  for (int i = 0; i < static_cast<int>(sources.size()) && i < size; ++i) {
    ASSIGN_OR_RETURN(*response.add_sources(), WithProgress(sources[i]));
  }
  if (static_cast<int>(sources.size()) > size) {
    response.set_next_page_token(EncodeToken("ListSources", "", sources[size - 1].spec().id()));
  }
  return response;
}

// Lists the records of a staged family (holds or quarantine), of one source or all, in
// key order, paginated by the last key returned. `Response` has `Item* add()`-style
// access through `add`.
template <typename Record, typename AddFn>
absl::StatusOr<std::string> SourceManagerImpl::ListStaged(store::StagedFamily family,
                                                          const std::string& source_id,
                                                          int page_size,
                                                          const std::string& page_token,
                                                          const AddFn& add) {
  ASSIGN_OR_RETURN(int size, PageSize(page_size, 100, 1000, "page_size"));
  if (!source_id.empty()) {
    RETURN_IF_ERROR(ValidateSourceId(source_id, "source_id"));
  }
  const absl::string_view call =
      family == store::StagedFamily::kHolds ? "ListHolds" : "ListQuarantine";
  ASSIGN_OR_RETURN(std::string after, DecodeToken(page_token, call, source_id));
  std::string prefix;
  if (!source_id.empty()) {
    RETURN_IF_ERROR(store_->GetSource(source_id).status());
    prefix = store::keys::SourcePrefix(source_id);
    if (after.empty()) after = prefix;
  }
  std::string last_key;
  bool more = false;
  int count = 0;
  size_t bytes = 0;
  absl::Status parse_error;
  RETURN_IF_ERROR(store_->ScanAll(family, after, [&](absl::string_view key,
                                                     absl::string_view value) {
    if (!prefix.empty() && !absl::StartsWith(key, prefix)) return false;
    if (count == size || (count > 0 && bytes + value.size() > kMaxReplyBytes)) {
      more = true;
      return false;
    }
    bytes += value.size();
    Record* record = add();
    if (!record->ParseFromArray(value.data(), value.size())) {
      parse_error = absl::DataLossError("unreadable hold or quarantine record");
      return false;
    }
    ++count;
    last_key = std::string(key);
    return true;
  }));
  RETURN_IF_ERROR(parse_error);
  return more ? EncodeToken(call, source_id, last_key) : std::string();
}

absl::StatusOr<handoff::v1::ListHoldsResponse> SourceManagerImpl::ListHolds(
    const handoff::v1::ListHoldsRequest& request) {
  handoff::v1::ListHoldsResponse response;
  ASSIGN_OR_RETURN(std::string next,
                   ListStaged<handoff::v1::Hold>(store::StagedFamily::kHolds, request.source_id(),
                                                 request.page_size(), request.page_token(),
                                                 [&] { return response.add_holds(); }));
  response.set_next_page_token(next);
  return response;
}

absl::StatusOr<handoff::v1::Hold> SourceManagerImpl::GetHold(
    const handoff::v1::GetHoldRequest& request) {
  RETURN_IF_ERROR(ValidateSourceId(request.source_id(), "source_id"));
  RETURN_IF_ERROR(RequireStage(request.stage()));
  ASSIGN_OR_RETURN(std::optional<std::string> value,
                   store_->GetStaged(store::StagedFamily::kHolds, request.source_id(),
                                     StageOf(request.stage()),
                                     Position{request.block_number(), request.log_index()}));
  if (!value.has_value()) {
    return absl::NotFoundError(absl::StrCat("no hold of '", request.source_id(), "' at ",
                                            request.block_number(), ":", request.log_index()));
  }
  handoff::v1::Hold hold;
  if (!hold.ParseFromString(*value)) return absl::DataLossError("unreadable hold record");
  return hold;
}

absl::StatusOr<handoff::v1::ResolveHoldResponse> SourceManagerImpl::ResolveHold(
    const handoff::v1::ResolveHoldRequest& request, absl::string_view actor) {
  RETURN_IF_ERROR(CheckOpen());
  RETURN_IF_ERROR(ValidateSourceId(request.source_id(), "source_id"));
  RETURN_IF_ERROR(RequireStage(request.stage()));
  if (request.decision() != handoff::v1::HOLD_DECISION_RETRY &&
      request.decision() != handoff::v1::HOLD_DECISION_QUARANTINE &&
      request.decision() != handoff::v1::HOLD_DECISION_IGNORE) {
    return absl::InvalidArgumentError(
        "decision: HOLD_DECISION_RETRY, HOLD_DECISION_QUARANTINE or HOLD_DECISION_IGNORE");
  }
  if (request.reason().empty()) return absl::InvalidArgumentError("reason: required");
  if (request.reason().size() > 4096) return absl::InvalidArgumentError("reason: at most 4096 bytes");
  if (request.hold_version() == 0) {
    return absl::InvalidArgumentError("hold_version: required (the version from GetHold)");
  }
  handoff::v1::GetHoldRequest get;
  get.set_source_id(request.source_id());
  get.set_stage(request.stage());
  get.set_block_number(request.block_number());
  get.set_log_index(request.log_index());
  ASSIGN_OR_RETURN(handoff::v1::Hold hold, GetHold(get));
  if (hold.version() != request.hold_version()) {
    return absl::AbortedError(absl::StrCat("hold_version ", request.hold_version(),
                                           " is stale: the hold is at version ", hold.version(),
                                           "; nothing changed, GetHold and decide again"));
  }
  const store::Stage stage = StageOf(request.stage());
  const Position pos{request.block_number(), request.log_index()};
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::unique_ptr<store::StepBatch> step = store_->NewStep(request.source_id());
  handoff::v1::ResolveHoldResponse response;
  store::CounterRecord deltas;
  if (request.decision() == handoff::v1::HOLD_DECISION_RETRY) {
    // Re-drive now: the hold becomes a fresh RETRYING hold (attempts reset); its new
    // version tells the worker to deliver at once. The audit stays on the hold.
    handoff::v1::Hold retry = hold;
    retry.set_kind(handoff::v1::HOLD_KIND_RETRYING);
    retry.set_attempts(0);
    retry.set_version(hold.version() + 1);
    retry.set_reason(absl::StrCat("RETRY by ", actor, " at ", now_ms, " from hold version ",
                                  hold.version(), ": ", request.reason()));
    retry.set_last_seen_unix_ms(now_ms);
    step->PutHold(stage, pos, retry);
  } else {
    const bool ignore = request.decision() == handoff::v1::HOLD_DECISION_IGNORE;
    handoff::v1::QuarantineRecord rec;
    rec.set_source_id(request.source_id());
    rec.set_stage(request.stage());
    *rec.mutable_event() = hold.event();
    rec.set_disposition(ignore ? handoff::v1::DISPOSITION_IGNORED
                               : handoff::v1::DISPOSITION_QUARANTINED);
    rec.set_reason(request.reason());
    rec.set_actor(std::string(actor));
    rec.set_decided_unix_ms(now_ms);
    rec.set_from_hold_version(hold.version());
    store::ReceiptRecord receipt;
    receipt.set_block_hash(hold.event().block_hash());
    receipt.set_outcome(ignore ? store::RECEIPT_IGNORED : store::RECEIPT_QUARANTINED);
    receipt.set_unix_ms(now_ms);
    step->PutReceipt(stage, pos, receipt);
    step->PutQuarantine(stage, pos, rec);
    step->DeleteHold(stage, pos);
    if (stage == store::Stage::kIngest) {
      // The row is the ingest receipt: the event now has a durable terminal outcome.
      step->PutRow(pos, store::EncodeRow(hold.event_row()));
      absl::StatusOr<handoff::v1::Source> source = store_->GetSource(request.source_id());
      if (source.ok() && IsGated(source->spec())) {
        step->PutOutbox(pos);  // stands for the row put above
      }
    } else {
      step->DeleteOutbox(pos);
    }
    if (ignore) {
      deltas.set_ignored(1);
    } else {
      deltas.set_quarantined(1);
    }
    *response.mutable_record() = rec;
  }
  // Fenced by the hold the operator read, whose version never repeats at its position
  // (store.h): a hold changed since, or another event's hold there since a correction or
  // a rebuild, fails it and nothing is written. The commit also moves the checkpoint's
  // step_seq, so a step the worker has in flight for this event (a retry whose sink call
  // is out) is ABORTED and rereads: the operator's decision is never overwritten.
  store::Fence fence;
  fence.any_version = true;
  fence.hold = store::Fence::HoldPrecondition{stage, pos, hold.version()};
  store::CheckpointUpdate update;
  update.counter_deltas = deltas;
  RETURN_IF_ERROR(store_->CommitStep(stage, step.get(), fence, update).status());
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.source_id());
  if (it != workers_.end()) it->second->Poke();
  return response;
}

absl::StatusOr<handoff::v1::ListQuarantineResponse> SourceManagerImpl::ListQuarantine(
    const handoff::v1::ListQuarantineRequest& request) {
  handoff::v1::ListQuarantineResponse response;
  ASSIGN_OR_RETURN(std::string next, ListStaged<handoff::v1::QuarantineRecord>(
                                         store::StagedFamily::kQuarantine, request.source_id(),
                                         request.page_size(), request.page_token(),
                                         [&] { return response.add_records(); }));
  response.set_next_page_token(next);
  return response;
}

absl::StatusOr<handoff::v1::Source> SourceManagerImpl::RebuildSource(
    const handoff::v1::RebuildSourceRequest& request) {
  RETURN_IF_ERROR(CheckOpen());
  RETURN_IF_ERROR(ValidateSourceId(request.source_id(), "source_id"));
  if (request.from_block() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError("from_block: at most 2^63-1");
  }
  {
    absl::ReaderMutexLock ops(&ops_mu_);
    KeyedMutex::Lock source_op(&source_ops_, request.source_id());
    ASSIGN_OR_RETURN(handoff::v1::Source source, store_->GetSource(request.source_id()));
    if (IsRunning(request.source_id())) {
      return absl::FailedPreconditionError(
          absl::StrCat("source '", request.source_id(), "' is running: StopSource first"));
    }
    RETURN_IF_ERROR(StopLocked(request.source_id()));
    // The record (stopped, no halt) before the reset, which is another write: a crash
    // between them must not leave the rebuilt checkpoints to a record that Recover starts
    // (a halted source keeps desired_running). A rebuild cut short leaves the source
    // stopped, as start=false asks, and start=true waits for the operator's new request.
    source.mutable_progress()->Clear();
    source.set_desired_running(false);
    RETURN_IF_ERROR(store_->PutSource(source));
    RETURN_IF_ERROR(InitCheckpoints(source.spec(), request.from_block(), /*latest=*/false));
    if (options_.crash_after_rebuild_reset && options_.crash_after_rebuild_reset()) {
      return absl::AbortedError("test: crashed after the rebuild's reset");
    }
    if (request.start()) {
      source.set_desired_running(true);
      RETURN_IF_ERROR(store_->PutSource(source));
    }
    absl::StatusOr<handoff::v1::Progress> p = ProgressFromStore(source);
    if (p.ok()) board_.Update(source.spec().id(), [&](handoff::v1::Progress* out) { *out = *p; });
    if (request.start()) RETURN_IF_ERROR(StartRecordedLocked(source));
  }
  return GetSource(request.source_id());
}

absl::StatusOr<handoff::v1::QueryEventsResponse> SourceManagerImpl::QueryEvents(
    const handoff::v1::QueryEventsRequest& request) {
  RETURN_IF_ERROR(ValidateSourceId(request.source_id(), "source_id"));
  ASSIGN_OR_RETURN(int size, PageSize(request.page_size(), 1000, 10000, "page_size"));
  if (request.to_block() != 0 && request.to_block() < request.from_block()) {
    return absl::InvalidArgumentError("to_block: must be at least from_block (or 0: no bound)");
  }
  const std::string scope =
      absl::StrCat(request.source_id(), "/", request.from_block(), "/", request.to_block());
  ASSIGN_OR_RETURN(std::string token, DecodeToken(request.page_token(), "QueryEvents", scope));
  Position from{request.from_block(), 0};
  const Position to{request.to_block() == 0 ? kMaxIndex : request.to_block(), kMaxIndex};
  if (!token.empty()) {
    if (token.size() != 16) return absl::InvalidArgumentError("page_token: malformed");
    from = Position{store::keys::DecodeBigEndian64(token.data()),
                    store::keys::DecodeBigEndian64(token.data() + 8)};
    // A token this call made lies in the asked range; a forged one may not.
    if (from.block < request.from_block() || to < from) {
      return absl::InvalidArgumentError("page_token: outside [from_block, to_block]");
    }
  }
  RETURN_IF_ERROR(store_->GetSource(request.source_id()).status());
  handoff::v1::QueryEventsResponse response;
  // The checkpoint and the rows of one durable view: a running worker's last page may
  // be written but not yet synced (WorkerOptions::max_unsynced_pages), and a caller
  // must never see rows that a power loss could take back.
  ASSIGN_OR_RETURN(std::unique_ptr<store::Store::Snapshot> view, store_->NewSyncedSnapshot());
  ASSIGN_OR_RETURN(store::CheckpointRecord cp,
                   store_->LoadCheckpoint(request.source_id(), store::Stage::kIngest, view.get()));
  *response.mutable_checkpoint() = PublicCheckpoint(cp);
  absl::Status parse_error;
  std::optional<Position> next;
  store::RowDecoder decoder;
  size_t bytes = 0;
  RETURN_IF_ERROR(store_->ScanRows(
      request.source_id(), from, to,
      [&](Position pos, absl::string_view value) {
        if (response.rows_size() == size) {
          next = pos;
          return false;
        }
        handoff::v1::EventRow* row = response.add_rows();
        parse_error = decoder.Decode(value, row);
        if (!parse_error.ok()) return false;
        const size_t row_bytes = row->ByteSizeLong();
        if (response.rows_size() > 1 && bytes + row_bytes > kMaxReplyBytes) {
          response.mutable_rows()->RemoveLast();
          next = pos;
          return false;
        }
        bytes += row_bytes;
        return true;
      },
      view.get()));
  RETURN_IF_ERROR(parse_error);
  // Its worker publishes that page once its own wait for the same sync returns: wait
  // for it (briefly), so that GetProgress never shows this caller an older checkpoint.
  if (IsRunning(request.source_id())) {
    board_.AwaitCheckpointVersion(request.source_id(), cp.version(),
                                  absl::Now() + absl::Seconds(1));
  }
  if (next.has_value()) {
    std::string raw;
    store::keys::AppendBigEndian64(&raw, next->block);
    store::keys::AppendBigEndian64(&raw, next->log_index);
    response.set_next_page_token(EncodeToken("QueryEvents", scope, raw));
  }
  return response;
}

std::vector<handoff::v1::Progress> SourceManagerImpl::AllProgress() { return board_.All(); }

}  // namespace handoff::consumer
