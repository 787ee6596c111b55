#include "consumer/source_worker.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "consumer/fault_points.h"
#include "consumer/outcome_policy.h"
#include "consumer/page_validator.h"
#include "consumer/row_pool.h"
#include "base/thread_priority.h"
#include "store/row_codec.h"

namespace handoff::consumer {
bool IsHaltedState(handoff::v1::SourceState s) {
  switch (s) {
    case handoff::v1::SOURCE_STATE_RESYNC_REQUIRED:
    case handoff::v1::SOURCE_STATE_FUNDING_REQUIRED:
    case handoff::v1::SOURCE_STATE_AUTH_FAILED:
    case handoff::v1::SOURCE_STATE_CONFIG_INVALID:
    case handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION:
    case handoff::v1::SOURCE_STATE_STORAGE_FAILED:
      return true;
    default:
      return false;
  }
}

handoff::v1::Checkpoint PublicCheckpoint(const store::CheckpointRecord& cp) {
  handoff::v1::Checkpoint out;
  out.set_resume_cursor(cp.resume_cursor());
  out.set_has_applied(cp.has_applied());
  out.set_applied_block(cp.applied_block());
  out.set_applied_log_index(cp.applied_log_index());
  out.set_checkpoint_version(cp.version());
  return out;
}

namespace {

using Kind = PageAttempt::Result::Kind;

constexpr char kNoNewEvents[] = "no new events";
// The least time between two heartbeats a stream's worker takes (IngestLoop).
constexpr absl::Duration kStreamHeartbeatFloor = absl::Milliseconds(100);

// Pages of at most this many events are destroyed inline: handing them to the
// deleter would cost a thread wake-up, more than freeing them.
constexpr size_t kInlineReleaseMaxItems = 64;


Position Successor(Position p) {
  if (p.log_index == std::numeric_limits<uint64_t>::max()) return Position{p.block + 1, 0};
  return Position{p.block, p.log_index + 1};
}

// Where a run after `last` starts; none after the very last position.
std::optional<Position> NextRunStart(Position last) {
  if (last == Position{std::numeric_limits<uint64_t>::max(),
                       std::numeric_limits<uint64_t>::max()}) {
    return std::nullopt;
  }
  return Successor(last);
}

}  // namespace

// Progress fields derived from a checkpoint, shared with SourceManager.
void FillProgressFromCheckpoint(const store::CheckpointRecord& cp, handoff::v1::Progress* p) {
  *p->mutable_checkpoint() = PublicCheckpoint(cp);
  if (cp.highest_finalized().present()) {
    p->mutable_highest_finalized()->set_number(cp.highest_finalized().number());
    p->mutable_highest_finalized()->set_hash(cp.highest_finalized().hash());
  }
  if (cp.highest_safe().present()) {
    p->mutable_highest_safe()->set_number(cp.highest_safe().number());
    p->mutable_highest_safe()->set_hash(cp.highest_safe().hash());
  }
  p->set_tip(cp.tip());
  p->set_lag_blocks(cp.tip() > cp.applied_block() && cp.has_applied() ? cp.tip() - cp.applied_block()
                                                                       : 0);
  handoff::v1::Counters* c = p->mutable_counters();
  const store::CounterRecord& r = cp.counters();
  c->set_applied(r.applied());
  c->set_replayed(r.replayed());
  c->set_ignored(r.ignored());
  c->set_quarantined(r.quarantined());
  c->set_corrections(r.corrections());
  c->set_pages_committed(r.pages_committed());
}

SourceWorker::SourceWorker(handoff::v1::SourceSpec spec, WorkerOptions options, Parts parts)
    : spec_(std::move(spec)),
      options_(options),
      parts_(std::move(parts)),
      gated_(spec_.sink().has_downstream() &&
             (spec_.sink().gate() == handoff::v1::DELIVERY_GATE_SAFE ||
              spec_.sink().gate() == handoff::v1::DELIVERY_GATE_FINALIZED)),
      unrecorded_sends_(spec_.sink().has_downstream() &&
                                spec_.sink().gate() == handoff::v1::DELIVERY_GATE_FINALIZED
                            ? std::make_unique<UnrecordedSends>(parts_.store, spec_.id())
                            : nullptr) {}

SourceWorker::~SourceWorker() {
  RequestStop();
  Join();
}

void SourceWorker::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_) return;
    started_ = true;
    running_threads_ = gated_ ? 2 : 1;
  }
  SetState(handoff::v1::SOURCE_STATE_STARTING, "");
  // Best effort: a thread that cannot change its priority or name still works.
  auto set_up_thread = [this](absl::string_view role) {
    NameCurrentThread(ThreadName(role, spec_.id())).IgnoreError();
    LowerCurrentThreadPriority(options_.thread_nice).IgnoreError();
    if (options_.thread_sched_idle) UseIdleSchedulingForCurrentThread().IgnoreError();
  };
  ingest_thread_ = std::thread([this, set_up_thread] {
    set_up_thread("in");
    IngestLoop();
  });
  if (gated_) {
    delivery_thread_ = std::thread([this, set_up_thread] {
      set_up_thread("dl");
      DeliveryLoop();
    });
  }
}

