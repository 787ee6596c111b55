// PageAttempt: the crash-safe page procedure for one page (seed 000, "Procedure").
//
// Identity: the (resume_cursor, checkpoint_version) of the checkpoint loaded when the
// attempt began. The page's `next` cursor is held here, in memory only; it becomes the
// resume cursor only through the page barrier, a compare-and-swap from the attempt's
// identity to (next, version + 1), and only once every event of the page has a durable
// terminal outcome.
//
// Run() validates the page (PageValidator) before any effect, then processes events in
// source order:
//  * an event whose durable receipt has the same identity is a replay;
//  * otherwise its effect is staged and committed together with its receipt and the
//    resulting applied_position (the end of the page's contiguous terminal prefix), in
//    steps of up to max_events_per_step events, each one WriteBatch fenced by the
//    attempt's version and synced (the barrier's, optionally, in the background:
//    AttemptConfig::defer_barrier_sync);
//  * with an external sink, the sink's answer is classified (outcome_policy.h); holds
//    and retries are written durably but are not terminal, and the attempt stops at the
//    first event that is not durable and terminal.
// A quarantine becomes terminal only in its own durable step (so a crash before it
// leaves the event pending, as the seed's boundary example requires).
//
// The same procedure serves the delivery stage: there the "page" is a run of outbox
// entries at or below the delivery gate, the terminal effect is a delivery receipt,
// and the barrier only bumps the delivery checkpoint's version.
//
// A stale attempt (another attempt promoted first, or an operator resolved a hold since
// it read it: every commit moves the checkpoint's step_seq) loses its next fenced write
// with ABORTED and reports kLostRace: the caller rereads state and never overwrites newer
// progress. An attempt resumed after a wait checks the checkpoint first, and reports
// kLostRace before any sink call when it moved.
//
// Thread-compatible: one worker thread runs it; Info() is read under the worker's lock.
#ifndef HANDOFF_CONSUMER_PAGE_ATTEMPT_H_
#define HANDOFF_CONSUMER_PAGE_ATTEMPT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "consumer/backoff.h"
#include "consumer/observer.h"
#include "consumer/outcome_policy.h"
#include "consumer/page.h"
#include "consumer/sink.h"
#include "consumer/unrecorded_sends.h"
#include "handoff/v1/source.pb.h"
#include "store/records.pb.h"
#include "store/store.h"

namespace handoff::consumer {

// A sink call sent ahead of the attempt that will record its answers: the delivery
// stage's lookahead (SourceWorker::DeliveryLoop sends the next run's first call while
// the current run's final step commits). The answers count only for an attempt whose
// first call carries exactly these events; otherwise they are dropped unrecorded and the
// events are delivered again later under the same idempotency keys, as after a crash.
struct EarlyDelivery {
  EarlyDelivery() = default;
  EarlyDelivery(const EarlyDelivery&) = delete;
  EarlyDelivery& operator=(const EarlyDelivery&) = delete;
  // Waits for the call.
  ~EarlyDelivery();

