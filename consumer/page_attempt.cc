#include "consumer/page_attempt.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "consumer/fault_points.h"
#include "consumer/page_validator.h"
#include "consumer/receipt_ledger.h"
#include "consumer/row_pool.h"
#include "store/records.pb.h"
#include "store/row_codec.h"

namespace handoff::consumer {
namespace {

using Kind = PageAttempt::Result::Kind;

std::string PointName(store::Stage stage, const char* point) {
  return absl::StrCat(stage == store::Stage::kIngest ? "ingest." : "delivery.", point);
}

store::ReceiptOutcome OutcomeOf(Decision::Kind kind) {
  switch (kind) {
    case Decision::Kind::kIgnored:
      return store::RECEIPT_IGNORED;
    case Decision::Kind::kQuarantined:
      return store::RECEIPT_QUARANTINED;
    default:
      return store::RECEIPT_APPLIED;
  }
}

handoff::v1::Stage PublicStage(store::Stage stage) {
  return stage == store::Stage::kIngest ? handoff::v1::STAGE_INGEST : handoff::v1::STAGE_DELIVERY;
}

store::Mark ToMark(const BlockMarkValue& m) {
  store::Mark mark;
  mark.set_present(true);
  mark.set_number(m.number);
  mark.set_hash(m.hash);
  return mark;
}

}  // namespace

EarlyDelivery::~EarlyDelivery() {
  if (answers.valid()) answers.wait();
}

PageAttempt::~PageAttempt() { RowPool::Default().Give(std::move(page_.items)); }

PageAttempt::PageAttempt(const AttemptConfig& config, store::CheckpointRecord checkpoint,
                         Page page)
    : config_(config),
      request_cursor_(checkpoint.resume_cursor()),
      request_version_(checkpoint.version()),
      page_(std::move(page)),
      checkpoint_(std::move(checkpoint)),
      backoff_(BackoffOf(config.policy)) {}

PageAttempt::Result PageAttempt::Make(Kind kind, std::string detail, absl::Status status) {
  Result r;
  r.kind = kind;
  r.detail = std::move(detail);
  r.status = std::move(status);
  return r;
}

PageAttempt::Result PageAttempt::Run() {
  if (Cancelled()) return Make(Kind::kCancelled);
  if (!validated_) {
    Result r = Validate();
    if (!validated_) return r;
  } else {
    // Resuming after a wait (a hold, a retry). Anything else that committed to this
    // stage's checkpoint meanwhile (an operator's resolution, an ingest correction that
    // fenced the delivery stage) has made this attempt's view stale, and its next commit
    // would be ABORTED: reread now, before calling the sink for nothing.
    absl::StatusOr<store::CheckpointRecord> now =
        config_.store->LoadCheckpoint(config_.source_id, config_.stage);
    if (!now.ok()) {
      return Make(Kind::kStorageFailed, std::string(now.status().message()), now.status());
    }
    if (now->version() != checkpoint_.version() || now->step_seq() != checkpoint_.step_seq()) {
      return Make(Kind::kLostRace,
                  "the checkpoint moved while this attempt waited (a hold resolution or a "
                  "correction): rereading");
    }
    absl::Status s = RefreshBlocked();
    if (!s.ok()) return Make(Kind::kStorageFailed, std::string(s.message()), s);
    if (stale_) {
      return Make(Kind::kLostRace,
                  "a hold this attempt waited on was removed without a decision (a "
                  "correction replaced its event): rereading");
    }
  }
  return config_.sink != nullptr ? ProcessWithSink() : ProcessLocal();
}

PageAttempt::Result PageAttempt::Validate() {
  std::optional<std::pair<Position, Position>> range;
  if (config_.stage == store::Stage::kIngest) {
    range = PageRange(page_);
  } else if (!page_.items.empty()) {
    range = std::make_pair(PositionOf(page_.items.front()), PositionOf(page_.items.back()));
  }
  ReceiptLedger ledger;
  if (range.has_value()) {
    absl::StatusOr<ReceiptLedger> loaded = ReceiptLedger::Load(
        *config_.store, config_.source_id, config_.stage, range->first, range->second);
    if (!loaded.ok()) {
      return Make(Kind::kStorageFailed, std::string(loaded.status().message()), loaded.status());
    }
    ledger = *std::move(loaded);
  }
  if (checkpoint_.has_applied()) {
    base_applied_ = Position{checkpoint_.applied_block(), checkpoint_.applied_log_index()};
  }
  if (config_.stage == store::Stage::kIngest) {
    PageVerdict verdict = ValidatePage(page_, request_cursor_, checkpoint_, ledger);
    if (!verdict.violation.empty()) return Make(Kind::kViolation, verdict.violation);
    if (verdict.nothing_new) return Make(Kind::kNothingNew);
    orphans_ = std::move(verdict.orphans);
    correction_depth_ = verdict.correction_depth;
    replaces_history_ = page_.reorg || !orphans_.empty() || verdict.clear_applied ||
                        verdict.rewound_applied.has_value();
    if (verdict.clear_applied) {
      base_applied_.reset();
      clear_applied_ = true;
    } else if (verdict.rewound_applied.has_value() && base_applied_.has_value()) {
      base_applied_ = std::min(*base_applied_, *verdict.rewound_applied);
    }
    orphans_pending_ = !orphans_.empty() || page_.reorg;
  }
  slots_.resize(page_.items.size());
  for (size_t i = 0; i < page_.items.size(); ++i) {
    const handoff::v1::EventRow& row = page_.items[i];
    Slot& slot = slots_[i];
    slot.pos = PositionOf(row);
    const ReceiptLedger::Entry* entry = ledger.Find(slot.pos);
    if (entry == nullptr) continue;
    if (!entry->terminal_hash.empty() && entry->terminal_hash == row.block_hash()) {
      slot.state = SlotState::kTerminal;
      ++replayed_;
    } else if (entry->hold.has_value() && entry->hold->event().block_hash() == row.block_hash()) {
      slot.hold = std::make_unique<handoff::v1::Hold>(*entry->hold);
      slot.state = entry->hold->kind() == handoff::v1::HOLD_KIND_RETRYING ? SlotState::kRetrying
                                                                          : SlotState::kHeld;
    }
  }
  validated_ = true;
  return Make(Kind::kPromoted);  // ignored by Run(): validation passed
}

absl::Status PageAttempt::RefreshBlocked() {
  // A hold may have been resolved while we waited: QUARANTINE/IGNORE wrote a terminal
  // receipt (and removed the hold), RETRY wrote a new RETRYING version of it.
  size_t first = FirstNonTerminal();
  if (first >= slots_.size()) return absl::OkStatus();
  absl::StatusOr<ReceiptLedger> ledger =
      ReceiptLedger::Load(*config_.store, config_.source_id, config_.stage, slots_[first].pos,
                          slots_.back().pos);
  if (!ledger.ok()) return ledger.status();
  for (size_t i = first; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.state == SlotState::kTerminal) continue;
    const ReceiptLedger::Entry* entry = ledger->Find(slot.pos);
    const std::string& hash = page_.items[i].block_hash();
    if (entry != nullptr && entry->terminal_hash == hash) {
      slot.state = SlotState::kTerminal;
      slot.hold.reset();
    } else if (entry != nullptr && entry->hold.has_value() &&
               entry->hold->event().block_hash() == hash) {
      bool changed = slot.hold == nullptr || slot.hold->version() != entry->hold->version();
      slot.hold = std::make_unique<handoff::v1::Hold>(*entry->hold);
      if (entry->hold->kind() == handoff::v1::HOLD_KIND_RETRYING) {
        slot.state = SlotState::kRetrying;
        if (changed) slot.retry_at = absl::InfinitePast();
      } else {
        slot.state = SlotState::kHeld;
      }
    } else if (slot.state != SlotState::kPending) {
      // The hold is gone without a terminal outcome. No resolution does that (RETRY
      // writes a new RETRYING version): a correction replaced the event (the ingest
      // stage deletes the delivery stage's holds of its orphans and fences this
      // stage). This attempt's events are stale: deliver nothing, reread.
      stale_ = true;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

size_t PageAttempt::FirstNonTerminal() const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state != SlotState::kTerminal) return i;
  }
  return slots_.size();
}