void SourceWorker::CrashAtFaultPoint() {
  // The process "dies" here (a test's fault point): nothing more is written. The other
  // thread of this source must end too, also if it waits for news or a hold: as a stop,
  // which wakes and cancels it.
  crashed_.store(true);
  RequestStop();
}

void SourceWorker::RequestStop() {
  if (stop_.exchange(true)) return;
  if (parts_.provider != nullptr) parts_.provider->Cancel();
  if (parts_.sink != nullptr) parts_.sink->Cancel();
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();
}

bool SourceWorker::Join(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + timeout;
    while (running_threads_ > 0) {
      if (cv_.WaitWithDeadline(&mu_, deadline) && running_threads_ > 0 &&
          absl::Now() >= deadline) {
        return false;
      }
    }
  }
  if (ingest_thread_.joinable()) ingest_thread_.join();
  if (delivery_thread_.joinable()) delivery_thread_.join();
  return true;
}

void SourceWorker::Poke() {
  absl::MutexLock lock(&mu_);
  ingest_poked_ = true;
  delivery_poked_ = true;
  delivery_run_poked_ = true;
  cv_.SignalAll();
}

void SourceWorker::PokeDelivery(bool rewrote_outbox) {
  absl::MutexLock lock(&mu_);
  delivery_poked_ = true;
  if (rewrote_outbox) delivery_run_poked_ = true;
  cv_.SignalAll();
}

void SourceWorker::HaltForStoreFailure(const absl::Status& failure) {
  if (stop_.load()) return;  // stopping, or halted already (a halt stops)
  Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
       absl::StrCat("the store failed: ", failure.message()), failure);
}

bool SourceWorker::finished() const {
  absl::MutexLock lock(&mu_);
  return started_ && running_threads_ == 0;
}

void SourceWorker::ThreadDone() {
  absl::MutexLock lock(&mu_);
  --running_threads_;
  cv_.SignalAll();
}

SourceWorker::Wake SourceWorker::WaitUntil(absl::Time deadline, bool* poked_flag) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (stop_.load()) return Wake::kStopped;
    if (*poked_flag) {
      *poked_flag = false;
      return Wake::kPoked;
    }
    if (cv_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      if (stop_.load()) return Wake::kStopped;
      if (*poked_flag) {
        *poked_flag = false;
        return Wake::kPoked;
      }
      return Wake::kDeadline;
    }
  }
}

std::optional<FetchResult> SourceWorker::AwaitNews(const store::CheckpointRecord& cp,
                                                   Backoff* idle_backoff, absl::Time at) {
  ParkedPoll parked;
  parked.provider = parts_.provider.get();
  parked.cursor = cp.resume_cursor();
  parked.backoff = idle_backoff;
  parked.at = at;
  // The verdict this worker's attempt would reach (PageAttempt::Validate); any page that
  // needs more than that comes back here.
  parked.nothing_new = [&cp](const Page& page) {
    return NothingNewWithoutReceipts(page, cp.resume_cursor(), cp);
  };
  // Later polls move retry_at only, as the worker's own would.
  parked.on_nothing_new = [this](absl::Time next) {
    SetState(handoff::v1::SOURCE_STATE_BACKING_OFF, kNoNewEvents, next);
  };
  parked.on_result = [this](FetchResult r) {
    absl::MutexLock lock(&mu_);
    news_ = std::move(r);
    news_ready_ = true;
    cv_.SignalAll();
  };
  parts_.idle_poller->Park(&parked);
  const Wake wake = WaitUntil(absl::InfiniteFuture(), &news_ready_);
  parts_.idle_poller->Unpark(&parked);  // after it, on_result cannot run
  absl::MutexLock lock(&mu_);
  news_ready_ = false;
  std::optional<FetchResult> out = std::move(news_);
  news_.reset();
  if (wake == Wake::kStopped) return std::nullopt;
  return out;
}

void SourceWorker::SetState(handoff::v1::SourceState state, const std::string& reason,
                            absl::Time retry_at) {
  bool changed = true;
  parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
    // A halt stays what the board shows. Checked under the board's lock: Halt sets
    // halted_ before its own update, so a state set by another thread cannot land after it.
    if (halted_.load()) {
      changed = false;
      return;
    }
    changed = p->state() != state || p->reason() != reason;
    p->set_state(state);
    p->set_reason(reason);
    p->set_retry_at_unix_ms(retry_at == absl::InfinitePast() ? 0 : absl::ToUnixMillis(retry_at));
    if (!IsHaltedState(state)) p->clear_funding_action();
  });
  if (changed && parts_.observer != nullptr) {
    parts_.observer->OnStateChange(spec_.id(), state, reason);
  }
}

