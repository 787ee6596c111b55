#include "consumer/page_validator.h"

#include <limits>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace handoff::consumer {
namespace {

constexpr uint64_t kMaxIndex = std::numeric_limits<uint64_t>::max();

std::optional<Position> AppliedOf(const store::CheckpointRecord& cp) {
  if (!cp.has_applied()) return std::nullopt;
  return Position{cp.applied_block(), cp.applied_log_index()};
}

// The stable identity (block hash) of the durable outcome or hold at a ledger entry: a
// terminal outcome's, else its hold's event's. Empty: nothing durable there.
const std::string& DurableIdentity(const ReceiptLedger::Entry& entry) {
  if (!entry.terminal_hash.empty() || !entry.hold.has_value()) return entry.terminal_hash;
  return entry.hold->event().block_hash();
}

// The block hash the ledger holds for `block` (its first durable outcome or hold
// there), or null when it holds none.
const std::string* LedgerBlockHash(const ReceiptLedger& ledger, uint64_t block) {
  for (auto it = ledger.entries().lower_bound(Position{block, 0});
       it != ledger.entries().end() && it->first.block == block; ++it) {
    const std::string& identity = DurableIdentity(it->second);
    if (!identity.empty()) return &identity;
  }
  return nullptr;
}

// Positions whose durable outcome or hold the page repeats with the same identity.
absl::flat_hash_set<std::pair<uint64_t, uint64_t>> RepeatedIdentities(
    const Page& page, const ReceiptLedger& ledger) {
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> same;
  for (const handoff::v1::EventRow& row : page.items) {
    const ReceiptLedger::Entry* entry = ledger.Find(PositionOf(row));
    if (entry != nullptr && DurableIdentity(*entry) == row.block_hash()) {
      same.insert({row.block_number(), row.log_index()});
    }
  }
  return same;
}

// Lists as orphans the durable outcomes and holds in the ledger (within `in_scope`) that
// the page does not repeat with the same identity, and rewinds the applied position to
// below the page: the delete-and-insert rule.
template <typename InScope>
void ReplaceDurableOutcomes(const Page& page, const ReceiptLedger& ledger,
                            const std::optional<Position>& applied, const InScope& in_scope,
                            PageVerdict* v) {
  const absl::flat_hash_set<std::pair<uint64_t, uint64_t>> same = RepeatedIdentities(page, ledger);
  for (const auto& [pos, entry] : ledger.entries()) {
    if (!DurableIdentity(entry).empty() && in_scope(pos) &&
        !same.contains(std::make_pair(pos.block, pos.log_index))) {
      v->orphans.push_back(pos);
    }
  }
  if (applied.has_value() && *applied >= Position{page.from, 0}) {
    if (page.from == 0) {
      v->clear_applied = true;
    } else {
      v->rewound_applied = Position{page.from - 1, kMaxIndex};
    }
  }
}

}  // namespace

std::optional<std::pair<Position, Position>> PageRange(const Page& page) {
  if (!page.through.has_value()) {
    if (!page.reorg) return std::nullopt;
    // A correction that covers no block: the chain now ends below `from`, so everything
    // applied from there up was on the abandoned fork.
    return std::make_pair(Position{page.from, 0}, Position{kMaxIndex, kMaxIndex});
  }
  return std::make_pair(Position{page.from, 0}, Position{page.through->number, kMaxIndex});
}