std::optional<Position> PageAttempt::AppliedAfter(const std::vector<size_t>& newly) const {
  std::optional<Position> end;
  size_t k = 0;  // `newly` is sorted
  for (size_t i = 0; i < slots_.size(); ++i) {
    while (k < newly.size() && newly[k] < i) ++k;
    bool terminal = slots_[i].state == SlotState::kTerminal || (k < newly.size() && newly[k] == i);
    if (!terminal) break;
    end = slots_[i].pos;
  }
  if (!end.has_value()) return base_applied_;
  if (base_applied_.has_value() && *base_applied_ > *end) return base_applied_;
  return end;
}

bool PageAttempt::AllTerminalWith(const std::vector<size_t>& slots) const {
  size_t k = 0;  // `slots` is sorted
  for (size_t i = 0; i < slots_.size(); ++i) {
    while (k < slots.size() && slots[k] < i) ++k;
    if (slots_[i].state != SlotState::kTerminal && !(k < slots.size() && slots[k] == i)) {
      return false;
    }
  }
  return true;
}

handoff::v1::Finality GatedFinality(handoff::v1::DeliveryGate gate) {
  return gate == handoff::v1::DELIVERY_GATE_SAFE ? handoff::v1::FINALITY_SAFE
                                                 : handoff::v1::FINALITY_FINALIZED;
}