void SourceWorker::Halt(handoff::v1::SourceState state, const std::string& reason,
                        const absl::Status& error, const std::string& funding) {
  halted_.store(true);
  // Both threads of this source stop, before the connection is closed: a Fetch the close
  // wakes must not be taken for a provider's refusal (a BACKING_OFF over this halt), and
  // no new connection may be opened (Cancel: any later Fetch answers at once).
  stop_.store(true);
  if (parts_.provider != nullptr) {
    parts_.provider->Cancel();
    parts_.provider->Close();
  }
  if (parts_.sink != nullptr) parts_.sink->Cancel();
  handoff::v1::Progress snapshot;
  parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
    p->set_state(state);
    p->set_reason(reason);
    p->set_retry_at_unix_ms(0);
    p->set_funding_action(funding);
    if (!error.ok()) {
      p->mutable_last_error()->set_code(static_cast<int>(error.code()));
      p->mutable_last_error()->set_message(std::string(error.message()));
      p->mutable_last_error()->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
    }
    snapshot = *p;
  });
  if (parts_.observer != nullptr) {
    parts_.observer->OnStateChange(spec_.id(), state, reason);
    if (!error.ok()) parts_.observer->OnError(spec_.id(), error);
  }
  if (parts_.persist_halt) parts_.persist_halt(snapshot);
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();
}

void SourceWorker::PublishCheckpoint(store::Stage stage, const store::CheckpointRecord& cp) {
  if (stage == store::Stage::kIngest) {
    absl::MutexLock lock(&mu_);
    published_ingest_ = cp;
  }
  parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
    if (stage == store::Stage::kIngest) {
      FillProgressFromCheckpoint(cp, p);
    } else {
      *p->mutable_delivery_checkpoint() = PublicCheckpoint(cp);
      p->mutable_counters()->set_delivered(cp.counters().delivered());
    }
  });
}

void SourceWorker::PublishAttempt(const PageAttempt* attempt) {
  parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
    if (attempt == nullptr) {
      p->clear_attempt();
    } else {
      *p->mutable_attempt() = attempt->Info();
    }
  });
}

AttemptConfig MakeAttemptConfig(const handoff::v1::SourceSpec& spec, store::Stage stage,
                                store::Store* store, ExternalSink* sink,
                                TransactionalEffect* effect, EngineObserver* observer,
                                const WorkerOptions& options,
                                const std::atomic<bool>* cancelled) {
  const bool gated = spec.sink().has_downstream() &&
                     (spec.sink().gate() == handoff::v1::DELIVERY_GATE_SAFE ||
                      spec.sink().gate() == handoff::v1::DELIVERY_GATE_FINALIZED);
  AttemptConfig c;
  c.source_id = spec.id();
  c.stage = stage;
  c.store = store;
  c.policy = NormalizedPolicy(spec.failure_policy());
  c.max_events_per_step = options.max_events_per_step;
  c.fuse_barrier = options.fuse_barrier;
  c.observer = observer;
  c.cancelled = cancelled;
  c.gate = spec.sink().gate();
  if (stage == store::Stage::kIngest) {
    c.sink = gated ? nullptr : sink;
    c.effect = effect;
    c.write_outbox = gated;
  } else {
    c.sink = sink;
  }
  return c;
}

void SourceWorker::Release(std::unique_ptr<PageAttempt> attempt) {
  if (parts_.deleter != nullptr && attempt->page().items.size() > kInlineReleaseMaxItems) {
    parts_.deleter->Delete(std::move(attempt));
  }  // else destroyed here
}

void SourceWorker::NoteWriteBelowGate(const store::StepBatch& step) {
  const std::optional<Position>& low = step.lowest_outbox_write();
  if (!gated_ || !low.has_value() || !applied_high_.has_value() || *applied_high_ < *low) return;
  unpublished_writes_.Note(ingest_page_seq_, *low);
}

AttemptConfig SourceWorker::MakeConfig(store::Stage stage) {
  AttemptConfig c = MakeAttemptConfig(spec_, stage, parts_.store, parts_.sink.get(),
                                      parts_.effect, parts_.observer, options_, &stop_);
  c.unrecorded_sends = unrecorded_sends_.get();
  if (stage == store::Stage::kIngest && options_.max_unsynced_pages > 0) {
    c.defer_barrier_sync = true;
    // After this commit at most max_unsynced_pages are unsynced.
    c.before_commit = [this](const store::StepBatch& step) {
      NoteWriteBelowGate(step);
      return SettleUnsynced(static_cast<size_t>(options_.max_unsynced_pages - 1));
    };
  }
  return c;
}