  // What was sent, in outbox order: the position and block hash of each event.
  struct Sent {
    Position pos;
    std::string block_hash;
  };
  std::vector<Sent> sent;
  std::future<std::vector<SinkAnswer>> answers;  // ExternalSink::Send's
};

struct AttemptConfig {
  std::string source_id;
  store::Stage stage = store::Stage::kIngest;
  store::Store* store = nullptr;
  // IMMEDIATE deliveries (ingest) or gated deliveries (delivery stage); may be null.
  ExternalSink* sink = nullptr;
  // An extra transactional effect staged with each applied event (tests); may be null.
  TransactionalEffect* effect = nullptr;
  // Ingest writes outbox entries (SAFE/FINALIZED gates).
  bool write_outbox = false;
  // With FINALIZED gating, both stages': the events the sink may have applied, whose
  // replacement by an ingest correction breaks the provider contract (finalized blocks
  // never reorg); the delivery stage registers each call in it before it goes out.
  // Null otherwise.
  UnrecordedSends* unrecorded_sends = nullptr;
  handoff::v1::DeliveryGate gate = handoff::v1::DELIVERY_GATE_UNSPECIFIED;
  handoff::v1::FailurePolicy policy;
  int max_events_per_step = 1000;
  // Commit the barrier in the same batch as the page's last events when possible.
  bool fuse_barrier = true;
  EngineObserver* observer = nullptr;
  // Set by the worker to stop at the next safe point.
  const std::atomic<bool>* cancelled = nullptr;
  // With a sink: answers already in flight for the attempt's first call; may be null.
  EarlyDelivery* early = nullptr;
  // Ingest: the barrier's commit does not wait for its fsync (Store::CommitStep's
  // deferred form), so that the next page's work overlaps it. Run() then returns
  // kPromoted with `Result::unsynced` set, and the page is durable, and may be
  // published or acted on outside the process, only once the caller's
  // Store::AwaitSynced of its ticket returned OK (SourceWorker::SettleUnsynced).
  bool defer_barrier_sync = false;
  // Called before each commit of the attempt, with its step: settles earlier attempts'
  // unsynced barriers, so that pages are published in order and only a bounded number is
  // ever unsynced (WorkerOptions::max_unsynced_pages), and notes a step that writes below
  // the delivery gate (UnpublishedWrites). Non-OK ends the attempt: kCancelled for
  // CANCELLED, otherwise kStorageFailed. May be empty.
  std::function<absl::Status(const store::StepBatch&)> before_commit;
  // With a sink: called on the attempt's thread once every event of the attempt has a
  // clean answer and only the final step remains, before it is staged and committed (so
  // that the worker's next call overlaps both); may be empty.
  std::function<void()> on_final_commit;
};

// The finality a gated delivery reports (every delivered event passed the gate).
handoff::v1::Finality GatedFinality(handoff::v1::DeliveryGate gate);

// A page barrier written with AttemptConfig::defer_barrier_sync: what completes it once
// its ticket is synced.
struct UnsyncedBarrier {
  store::SyncTicket ticket;
  store::CheckpointRecord checkpoint;  // the promoted checkpoint
  int events = 0;                      // committed in the barrier's step
  absl::Time commit_start;
  // Set when the step made a correction of this depth (EngineObserver::OnCorrection,
  // reported once synced).
  std::optional<uint64_t> correction_depth;
  // The worker's sequence number of the page (UnpublishedWrites::Published).
  uint64_t page_seq = 0;
  // The page replaced history (PageAttempt::replaces_history).
  bool replaced_history = false;
  // The fault point that follows the step's commit ("ingest.after_event_commit"), or
  // empty; hit once it is durable, before "ingest.after_barrier".
  std::string after_point;
  // The attempt's progress as of its barrier, published with the checkpoint once synced
  // (SourceWorker::SettleUnsynced): the page is not reported fully done before then.
  handoff::v1::PageAttemptInfo attempt_info;
};

class PageAttempt {
 public:
  struct Result {
    enum class Kind {
      kPromoted,       // the barrier passed: the checkpoint moved to the next cursor
      kNothingNew,     // empty page with an unchanged cursor: back off, no barrier
      kBlockedOnHold,  // an event awaits an operator (ResolveHold)
      kRetryLater,     // an event is retrying; wake at retry_at
      kViolation,      // the page breaks the provider contract: halt
      kLostRace,       // a fenced write was ABORTED: reread the checkpoint
      kStorageFailed,  // a write failed: stop, advance nothing
      kCrashed,        // a fault point fired (tests): abandon at once
      kCancelled,      // stop requested
    };
    Kind kind = Kind::kPromoted;
    std::string detail;
    absl::Status status;
    absl::Time retry_at = absl::InfinitePast();
    std::optional<UnsyncedBarrier> unsynced;  // kPromoted only
  };

  // `checkpoint` is the stage's checkpoint loaded at the start of the attempt;
  // `page` was fetched with checkpoint.resume_cursor (ingest), or built from the
  // outbox (delivery).
  PageAttempt(const AttemptConfig& config, store::CheckpointRecord checkpoint, Page page);
  // Gives the page's rows to RowPool::Default() for the parsing of later pages.
  ~PageAttempt();

  // Runs the procedure until the barrier passes or something stops it. Resumable after
  // kBlockedOnHold / kRetryLater (it rereads the blocked events' durable state first).
  Result Run();

  // Progress of the attempt, for GetProgress.
  handoff::v1::PageAttemptInfo Info() const;
  // The last checkpoint this attempt knows to be durable.
  const store::CheckpointRecord& checkpoint() const { return checkpoint_; }
  const Page& page() const { return page_; }
  // Ingest: the page replaces history (a correction, or a replacement of an abandoned
  // attempt's work): its steps fence the delivery stage. Known once validated.
  bool replaces_history() const { return replaces_history_; }
  // Gives the page's PageBudget slot back, keeping the page: an attempt waiting for an
  // operator (a hold) or a retry may wait for hours, and must not take a slot that
  // other sources need to fetch. Its memory is then a term of its own in the bound
  // (consumer/memory_bound.h: sources waiting with a page).
  void ReleasePageSlot() { page_.slot.Release(); }