handoff::v1::Finality PageAttempt::FinalityOf(const handoff::v1::EventRow& row) const {
  if (config_.stage == store::Stage::kDelivery) return GatedFinality(config_.gate);
  uint64_t finalized = checkpoint_.highest_finalized().present()
                           ? checkpoint_.highest_finalized().number()
                           : 0;
  bool has_finalized = checkpoint_.highest_finalized().present();
  if (page_.finalized.has_value() && (!has_finalized || page_.finalized->number > finalized)) {
    finalized = page_.finalized->number;
    has_finalized = true;
  }
  if (has_finalized && row.block_number() <= finalized) return handoff::v1::FINALITY_FINALIZED;
  uint64_t safe = checkpoint_.highest_safe().present() ? checkpoint_.highest_safe().number() : 0;
  bool has_safe = checkpoint_.highest_safe().present();
  if (page_.safe.has_value() && (!has_safe || page_.safe->number > safe)) {
    safe = page_.safe->number;
    has_safe = true;
  }
  if (has_safe && row.block_number() <= safe) return handoff::v1::FINALITY_SAFE;
  return handoff::v1::FINALITY_LATEST;
}

std::unique_ptr<store::StepBatch> PageAttempt::NewStep(size_t events) {
  // A serialized row is smaller than its JSON on the wire, so the wire size per event
  // bounds the bytes a staged event adds (an outbox entry is a key: see PutOutbox).
  size_t reserve = 0;
  if (events > 0 && !page_.items.empty() && config_.stage == store::Stage::kIngest) {
    const size_t per_event =
        page_.wire_bytes / page_.items.size() + (config_.write_outbox ? 64 : 0);
    reserve = std::min(events, page_.items.size()) * per_event;
  }
  std::unique_ptr<store::StepBatch> step = config_.store->NewStep(config_.source_id, reserve);
  // Every step of a page that replaces history fences the delivery stage, the steps that
  // only insert too (StepBatch::MarkReplacesHistory).
  if (config_.stage == store::Stage::kIngest && replaces_history_) step->MarkReplacesHistory();
  // The replaced range is deleted before anything of the page is inserted, in the same
  // batch as the page's first effects.
  StageOrphans(step.get());
  return step;
}

// Deletes the durable outcomes the page replaces. Quarantine records are kept: they are
// the audit trail of a decision (they carry the orphaned block hash), and a new event at
// the same position gets its own record if it is quarantined too.
void PageAttempt::StageOrphans(store::StepBatch* step) {
  if (!orphans_pending_) return;
  for (Position pos : orphans_) {
    step->DeleteRow(pos);
    step->DeleteReceipt(store::Stage::kIngest, pos);
    step->DeleteHold(store::Stage::kIngest, pos);
    if (config_.write_outbox) {
      step->DeleteOutbox(pos);
      step->DeleteReceipt(store::Stage::kDelivery, pos);
      step->DeleteHold(store::Stage::kDelivery, pos);
    }
  }
}

// A delivery page is a run of consecutive outbox entries (SourceWorker::ReadOutbox), so
// slots i and i + 1 are adjacent entries: no entry lies between their positions, and
// none can appear there before this step commits (every step of an ingest correction
// fences the step, Store::FenceDeliveryLocked). A run of consecutive terminal
// slots is thus removed by one range deletion.
void PageAttempt::StageOutboxRemovals(const std::vector<size_t>& newly,
                                      store::StepBatch* step) const {
  for (size_t k = 0; k < newly.size();) {
    size_t end = k + 1;
    while (end < newly.size() && newly[end] == newly[end - 1] + 1) ++end;
    step->DeleteOutboxRange(slots_[newly[k]].pos, slots_[newly[end - 1]].pos);
    k = end;
  }
}