bool SourceWorker::DriveAttempt(PageAttempt* attempt, store::Stage stage) {
  bool* poked = nullptr;
  {
    absl::MutexLock lock(&mu_);
    poked = stage == store::Stage::kIngest ? &ingest_poked_ : &delivery_run_poked_;
  }
  while (true) {
    PageAttempt::Result r = attempt->Run();
    if (stage == store::Stage::kIngest) {
      if (r.unsynced.has_value()) {
        // The page, its checkpoint and its attempt's progress are published by
        // SettleUnsynced once synced.
        r.unsynced->attempt_info = attempt->Info();
        r.unsynced->page_seq = ingest_page_seq_;
        unsynced_.push_back(*std::move(r.unsynced));
        return true;
      }
      // Nothing of this attempt waits for a sync: the previous pages are published before
      // the worker waits, halts or leaves (a crash, here or at a fault point while an
      // earlier page settled, abandons them as they are), and then this attempt, whose
      // progress (its first blocking event) must not be overwritten by theirs.
      if (r.kind != Kind::kCrashed && !crashed_.load() && !SettleOrHalt()) return false;
      PublishAttempt(attempt);
    }
    switch (r.kind) {
      case Kind::kPromoted:
        PublishCheckpoint(stage, attempt->checkpoint());
        if (stage == store::Stage::kIngest) unpublished_writes_.Published(ingest_page_seq_);
        return true;
      case Kind::kNothingNew:
        return true;  // the caller backs off
      case Kind::kLostRace:
        if (stage == store::Stage::kIngest) unpublished_writes_.Discard(ingest_page_seq_);
        return true;  // reread the checkpoint
      case Kind::kCrashed:
        CrashAtFaultPoint();
        return false;
      case Kind::kCancelled:
        return false;
      case Kind::kViolation:
        Halt(handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION, r.detail);
        return false;
      case Kind::kStorageFailed:
        Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED, r.detail, r.status);
        return false;
      case Kind::kBlockedOnHold:
      case Kind::kRetryLater: {
        // The wait may last hours (an operator's hold) or minutes (a backoff): the page
        // gives its PageBudget slot back and what was fetched ahead is dropped, so that
        // no slot is held for the wait.
        const bool hold = r.kind == Kind::kBlockedOnHold;
        const bool ingest = stage == store::Stage::kIngest;
        const absl::Time until = hold ? absl::InfiniteFuture() : r.retry_at;
        attempt->ReleasePageSlot();
        if (ingest) parts_.provider->DropReadAhead();
        PublishCheckpoint(stage, attempt->checkpoint());
        if (ingest) {
          SetState(hold ? handoff::v1::SOURCE_STATE_BLOCKED_ON_HOLD
                        : handoff::v1::SOURCE_STATE_BACKING_OFF,
                   r.detail, hold ? absl::InfinitePast() : r.retry_at);
        }
        if (WaitUntil(until, poked) == Wake::kStopped) return false;
        if (!ingest) FaultPoints::Hit("delivery.woken");  // an interleaving point
        if (ingest) SetState(handoff::v1::SOURCE_STATE_RUNNING, "");
        break;
      }
    }
  }
}

absl::Status SourceWorker::SettleUnsynced(size_t keep) {
  auto crash = [this] {
    CrashAtFaultPoint();
    return absl::CancelledError("crashed at a fault point");
  };
  while (!unsynced_.empty()) {
    if (unsynced_.size() <= keep && !parts_.store->IsSynced(unsynced_.front().ticket)) break;
    RETURN_IF_ERROR(parts_.store->AwaitSynced(unsynced_.front().ticket));
    const UnsyncedBarrier u = std::move(unsynced_.front());
    unsynced_.pop_front();
    if (parts_.observer != nullptr) {
      parts_.observer->OnCommit(spec_.id(), u.events, absl::Now() - u.commit_start);
      if (u.correction_depth.has_value()) {
        parts_.observer->OnCorrection(spec_.id(), *u.correction_depth);
      }
    }
    if (!u.after_point.empty() && FaultPoints::Hit(u.after_point)) return crash();
    if (parts_.observer != nullptr) parts_.observer->OnPageCommitted(spec_.id());
    if (FaultPoints::Hit("ingest.after_barrier")) return crash();
    parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
      *p->mutable_attempt() = u.attempt_info;
    });
    PublishCheckpoint(store::Stage::kIngest, u.checkpoint);
    unpublished_writes_.Published(u.page_seq);
    if (gated_) PokeDelivery(u.replaced_history);
  }
  return absl::OkStatus();
}

bool SourceWorker::SettleOrHalt(size_t keep) {
  absl::Status s = SettleUnsynced(keep);
  if (s.ok()) return true;
  if (!absl::IsCancelled(s) && !halted_.load()) {
    Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
         absl::StrCat("the sync of a committed page failed: ", s.message()), s);
  }
  return false;
}