PageVerdict ValidatePage(const Page& page, const std::string& request_cursor,
                         const store::CheckpointRecord& cp, const ReceiptLedger& ledger) {
  PageVerdict v;
  v.nothing_new = page.NothingNewAfter(request_cursor);
  if (!page.items.empty() && page.next == request_cursor) {
    v.violation = absl::StrCat("the cursor did not advance on a page with ", page.items.size(),
                               " items (from block ", page.from, ")");
    return v;
  }
  if (page.through.has_value() && page.through->number < page.from) {
    v.violation = absl::StrCat("page through block ", page.through->number,
                               " is below its from block ", page.from);
    return v;
  }
  if (!page.items.empty() && !page.through.has_value()) {
    v.violation = absl::StrCat("page from block ", page.from, " has ", page.items.size(),
                               " items but a null through");
    return v;
  }

  // Order, range, one hash per block.
  for (size_t i = 0; i < page.items.size(); ++i) {
    const handoff::v1::EventRow& row = page.items[i];
    Position pos = PositionOf(row);
    if (row.block_number() < page.from || row.block_number() > page.through->number) {
      v.violation = absl::StrCat("item ", i, " at ", pos.DebugString(),
                                 " lies outside the page range [", page.from, ", ",
                                 page.through->number, "]");
      return v;
    }
    if (i > 0) {
      const handoff::v1::EventRow& prev = page.items[i - 1];
      Position prev_pos = PositionOf(prev);
      if (!(prev_pos < pos)) {
        v.violation = absl::StrCat("items out of order: item ", i, " at ", pos.DebugString(),
                                   " follows ", prev_pos.DebugString());
        return v;
      }
      if (prev.block_number() == row.block_number() && prev.block_hash() != row.block_hash()) {
        v.violation = absl::StrCat("block ", row.block_number(),
                                   " has two different hashes in one page");
        return v;
      }
    }
  }

  const std::optional<Position> applied = AppliedOf(cp);
  if (!page.reorg) {
    // Gap after the committed range (unless the last page moved the cursor past blocks
    // it did not name).
    if (cp.has_covered() && !cp.covered_open() && page.from > cp.covered_through() + 1) {
      v.violation = absl::StrCat("gap: the page starts at block ", page.from,
                                 " but the committed range ends at block ",
                                 cp.covered_through());
      return v;
    }
    // Receipts above the committed range (blocks after covered_through, or any receipt
    // before the first committed page) were written by an attempt at this same request
    // cursor that a crash abandoned before its barrier. The provider never learned of
    // them (the cursor did not move), so if the chain reorganised those blocks since,
    // it rightly serves a non-correction page with new identities there. Found by
    // tests/torture (regression: tests/crash/abandoned_attempt_reorg_test): such
    // receipts are replaced like a correction's orphans instead of halting the source
    // as PROTOCOL_VIOLATION. Conflicts inside the committed range still halt.
    auto uncommitted = [&cp](Position pos) {
      return !cp.has_covered() || pos.block > cp.covered_through();
    };
    bool replace_uncommitted = false;
    // Items must agree with what was applied: at their own position, and in their block
    // (a new event in a committed block on another fork's hash is that fork's block
    // replacing the applied one, which only a correction may do).
    std::optional<uint64_t> block_checked;
    const std::string* block_hash = nullptr;
    for (const handoff::v1::EventRow& row : page.items) {
      Position pos = PositionOf(row);
      const ReceiptLedger::Entry* entry = ledger.Find(pos);
      if (entry != nullptr && !entry->terminal_hash.empty()) {
        if (entry->terminal_hash != row.block_hash() && uncommitted(pos)) {
          replace_uncommitted = true;
        } else if (entry->terminal_hash != row.block_hash()) {
          v.violation = absl::StrCat("conflicting identity at applied position ",
                                     pos.DebugString(), ": block hash ", row.block_hash(),
                                     " on a non-correction page, ", entry->terminal_hash,
                                     " applied");
          return v;
        }
      } else if (applied.has_value() && pos <= *applied &&
                 !(entry != nullptr && entry->hold.has_value())) {
        if (uncommitted(pos)) {
          replace_uncommitted = true;
          continue;
        }
        v.violation = absl::StrCat("new event at ", pos.DebugString(),
                                   " at or below the applied position ",
                                   applied->DebugString(),
                                   " on a non-correction page (a backfill the contract forbids)");
        return v;
      }
      if (!uncommitted(pos)) {
        if (block_checked != row.block_number()) {
          block_checked = row.block_number();
          block_hash = LedgerBlockHash(ledger, *block_checked);
        }
        if (block_hash != nullptr && *block_hash != row.block_hash()) {
          v.violation = absl::StrCat("conflicting identity in committed block ", pos.block,
                                     ": block hash ", row.block_hash(), " at ",
                                     pos.DebugString(), " on a non-correction page, ",
                                     *block_hash, " applied");
          return v;
        }
      }
    }
    // Above the committed range, an outcome or hold the page does not repeat with the
    // same identity (an event the page leaves out, or a hold for another event at a
    // position) is the abandoned attempt's too: on the fork the chain left, or of a
    // larger page the provider has since split (the first page of a deep correction
    // leaves the rest of the old fork above it). Left in place it would stay among the
    // rows, or block the barrier, beside the new fork's events.
    if (!replace_uncommitted) {
      // (Most pages have no durable outcome above the committed range: nothing to do.)
      std::optional<absl::flat_hash_set<std::pair<uint64_t, uint64_t>>> same;
      for (const auto& [pos, entry] : ledger.entries()) {
        if (!uncommitted(pos) || DurableIdentity(entry).empty()) continue;
        if (!same.has_value()) same = RepeatedIdentities(page, ledger);
        if (!same->contains(std::make_pair(pos.block, pos.log_index))) {
          replace_uncommitted = true;
          break;
        }
      }
    }
    // Inside the committed range, an applied event the overlapping page does not repeat
    // is left as it is: overlap at or below the applied prefix is acceptable (seed 000,
    // walkthrough 1), and only a correction page replaces committed history.
    if (!replace_uncommitted) return v;
    // Replace the abandoned attempt's durable outcomes that the page does not repeat
    // (same identity: kept and replayed), and rewind the applied position to below the
    // page, exactly as for a correction restricted to the uncommitted blocks.
    ReplaceDurableOutcomes(page, ledger, applied, uncommitted, &v);
    return v;
  }

  // Correction: the page's range replaces what was applied there.
  ReplaceDurableOutcomes(page, ledger, applied, [](Position) { return true; }, &v);
  // An empty correction that leaves the cursor where it was still names blocks whose
  // events are gone (a provider whose cursor is a block number has nothing else to
  // send): its orphans are deleted and the unchanged cursor committed. Only once it
  // replaces nothing is it the contract's no-op "nothing new yet".
  if (!v.orphans.empty()) v.nothing_new = false;
  if (applied.has_value() && *applied >= Position{page.from, 0}) {
    v.correction_depth = applied->block - page.from + 1;
  } else if (cp.has_covered() && cp.covered_through() >= page.from) {
    v.correction_depth = cp.covered_through() - page.from + 1;
  }
  return v;
}

bool NothingNewWithoutReceipts(const Page& page, const std::string& request_cursor,
                               const store::CheckpointRecord& checkpoint) {
  if (!page.NothingNewAfter(request_cursor) || PageRange(page).has_value()) return false;
  return ValidatePage(page, request_cursor, checkpoint, ReceiptLedger()).violation.empty();
}

}  // namespace handoff::consumer