absl::Status PageAttempt::StageTerminal(size_t i, Decision::Kind kind, const std::string& reason,
                                        store::StepBatch* step) {
  const handoff::v1::EventRow& row = page_.items[i];
  const Position pos = slots_[i].pos;
  if (config_.stage == store::Stage::kIngest) {
    absl::string_view bytes = page_.EncodedItem(i);  // made by the parser, if any
    if (!page_.has_encoded_items()) {
      row_bytes_.clear();  // keeps its capacity: no allocation per row
      store::AppendEncodedRow(row, &row_bytes_);
      bytes = row_bytes_;
    }
    step->PutRow(pos, bytes);
    if (config_.write_outbox) step->PutOutbox(pos);  // stands for the row just put
    if (config_.effect != nullptr && kind == Decision::Kind::kApplied) {
      absl::Status s = config_.effect->Stage(config_.source_id, row, step);
      if (!s.ok()) return s;
    }
  }
  // A delivered entry leaves the outbox in CommitSlots (StageOutboxRemovals).
  if (config_.stage == store::Stage::kDelivery || kind != Decision::Kind::kApplied) {
    // (Read here, not per applied ingest row, which records no time.)
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    store::ReceiptRecord receipt;
    receipt.set_block_hash(row.block_hash());
    receipt.set_outcome(OutcomeOf(kind));
    receipt.set_unix_ms(now_ms);
    step->PutReceipt(config_.stage, pos, receipt);
    if (kind != Decision::Kind::kApplied) {
      handoff::v1::QuarantineRecord rec;
      rec.set_source_id(config_.source_id);
      rec.set_stage(PublicStage(config_.stage));
      rec.mutable_event()->set_block_number(pos.block);
      rec.mutable_event()->set_log_index(pos.log_index);
      rec.mutable_event()->set_block_hash(row.block_hash());
      rec.set_disposition(kind == Decision::Kind::kIgnored ? handoff::v1::DISPOSITION_IGNORED
                                                            : handoff::v1::DISPOSITION_QUARANTINED);
      rec.set_reason(reason);
      rec.set_actor("policy");
      rec.set_decided_unix_ms(now_ms);
      step->PutQuarantine(config_.stage, pos, rec);
    }
  }
  if (slots_[i].hold != nullptr) step->DeleteHold(config_.stage, pos);
  return absl::OkStatus();
}

handoff::v1::Hold PageAttempt::MakeHold(size_t i, handoff::v1::HoldKind kind, const Decision& d,
                                        const SinkAnswer& answer, uint32_t attempts) const {
  const handoff::v1::EventRow& row = page_.items[i];
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  handoff::v1::Hold hold;
  const handoff::v1::Hold* old = slots_[i].hold.get();
  hold.set_source_id(config_.source_id);
  hold.set_stage(PublicStage(config_.stage));
  hold.mutable_event()->set_block_number(row.block_number());
  hold.mutable_event()->set_log_index(row.log_index());
  hold.mutable_event()->set_block_hash(row.block_hash());
  hold.set_kind(kind);
  hold.set_reason(d.reason);
  hold.set_attempts(attempts);
  hold.set_first_seen_unix_ms(old != nullptr ? old->first_seen_unix_ms() : now_ms);
  hold.set_last_seen_unix_ms(now_ms);
  hold.set_last_sink_answer(answer.message.empty()
                                ? AnswerName(answer.kind)
                                : absl::StrCat(AnswerName(answer.kind), ": ", answer.message));
  hold.set_version(old != nullptr ? old->version() + 1 : 1);
  *hold.mutable_event_row() = row;
  return hold;
}