void SourceWorker::IngestLoop() {
  Backoff backoff(options_.fetch_backoff);
  Backoff idle_backoff(options_.idle_backoff);
  // Caught up: the last poll found nothing new. The state stays BACKING_OFF ("no new
  // events") across the next polls instead of flipping to RUNNING and back for each.
  bool idle = false;
  // When the last heartbeat of a stream was taken (nothing-new from a stream).
  absl::Time last_heartbeat = absl::InfinitePast();
  int malformed = 0;
  const std::string identity = store::IdentityHash(spec_);
  bool running_published = false;
  // The checkpoint a nothing-new poll left as it was: the next poll reuses it instead
  // of reading it again (about a sixth of a caught-up source's CPU went to that read,
  // measured). Safe: while this worker runs, only it moves its ingest
  // checkpoint (RebuildSource needs the source stopped; no ingest hold exists once
  // every page up to the cursor passed its barrier), and every commit is fenced by
  // version and step_seq, so a stale copy could only lose a race and be reread.
  std::optional<store::CheckpointRecord> unchanged;
  // The same for every page of this run (the spec and parts do not change while it runs).
  const AttemptConfig config = MakeConfig(store::Stage::kIngest);
  // The first poll after a caught-up wait that found more than nothing new, made by
  // the IdlePoller at the checkpoint's cursor: handled here as if fetched below.
  std::optional<FetchResult> news;
  while (!stopping()) {
    absl::StatusOr<store::CheckpointRecord> cp =
        unchanged.has_value() ? absl::StatusOr<store::CheckpointRecord>(*std::move(unchanged))
                              : parts_.store->LoadCheckpoint(spec_.id(), store::Stage::kIngest);
    unchanged.reset();
    if (!cp.ok()) {
      Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
           absl::StrCat("cannot load the checkpoint: ", cp.status().message()), cp.status());
      break;
    }
    if (cp->identity_hash() != identity) {
      Halt(handoff::v1::SOURCE_STATE_CONFIG_INVALID,
           "the source identity (provider URL, chain, source, filter) differs from the one "
           "its checkpoint was written for; RebuildSource from a numeric block");
      break;
    }
    if (!running_published) {
      PublishCheckpoint(store::Stage::kIngest, *cp);
      SetState(handoff::v1::SOURCE_STATE_RUNNING, "");
      running_published = true;
    }
    // The unsynced pages overlap their syncs only with pages that are already here:
    // before a Fetch that could wait (an SSE stream at the head waits for the next
    // block) they are published; otherwise those already synced are.
    if (!unsynced_.empty() &&
        !SettleOrHalt(parts_.provider->Ready(cp->resume_cursor()) ? unsynced_.size() : 0)) {
      break;
    }
    FetchResult fetched = news.has_value() ? *std::move(news)
                                           : parts_.provider->Fetch(cp->resume_cursor());
    news.reset();
    if (stopping()) break;
    if (fetched.refusal.has_value()) {
      const Refusal& f = *fetched.refusal;
      if (f.kind == RefusalKind::kCancelled) break;
      // The previous page is published before the worker backs off or halts.
      if (!SettleOrHalt()) break;
      if (parts_.observer != nullptr) {
        parts_.observer->OnRefusal(spec_.id(), f.code.empty() ? "network" : f.code);
      }
      parts_.board->Update(spec_.id(), [&](handoff::v1::Progress* p) {
        p->mutable_last_error()->set_code(f.http_status);
        p->mutable_last_error()->set_message(
            absl::StrCat(f.code.empty() ? "" : f.code + ": ", f.message));
        p->mutable_last_error()->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
      });
      const std::string reason =
          absl::StrCat("provider refused (", f.http_status, " ", f.code, "): ", f.message);
      switch (f.kind) {
        case RefusalKind::kResyncRequired:
          Halt(handoff::v1::SOURCE_STATE_RESYNC_REQUIRED, reason);
          break;
        case RefusalKind::kConfigInvalid:
          Halt(handoff::v1::SOURCE_STATE_CONFIG_INVALID, reason);
          break;
        case RefusalKind::kAuthFailed:
          Halt(handoff::v1::SOURCE_STATE_AUTH_FAILED, reason);
          break;
        case RefusalKind::kFundingRequired:
          Halt(handoff::v1::SOURCE_STATE_FUNDING_REQUIRED, reason, absl::OkStatus(),
               f.funding_action_json);
          break;
        case RefusalKind::kMalformedPage:
          if (++malformed >= options_.max_malformed_pages) {
            Halt(handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION,
                 absl::StrCat(malformed, " malformed pages in a row; last: ", f.message));
            break;
          }
          [[fallthrough]];
        case RefusalKind::kRetryAfter:
        case RefusalKind::kTransient:
        case RefusalKind::kCancelled: {
          if (parts_.observer != nullptr) parts_.observer->OnRetry(spec_.id());
          const absl::Time at = absl::Now() + backoff.Next(f.retry_after);
          SetState(handoff::v1::SOURCE_STATE_BACKING_OFF, reason, at);
          bool unused = false;
          if (WaitUntil(at, &unused) == Wake::kStopped) break;
          SetState(handoff::v1::SOURCE_STATE_RUNNING, "");
          idle = false;
          continue;
        }
      }
      break;  // halted or stopped
    }
    malformed = 0;
    if (FaultPoints::Hit("ingest.after_fetch")) {
      CrashAtFaultPoint();
      break;
    }
    if (cp->resume_cursor() == kLatestCursor) {
      // Asked again (after a hold, a lost race or a restart), "latest" would name a
      // newer page, whose start would leave the rest of this one behind: the cursor is
      // pinned to this page's start block, a `from` the provider accepts, before
      // anything of it is applied.
      absl::StatusOr<store::CheckpointRecord> pinned = parts_.store->CompareAndSwap(
          spec_.id(), store::Stage::kIngest, kLatestCursor, cp->version(),
          absl::StrCat(fetched.page->from));
      if (absl::IsAborted(pinned.status())) continue;  // moved meanwhile: reread
      if (!pinned.ok()) {
        Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
             absl::StrCat("cannot pin the first page's cursor: ", pinned.status().message()),
             pinned.status());
        break;
      }
      cp = *std::move(pinned);
    }
    if (!applied_high_.has_value() && cp->has_applied()) {
      applied_high_ = Position{cp->applied_block(), cp->applied_log_index()};
    }
    ++ingest_page_seq_;
    auto attempt = std::make_unique<PageAttempt>(config,
                                                 *std::move(cp), *std::move(fetched.page));
    const bool nothing_new =
        attempt->page().NothingNewAfter(attempt->checkpoint().resume_cursor());
    if (idle && !nothing_new) {
      SetState(handoff::v1::SOURCE_STATE_RUNNING, "");
      idle = false;
    }
    const bool go_on = DriveAttempt(attempt.get(), store::Stage::kIngest);
    if (attempt->checkpoint().has_applied()) {
      const Position applied{attempt->checkpoint().applied_block(),
                             attempt->checkpoint().applied_log_index()};
      if (!applied_high_.has_value() || *applied_high_ < applied) applied_high_ = applied;
    }
    if (nothing_new && go_on) unchanged = attempt->checkpoint();
    const bool rewrote_outbox = attempt->replaces_history();
    Release(std::move(attempt));
    if (!go_on) break;
    if (nothing_new && !parts_.provider->PolledPerFetch()) {
      // A stream's heartbeat: nothing is asked again, the provider pushes the next frame
      // when it has one, and the next Fetch waits for it (no CPU). Sleeping the idle
      // backoff here would hold a page queued right behind the heartbeat (and leave the
      // socket unread), so a stream whose heartbeats come more often than the backoff
      // would fall further behind. Still "no new events", with no retry due. A floor
      // between two heartbeats keeps a provider that floods them (or a stream that
      // answers "nothing new" without waiting) from spinning the worker.
      SetState(handoff::v1::SOURCE_STATE_BACKING_OFF, kNoNewEvents);
      idle = true;
      if (absl::Now() - last_heartbeat < kStreamHeartbeatFloor) {
        bool unused = false;
        if (WaitUntil(last_heartbeat + kStreamHeartbeatFloor, &unused) == Wake::kStopped) break;
      }
      last_heartbeat = absl::Now();
      continue;
    }
    if (nothing_new) {
      // Nothing new yet: wait before asking again, never spin. Only the first empty
      // poll changes the state (and is logged); later ones move retry_at.
      const absl::Time at = idle_backoff.NextDeadline(absl::Now());
      SetState(handoff::v1::SOURCE_STATE_BACKING_OFF, kNoNewEvents, at);
      if (parts_.idle_poller != nullptr && parts_.provider->PolledPerFetch()) {
        news = AwaitNews(*unchanged, &idle_backoff, at);
        if (!news.has_value()) break;  // stopping
      } else {
        bool unused = false;
        if (WaitUntil(at, &unused) == Wake::kStopped) break;
      }
      idle = true;
      continue;
    }
    backoff.Reset();
    idle_backoff.Reset();
    if (gated_ && unsynced_.empty()) PokeDelivery(rewrote_outbox);  // else SettleUnsynced does
  }
  // A stop leaves the last page published (a crash abandons it as it is).
  if (!crashed_.load()) SettleOrHalt();
  if (!halted_.load() && !crashed_.load()) {
    SetState(handoff::v1::SOURCE_STATE_STOPPED, "");
  }
  // Pages fetched ahead hold slots of the shared budget: they go with the loop, not with
  // the worker (a halted one stays until an operator acts).
  if (parts_.provider != nullptr) parts_.provider->DropReadAhead();
  ThreadDone();
}