 private:
  enum class SlotState { kPending, kTerminal, kHeld, kRetrying };
  struct Slot {
    Position pos;
    SlotState state = SlotState::kPending;
    // Out of line: few slots have one, and every attempt allocates a page of slots.
    std::unique_ptr<handoff::v1::Hold> hold;
    absl::Time retry_at = absl::InfinitePast();
  };

  Result Validate();
  // Rereads the blocked events' holds and receipts; sets stale_ when one's hold vanished
  // without a terminal outcome.
  absl::Status RefreshBlocked();
  Result ProcessLocal();
  Result ProcessWithSink();
  Result Barrier();
  // Delivery stage, FINALIZED gate: registers the call of `count` events from
  // batch[sent] as sent (UnrecordedSends); a Result when it must not go out.
  std::optional<Result> RegisterSend(const std::vector<size_t>& batch, size_t sent,
                                     size_t count);
  // After the step that recorded `answers` to `batch` committed.
  void ForgetRecorded(const std::vector<size_t>& batch,
                      const std::vector<SinkAnswer>& answers) const;

  // Commits `step` fenced by the attempt's version, with applied_position = end of the
  // contiguous terminal prefix (slots in `newly_terminal` count as terminal if the
  // commit succeeds), optionally fused with the barrier.
  // Returns nullopt to continue, or the result that ends this Run().
  std::optional<Result> CommitSlots(store::StepBatch* step, const std::vector<size_t>& newly_terminal,
                     store::CounterRecord deltas, bool with_barrier,
                     const char* before_point, const char* after_point);

  // Stages the durable terminal effect of slot `i`.
  absl::Status StageTerminal(size_t i, Decision::Kind kind, const std::string& reason,
                             store::StepBatch* step);
  // Delivery: stages the removal of the outbox entries of `newly_terminal` (ascending
  // slot indices), one range deletion per run of consecutive slots.
  void StageOutboxRemovals(const std::vector<size_t>& newly_terminal,
                           store::StepBatch* step) const;
  // A new step of this attempt, starting with the pending orphan deletes, with room
  // for `events` staged events.
  std::unique_ptr<store::StepBatch> NewStep(size_t events = 0);
  void StageOrphans(store::StepBatch* step);
  handoff::v1::Hold MakeHold(size_t i, handoff::v1::HoldKind kind, const Decision& d,
                             const SinkAnswer& answer, uint32_t attempts) const;
  std::optional<Position> AppliedAfter(const std::vector<size_t>& newly_terminal) const;
  // Whether every slot is terminal or among `slots` (ascending slot indices).
  bool AllTerminalWith(const std::vector<size_t>& slots) const;
  handoff::v1::Finality FinalityOf(const handoff::v1::EventRow& row) const;
  size_t FirstNonTerminal() const;
  bool Cancelled() const { return config_.cancelled != nullptr && config_.cancelled->load(); }
  Result Make(Result::Kind kind, std::string detail = "", absl::Status status = absl::OkStatus());

  // Constant after construction.
  const AttemptConfig config_;
  const std::string request_cursor_;
  const uint64_t request_version_;
  Page page_;  // never modified, until the destructor recycles its rows

  store::CheckpointRecord checkpoint_;
  bool validated_ = false;
  // A hold this attempt waited on vanished without a decision: its events are stale.
  bool stale_ = false;
  bool orphans_pending_ = false;
  std::vector<Position> orphans_;
  uint64_t correction_depth_ = 0;
  // applied_position before this page's events (rewound by a correction).
  std::optional<Position> base_applied_;
  bool clear_applied_ = false;
  // The page replaces applied history (a correction, or a page that replaces an
  // abandoned attempt's work, rewinding the applied position): each of its steps fences
  // the delivery stage, whose run in flight may lie around the events it inserts.
  bool replaces_history_ = false;
  uint64_t replayed_ = 0;
  bool replays_counted_ = false;
  std::vector<Slot> slots_;
  Backoff backoff_;
  // Serialization buffer of StageTerminal, reused across the page's rows.
  std::string row_bytes_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PAGE_ATTEMPT_H_