std::optional<PageAttempt::Result> PageAttempt::CommitSlots(
    store::StepBatch* step, const std::vector<size_t>& newly, store::CounterRecord deltas,
    bool with_barrier, const char* before_point, const char* after_point) {
  store::CheckpointUpdate update;
  update.applied = AppliedAfter(newly);
  if (clear_applied_ && !update.applied.has_value()) update.clear_applied = true;
  if (!replays_counted_) {
    deltas.set_replayed(deltas.replayed() + replayed_);
    replays_counted_ = true;
  }
  if (config_.stage == store::Stage::kDelivery) StageOutboxRemovals(newly, step);
  // Orphans were staged first in this step by NewStep() (deletes before inserts).
  const bool had_orphans = orphans_pending_;
  // A correction is a reorg page that replaces committed events; one that replaces none
  // is counted nowhere (neither here nor by the observer).
  const bool corrects = had_orphans && page_.reorg && !orphans_.empty();
  if (corrects) {
    deltas.set_corrections(deltas.corrections() + 1);
    deltas.set_max_correction_depth(correction_depth_);
  }
  store::Fence fence;
  fence.expected_version = request_version_;
  fence.expected_step_seq = checkpoint_.step_seq();
  if (with_barrier) {
    fence.barrier = store::Fence::Barrier{request_cursor_, page_.next};
    deltas.set_pages_committed(deltas.pages_committed() + 1);
    if (config_.stage == store::Stage::kIngest) {
      if (page_.finalized.has_value()) update.finalized = ToMark(*page_.finalized);
      if (page_.safe.has_value()) update.safe = ToMark(*page_.safe);
      if (page_.tip.has_value()) update.tip = *page_.tip;
      // The committed range ends where this page's does. A correction that covers no
      // block ends it below `from` (the chain ends there now). Any other page that
      // covers no block keeps it, open: the blocks the cursor moved past are not named,
      // so the next page may start anywhere above it, but what was committed stays
      // checked (page_validator.h). Only a correction moves the end down: a page that
      // overlaps the committed range and ends inside it keeps what was committed above
      // it checked (lowered, a later page could rewrite those blocks without a halt).
      store::CheckpointUpdate::Covered& covered = update.covered.emplace();
      if (page_.through.has_value() && !page_.reorg && checkpoint_.has_covered() &&
          page_.through->number < checkpoint_.covered_through()) {
        covered.through = checkpoint_.covered_through();
        covered.open = checkpoint_.covered_open();
      } else if (page_.through.has_value()) {
        covered.through = page_.through->number;
      } else if (page_.reorg) {
        if (page_.from > 0) covered.through = page_.from - 1;
      } else {
        if (checkpoint_.has_covered()) covered.through = checkpoint_.covered_through();
        covered.open = true;
      }
    }
  }
  update.counter_deltas = deltas;

  if (before_point != nullptr && FaultPoints::Hit(PointName(config_.stage, before_point))) {
    return Make(Kind::kCrashed, before_point);
  }
  if (with_barrier && FaultPoints::Hit(PointName(config_.stage, "before_barrier"))) {
    return Make(Kind::kCrashed, "before_barrier");
  }
  if (config_.before_commit) {
    absl::Status s = config_.before_commit(*step);
    if (absl::IsCancelled(s)) return Make(Kind::kCancelled, std::string(s.message()));
    if (!s.ok()) return Make(Kind::kStorageFailed, std::string(s.message()), s);
  }
  const int events = static_cast<int>(newly.size());
  // Only a plain page is deferred: its step changes rows, receipts, outbox entries and
  // the checkpoint, whose outside readers wait for durability (QueryEvents, the
  // dispatcher); holds and quarantine records are listed as stored, so they stay synced.
  const bool defer =
      with_barrier && config_.defer_barrier_sync && !step->changes_operator_records();
  const absl::Time start = absl::Now();
  store::SyncTicket ticket;
  absl::StatusOr<store::CheckpointRecord> committed;
  auto commit = [&] {
    committed =
        config_.store->CommitStep(config_.stage, step, fence, update, defer ? &ticket : nullptr);
  };
  if (had_orphans && !orphans_.empty() && config_.stage == store::Stage::kIngest &&
      config_.unrecorded_sends != nullptr) {
    // A correction must not replace an event the sink may have applied as finalized.
    absl::StatusOr<std::optional<Position>> sent =
        config_.unrecorded_sends->CommitUnlessSent(orphans_, commit);
    if (!sent.ok()) {
      return Make(Kind::kStorageFailed, std::string(sent.status().message()), sent.status());
    }
    if (sent->has_value()) {
      return Make(Kind::kViolation,
                  absl::StrCat("correction page from block ", page_.from, " replaces event ",
                               (*sent)->DebugString(),
                               " that was already delivered (or sent) as finalized"));
    }
  } else {
    commit();
  }
  if (!committed.ok()) {
    if (absl::IsAborted(committed.status())) {
      return Make(Kind::kLostRace, std::string(committed.status().message()), committed.status());
    }
    return Make(Kind::kStorageFailed, std::string(committed.status().message()),
                committed.status());
  }
  checkpoint_ = *std::move(committed);
  for (size_t i : newly) {
    slots_[i].state = SlotState::kTerminal;
    slots_[i].hold.reset();
  }
  if (had_orphans) orphans_pending_ = false;
  // Reported once durable: now, or with a deferred barrier once its ticket is synced.
  if (corrects && !defer && config_.observer != nullptr) {
    config_.observer->OnCorrection(config_.source_id, correction_depth_);
  }
  clear_applied_ = false;
  if (defer) {
    // Not durable yet: the observer and the fault points after the commit are the
    // caller's, once the ticket is synced.
    Result r = Make(Kind::kPromoted);
    UnsyncedBarrier& u = r.unsynced.emplace();
    u.ticket = ticket;
    u.checkpoint = checkpoint_;
    u.events = events;
    u.commit_start = start;
    if (corrects) u.correction_depth = correction_depth_;
    u.replaced_history = replaces_history_;
    if (after_point != nullptr) u.after_point = PointName(config_.stage, after_point);
    return r;
  }
  if (config_.observer != nullptr) {
    config_.observer->OnCommit(config_.source_id, events, absl::Now() - start);
  }
  if (after_point != nullptr && FaultPoints::Hit(PointName(config_.stage, after_point))) {
    return Make(Kind::kCrashed, after_point);
  }
  if (with_barrier) {
    if (config_.observer != nullptr) config_.observer->OnPageCommitted(config_.source_id);
    if (FaultPoints::Hit(PointName(config_.stage, "after_barrier"))) {
      return Make(Kind::kCrashed, "after_barrier");
    }
    return Make(Kind::kPromoted);
  }
  return std::nullopt;
}