absl::StatusOr<store::CheckpointRecord> SourceWorker::PublishedIngest() const {
  {
    absl::MutexLock lock(&mu_);
    if (published_ingest_.has_value()) return *published_ingest_;
  }
  // Not published yet: nothing of this run is unsynced, the stored one is durable.
  return parts_.store->LoadCheckpoint(spec_.id(), store::Stage::kIngest);
}

absl::Status SourceWorker::ReadOutbox(Position from, Position to, size_t limit,
                                      std::vector<handoff::v1::EventRow>* rows) const {
  if (to < from || limit == 0) return absl::OkStatus();
  // Decoded into the rows of finished pages, reusing their strings' memory: Decode sets
  // every field (RowPool's contract). `rows` is empty here (every caller's is new).
  *rows = RowPool::Default().Take();
  rows->reserve(std::min<size_t>(limit, 1024));
  size_t used = 0;
  store::RowDecoder decoder;
  absl::Status parse_error;
  absl::Status s = parts_.store->ScanOutbox(
      spec_.id(), from, to, [&](Position pos, absl::string_view value) {
        if (used == rows->size()) rows->emplace_back();
        absl::Status d = decoder.Decode(value, &(*rows)[used]);
        if (!d.ok()) {
          parse_error = absl::DataLossError(
              absl::StrCat("outbox entry at ", pos.DebugString(), ": ", d.message()));
          return false;
        }
        return ++used < limit;
      });
  if (used == 0) {
    // Nothing read (a caught-up delivery rechecks often): the rows go back unused.
    RowPool::Default().Give(std::move(*rows));
    rows->clear();
  } else {
    rows->resize(used);
  }
  return s.ok() ? parse_error : s;
}

std::vector<handoff::v1::EventRow>* SourceWorker::ReadAhead::RowsFrom(Position from,
                                                                     Position to) {
  if (!done.has_value()) {
    if (!pending.valid()) return nullptr;
    done = pending.get();
  }
  if (!done->status.ok() || done->from != from) return nullptr;
  // The mark only moves up, but a run never goes past the one read now.
  std::vector<handoff::v1::EventRow>& rows = done->rows;
  while (!rows.empty() && to < PositionOf(rows.back())) rows.pop_back();
  return rows.empty() ? nullptr : &rows;
}

std::unique_ptr<SourceWorker::ReadAhead> SourceWorker::ReadRunAhead(
    Position after, Position to, uint64_t outbox_epoch,
    const UnpublishedWrites::Cap& cap) const {
  // Only below the finalized mark are outbox entries never rewritten (a correction
  // reaching a delivered finalized event halts the source); below the safe mark a deep
  // reorg may still replace them, so a SAFE source reads each run when it starts.
  if (spec_.sink().gate() != handoff::v1::DELIVERY_GATE_FINALIZED) return nullptr;
  const std::optional<Position> from = NextRunStart(after);
  if (!from.has_value() || to < *from) return nullptr;
  auto ahead = std::make_unique<ReadAhead>();
  ahead->outbox_epoch = outbox_epoch;
  ahead->pending = std::async(std::launch::async, [this, from = *from, to, cap] {
    RunRows r;
    r.from = from;
    r.status = ReadOutbox(from, to, RunLimit(), &r.rows);
    if (r.status.ok() && !unpublished_writes_.Unchanged(cap)) {
      r.status = absl::AbortedError("a write below the delivery gate was noted during the read");
    }
    return r;
  });
  return ahead;
}

std::unique_ptr<EarlyDelivery> SourceWorker::SendEarly(Position after, Position to,
                                                       ReadAhead* ahead, uint64_t outbox_epoch,
                                                       const UnpublishedWrites::Cap& cap) {
  const std::optional<Position> from = NextRunStart(after);
  if (!from.has_value() || to < *from) return nullptr;
  // The next attempt's first call: at most one sink batch, and no more than a run.
  const size_t count = static_cast<size_t>(
      std::max(1, std::min(parts_.sink->max_batch(), options_.delivery_run)));
  // Sent from the read-ahead's rows, which become the next run's (Send is done with
  // them when it returns), or else from rows read now.
  const std::vector<handoff::v1::EventRow>* read =
      ahead != nullptr ? ahead->RowsFrom(*from, to) : nullptr;
  std::vector<handoff::v1::EventRow> own;
  if (read == nullptr) {
    // A failed read sends nothing: the next attempt reads the outbox itself and reports it.
    if (!ReadOutbox(*from, to, count, &own).ok() || !unpublished_writes_.Unchanged(cap)) {
      RowPool::Default().Give(std::move(own));
      return nullptr;
    }
    read = &own;
  }
  size_t n = std::min(count, read->size());
  if (n == 0) return nullptr;
  // Nothing from a held event on: it waits for an operator's decision or its retry time,
  // which the next attempt keeps (a correction that rewinds delivery below a hold
  // without replacing its event leaves it in a later run). A failed read sends nothing.
  const absl::Status holds = parts_.store->ScanStaged(
      store::StagedFamily::kHolds, spec_.id(), store::Stage::kDelivery, *from,
      PositionOf((*read)[n - 1]), [&](Position held, absl::string_view) {
        while (n > 0 && !(PositionOf((*read)[n - 1]) < held)) --n;
        return false;  // the first hold is the one that counts
      });
  if (!holds.ok() || n == 0) {
    RowPool::Default().Give(std::move(own));
    return nullptr;
  }
  auto early = std::make_unique<EarlyDelivery>();
  std::vector<Delivery> deliveries;
  deliveries.reserve(n);
  early->sent.reserve(n);
  const handoff::v1::Finality finality = GatedFinality(spec_.sink().gate());
  for (size_t i = 0; i < n; ++i) {
    const handoff::v1::EventRow& row = (*read)[i];
    deliveries.push_back(MakeDelivery(spec_.id(), row, finality));
    early->sent.push_back(EarlyDelivery::Sent{PositionOf(row), row.block_hash()});
  }
  if (unrecorded_sends_ != nullptr) {
    std::vector<Position> positions;
    positions.reserve(n);
    for (const EarlyDelivery::Sent& sent : early->sent) positions.push_back(sent.pos);
    // Not sent when a correction rewrote the outbox since the run was read (or the
    // store failed): the next attempt reads the outbox itself and reports it.
    absl::StatusOr<bool> current = unrecorded_sends_->RegisterIfCurrent(outbox_epoch, positions);
    if (!current.ok() || !*current) {
      RowPool::Default().Give(std::move(own));
      return nullptr;
    }
  }
  early->answers = parts_.sink->Send(spec_.id(), deliveries);
  RowPool::Default().Give(std::move(own));
  return early;
}