PageAttempt::Result PageAttempt::ProcessLocal() {
  const size_t n = slots_.size();
  const size_t per_step = static_cast<size_t>(std::max(1, config_.max_events_per_step));
  for (size_t i = FirstNonTerminal(); i < n; i = FirstNonTerminal()) {
    if (Cancelled()) return Make(Kind::kCancelled);
    if (slots_[i].state == SlotState::kHeld) {
      return Make(Kind::kBlockedOnHold, absl::StrCat("event ", slots_[i].pos.DebugString(),
                                                     " is held: ", slots_[i].hold->reason()));
    }
    std::unique_ptr<store::StepBatch> step = NewStep(per_step);
    std::vector<size_t> newly;
    size_t j = i;
    for (; j < n && newly.size() < per_step; ++j) {
      if (slots_[j].state == SlotState::kTerminal) continue;
      if (slots_[j].state == SlotState::kHeld) break;
      absl::Status s = StageTerminal(j, Decision::Kind::kApplied, "", step.get());
      if (!s.ok()) return Make(Kind::kStorageFailed, std::string(s.message()), s);
      newly.push_back(j);
    }
    store::CounterRecord deltas;
    deltas.set_applied(newly.size());
    const bool last = config_.fuse_barrier && j == n;
    std::optional<Result> r = CommitSlots(step.get(), newly, deltas, last, "before_event_commit",
                                          "after_event_commit");
    if (r.has_value()) return *r;
  }
  return Barrier();
}