absl::Status SourceWorker::ReadRun(Position from, Position to, uint64_t outbox_epoch,
                                   std::unique_ptr<ReadAhead> ahead,
                                   std::vector<handoff::v1::EventRow>* rows) const {
  if (ahead != nullptr) {
    std::vector<handoff::v1::EventRow>* read =
        ahead->outbox_epoch == outbox_epoch ? ahead->RowsFrom(from, to) : nullptr;
    if (read != nullptr) {
      FaultPoints::Hit("delivery.read_ahead_used");
      *rows = std::move(*read);
      return absl::OkStatus();
    }
    FaultPoints::Hit("delivery.read_ahead_dropped");
  }
  return ReadOutbox(from, to, RunLimit(), rows);
}

void SourceWorker::DeliveryLoop() {
  // The lookahead: the first call of the next run, sent while this run's final step
  // commits (EarlyDelivery). Outlives the attempt that sent it, for the next one.
  std::unique_ptr<EarlyDelivery> early;
  // The read of the next run's rows (ReadRunAhead), started with each run.
  std::unique_ptr<ReadAhead> ahead;
  while (!stopping()) {
    absl::StatusOr<store::CheckpointRecord> dcp =
        parts_.store->LoadCheckpoint(spec_.id(), store::Stage::kDelivery);
    // The gate's marks come from the ingest checkpoint the ingest thread published,
    // which is durable; the stored one may be a page ahead, its sync still in flight.
    absl::StatusOr<store::CheckpointRecord> icp = PublishedIngest();
    if (!dcp.ok() || !icp.ok()) {
      absl::Status s = !dcp.ok() ? dcp.status() : icp.status();
      Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
           absl::StrCat("cannot load the delivery checkpoint: ", s.message()), s);
      break;
    }
    PublishCheckpoint(store::Stage::kDelivery, *dcp);
    const store::Mark& mark = spec_.sink().gate() == handoff::v1::DELIVERY_GATE_SAFE
                                  ? icp->highest_safe()
                                  : icp->highest_finalized();
    // Deliverable: every outbox entry up to the gate's mark (when there is one) that a
    // durable page wrote. The outbox read is of the latest state, which may hold a page
    // whose sync is still in flight; a finalized mark far ahead of a catching-up ingest
    // does not bound it, the published (durable) applied position does.
    Position to{mark.number(), std::numeric_limits<uint64_t>::max()};
    if (icp->has_applied()) {
      to = std::min(to, Position{icp->applied_block(), icp->applied_log_index()});
    }
    // Nor does it bound what a page that rewound the applied position, and the pages
    // after it, wrote below it before they were published: read strictly below those.
    const UnpublishedWrites::Cap cap = unpublished_writes_.Current();
    const std::optional<Position> below_cap =
        cap.below.has_value() ? PositionBefore(*cap.below) : std::nullopt;
    if (below_cap.has_value()) to = std::min(to, *below_cap);
    Page run;
    if (mark.present() && icp->has_applied() &&
        !(cap.below.has_value() && !below_cap.has_value())) {
      const Position from =
          dcp->has_applied()
              ? Successor(Position{dcp->applied_block(), dcp->applied_log_index()})
              : Position{0, 0};
      absl::Status s = ReadRun(from, to, dcp->outbox_epoch(), std::move(ahead), &run.items);
      if (!s.ok()) {
        Halt(handoff::v1::SOURCE_STATE_STORAGE_FAILED,
             absl::StrCat("cannot read the outbox: ", s.message()), s);
        break;
      }
      if (!unpublished_writes_.Unchanged(cap)) {
        // A write below the gate was noted during the read: it may have seen it.
        FaultPoints::Hit("delivery.read_below_gate_dropped");
        RowPool::Default().Give(std::move(run.items));
        continue;
      }
    }
    if (run.items.empty()) {
      FaultPoints::Hit("delivery.idle");  // an interleaving point: nothing to deliver
      bool* poked;
      {
        absl::MutexLock lock(&mu_);
        poked = &delivery_poked_;
      }
      if (WaitUntil(absl::Now() + options_.delivery_idle_recheck, poked) == Wake::kStopped) break;
      continue;
    }
    AttemptConfig config = MakeConfig(store::Stage::kDelivery);
    std::unique_ptr<EarlyDelivery> next;
    config.early = early.get();
    const Position last = PositionOf(run.items.back());
    const uint64_t outbox_epoch = dcp->outbox_epoch();
    ahead = ReadRunAhead(last, to, outbox_epoch, cap);
    config.on_final_commit = [this, &next, &ahead, last, to, outbox_epoch, cap] {
      next = SendEarly(last, to, ahead.get(), outbox_epoch, cap);
    };
    auto attempt =
        std::make_unique<PageAttempt>(config, *std::move(dcp), std::move(run));
    const bool go_on = DriveAttempt(attempt.get(), store::Stage::kDelivery);
    Release(std::move(attempt));
    early = std::move(next);  // the previous one was answered or is waited for here
    if (!go_on) break;
  }
  ThreadDone();
}

}  // namespace handoff::consumer