PageAttempt::Result PageAttempt::ProcessWithSink() {
  const size_t n = slots_.size();
  const size_t max_batch = static_cast<size_t>(std::max(1, config_.sink->max_batch()));
  // Group commit: up to per_step events are delivered, in calls of at most max_batch,
  // before their answers are recorded in one durable step (one fsync for several sink
  // calls). A crash in between replays them with the same idempotency keys, exactly as
  // a crash after a single call would.
  const size_t per_step =
      std::max(max_batch, static_cast<size_t>(std::max(1, config_.max_events_per_step)));
  while (true) {
    const size_t first = FirstNonTerminal();
    if (first >= n) return Barrier();
    if (Cancelled()) return Make(Kind::kCancelled);
    const absl::Time now = absl::Now();
    std::vector<size_t> batch;
    for (size_t j = first; j < n && batch.size() < per_step; ++j) {
      const Slot& s = slots_[j];
      if (s.state == SlotState::kTerminal) continue;
      if (s.state == SlotState::kHeld) break;
      if (s.state == SlotState::kRetrying && s.retry_at > now) break;
      batch.push_back(j);
    }
    if (batch.empty()) {
      for (size_t j = first; j < n; ++j) {
        const Slot& s = slots_[j];
        if (s.state == SlotState::kHeld) {
          return Make(Kind::kBlockedOnHold,
                      absl::StrCat("event ", s.pos.DebugString(), " is held for an operator: ",
                                   s.hold->reason()));
        }
        if (s.state == SlotState::kRetrying) {
          Result r = Make(Kind::kRetryLater, absl::StrCat("event ", s.pos.DebugString(),
                                                          " is retrying: ", s.hold->reason()));
          r.retry_at = s.retry_at;
          return r;
        }
      }
      return Barrier();
    }

    std::vector<SinkAnswer> answers;
    for (size_t sent = 0; sent < batch.size();) {
      const size_t count = std::min(max_batch, batch.size() - sent);
      std::vector<SinkAnswer> part;
      if (config_.early != nullptr && config_.early->answers.valid()) {
        // The first call: answered already if it carries exactly the events sent early,
        // the same events and not just the same positions (a correction since the early
        // call may have replaced them).
        std::vector<SinkAnswer> early = config_.early->answers.get();
        bool same = sent == 0 && config_.early->sent.size() == count && early.size() == count;
        for (size_t k = 0; same && k < count; ++k) {
          const EarlyDelivery::Sent& sent_early = config_.early->sent[k];
          same = sent_early.pos == slots_[batch[k]].pos &&
                 sent_early.block_hash == page_.items[batch[k]].block_hash();
        }
        if (same) part = std::move(early);
        FaultPoints::Hit(same ? "delivery.early_answers_used" : "delivery.early_answers_dropped");
      }
      if (part.empty()) {
        std::vector<Delivery> deliveries;
        deliveries.reserve(count);
        for (size_t k = 0; k < count; ++k) {
          const handoff::v1::EventRow& row = page_.items[batch[sent + k]];
          deliveries.push_back(MakeDelivery(config_.source_id, row, FinalityOf(row)));
        }
        if (std::optional<Result> r = RegisterSend(batch, sent, count)) return *r;
        part = config_.sink->Deliver(config_.source_id, deliveries);
      }
      part.resize(count);  // a missing answer is a transport error
      if (FaultPoints::Hit(PointName(config_.stage, "after_deliver"))) {
        return Make(Kind::kCrashed, "after_deliver");
      }
      if (Cancelled()) return Make(Kind::kCancelled);
      sent += count;
      const bool clean = std::all_of(part.begin(), part.end(), [](const SinkAnswer& a) {
        return a.kind == SinkAnswer::Kind::kApplied ||
               a.kind == SinkAnswer::Kind::kAlreadyApplied ||
               a.kind == SinkAnswer::Kind::kIgnored;
      });
      answers.insert(answers.end(), std::make_move_iterator(part.begin()),
                     std::make_move_iterator(part.end()));
      // Anything but a clean answer ends the group: its hold, retry or quarantine is
      // made durable before a later event is sent.
      if (!clean) batch.resize(sent);
    }

    // Every answer's decision first: whether this step ends the page decides whether
    // the next run's first call goes out now, before the step is staged and committed.
    std::vector<Decision> decisions;
    std::vector<uint32_t> attempts;  // this one included
    decisions.reserve(batch.size());
    attempts.reserve(batch.size());
    bool all_clean = true;
    for (size_t k = 0; k < batch.size(); ++k) {
      const size_t j = batch[k];
      attempts.push_back((slots_[j].hold != nullptr ? slots_[j].hold->attempts() : 0) + 1);
      decisions.push_back(
          Classify(k < answers.size() ? answers[k] : SinkAnswer{}, attempts.back(), config_.policy));
      all_clean = all_clean && (decisions.back().kind == Decision::Kind::kApplied ||
                                decisions.back().kind == Decision::Kind::kIgnored);
    }
    const bool all_terminal_after = all_clean && AllTerminalWith(batch);
    if (all_terminal_after && config_.on_final_commit) config_.on_final_commit();

    std::unique_ptr<store::StepBatch> step = NewStep(batch.size());
    std::vector<size_t> newly;
    std::vector<std::pair<size_t, std::string>> quarantines;
    std::vector<std::pair<size_t, handoff::v1::Hold>> holds;
    std::vector<absl::Time> retry_at(batch.size(), absl::InfinitePast());
    store::CounterRecord deltas;
    bool progressed = false;
    for (size_t k = 0; k < batch.size(); ++k) {
      const size_t j = batch[k];
      SinkAnswer answer = k < answers.size() ? answers[k] : SinkAnswer{};
      const Decision& d = decisions[k];
      switch (d.kind) {
        case Decision::Kind::kApplied:
        case Decision::Kind::kIgnored: {
          absl::Status s = StageTerminal(j, d.kind, d.reason, step.get());
          if (!s.ok()) return Make(Kind::kStorageFailed, std::string(s.message()), s);
          newly.push_back(j);
          if (d.kind == Decision::Kind::kApplied) {
            deltas.set_applied(deltas.applied() + 1);
            deltas.set_delivered(deltas.delivered() + 1);
          } else {
            deltas.set_ignored(deltas.ignored() + 1);
          }
          progressed = true;
          break;
        }
        case Decision::Kind::kQuarantined:
          quarantines.emplace_back(j, d.reason);
          progressed = true;
          break;
        case Decision::Kind::kReview:
        case Decision::Kind::kDeadLetter: {
          handoff::v1::Hold hold = MakeHold(j,
                                            d.kind == Decision::Kind::kReview
                                                ? handoff::v1::HOLD_KIND_OPERATOR_REVIEW
                                                : handoff::v1::HOLD_KIND_RETRYABLE_DEAD_LETTER,
                                            d, answer, attempts[k]);
          step->PutHold(config_.stage, slots_[j].pos, hold);
          holds.emplace_back(j, std::move(hold));
          break;
        }
        case Decision::Kind::kRetry: {
          // Transport errors do not count towards dead-lettering.
          uint32_t counted = answer.kind == SinkAnswer::Kind::kTransportError ? attempts[k] - 1
                                                                               : attempts[k];
          handoff::v1::Hold hold =
              MakeHold(j, handoff::v1::HOLD_KIND_RETRYING, d, answer, counted);
          step->PutHold(config_.stage, slots_[j].pos, hold);
          holds.emplace_back(j, std::move(hold));
          retry_at[k] = absl::Now() + backoff_.Next(d.retry_after);
          if (config_.observer != nullptr) config_.observer->OnRetry(config_.source_id);
          break;
        }
      }
    }
    if (progressed) backoff_.Reset();
    std::optional<Result> r =
        CommitSlots(step.get(), newly, deltas, config_.fuse_barrier && all_terminal_after,
                    "before_event_commit", "after_event_commit");
    if (!r.has_value() || r->kind == Kind::kPromoted) ForgetRecorded(batch, answers);
    // Holds are durable now (or the attempt ends): mirror them in memory.
    if (!r.has_value() || r->kind == Kind::kPromoted || r->kind == Kind::kCrashed) {
      for (size_t h = 0; h < holds.size(); ++h) {
        const size_t j = holds[h].first;
        slots_[j].hold = std::make_unique<handoff::v1::Hold>(holds[h].second);
        if (holds[h].second.kind() == handoff::v1::HOLD_KIND_RETRYING) {
          slots_[j].state = SlotState::kRetrying;
          for (size_t k = 0; k < batch.size(); ++k) {
            if (batch[k] == j) slots_[j].retry_at = retry_at[k];
          }
        } else {
          slots_[j].state = SlotState::kHeld;
        }
      }
    }
    if (r.has_value()) return *r;
    if (!quarantines.empty()) {
      // Quarantine receipts get their own durable step: until it commits, the decision
      // lives only in memory and blocks the prefix.
      std::unique_ptr<store::StepBatch> qstep = NewStep();
      std::vector<size_t> qnewly;
      store::CounterRecord qdeltas;
      for (const auto& [j, reason] : quarantines) {
        absl::Status s = StageTerminal(j, Decision::Kind::kQuarantined, reason, qstep.get());
        if (!s.ok()) return Make(Kind::kStorageFailed, std::string(s.message()), s);
        qnewly.push_back(j);
      }
      qdeltas.set_quarantined(qnewly.size());
      const bool all_terminal = holds.empty() && AllTerminalWith(qnewly);
      std::optional<Result> qr =
          CommitSlots(qstep.get(), qnewly, qdeltas, config_.fuse_barrier && all_terminal,
                      "before_quarantine_commit", "after_quarantine_commit");
      if (qr.has_value()) return *qr;
    }
  }
}

std::optional<PageAttempt::Result> PageAttempt::RegisterSend(const std::vector<size_t>& batch,
                                                             size_t sent, size_t count) {
  if (config_.unrecorded_sends == nullptr || config_.stage != store::Stage::kDelivery) {
    return std::nullopt;
  }
  std::vector<Position> positions;
  positions.reserve(count);
  for (size_t k = sent; k < sent + count; ++k) positions.push_back(slots_[batch[k]].pos);
  absl::StatusOr<bool> current =
      config_.unrecorded_sends->RegisterIfCurrent(checkpoint_.outbox_epoch(), positions);
  if (!current.ok()) {
    return Make(Kind::kStorageFailed, std::string(current.status().message()), current.status());
  }
  if (!*current) {
    return Make(Kind::kLostRace,
                "a correction rewrote the outbox since this run was read: rereading");
  }
  return std::nullopt;
}

void PageAttempt::ForgetRecorded(const std::vector<size_t>& batch,
                                 const std::vector<SinkAnswer>& answers) const {
  if (config_.unrecorded_sends == nullptr) return;
  // A transport error leaves the sink's outcome unknown: the event stays registered as
  // possibly applied until a later answer is recorded.
  std::vector<Position> recorded;
  recorded.reserve(batch.size());
  for (size_t k = 0; k < batch.size(); ++k) {
    if (k < answers.size() && answers[k].kind != SinkAnswer::Kind::kTransportError) {
      recorded.push_back(slots_[batch[k]].pos);
    }
  }
  config_.unrecorded_sends->Forget(recorded);
}

PageAttempt::Result PageAttempt::Barrier() {
  std::unique_ptr<store::StepBatch> step = NewStep();
  std::optional<Result> r =
      CommitSlots(step.get(), {}, store::CounterRecord(), /*with_barrier=*/true, nullptr, nullptr);
  return r.has_value() ? *r : Make(Kind::kPromoted);
}

handoff::v1::PageAttemptInfo PageAttempt::Info() const {
  handoff::v1::PageAttemptInfo info;
  info.set_request_cursor(request_cursor_);
  info.set_request_version(request_version_);
  info.set_next_cursor(page_.next);
  info.set_events_total(slots_.empty() ? page_.items.size() : slots_.size());
  uint32_t done = 0;
  bool blocking_set = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == SlotState::kTerminal) {
      ++done;
    } else if (!blocking_set) {
      blocking_set = true;
      handoff::v1::EventRef* ref = info.mutable_first_blocking_event();
      ref->set_block_number(slots_[i].pos.block);
      ref->set_log_index(slots_[i].pos.log_index);
      ref->set_block_hash(page_.items[i].block_hash());
    }
  }
  info.set_events_done(done);
  info.set_correction(page_.reorg);
  return info;
}

}  // namespace handoff::consumer
