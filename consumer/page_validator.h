// PageValidator: the one place that decides whether a fetched page may be applied.
//
// It runs before any effect of the page and checks the provider contract against the
// durable state (provider-contract.md, "A page that breaks this contract"):
//  * items strictly increasing by position, each inside [from, through.number], one
//    block hash per block;
//  * a non-correction page neither leaves a gap after the committed range nor
//    conflicts with committed history: an item inside the committed range must be a
//    replay of the same identity (overlap is fine, rewriting history is not; an applied
//    event the overlap leaves out stays, seed 000 walkthrough 1);
//  * above the committed range, outcomes and holds written by an attempt a crash
//    abandoned are replaced like a correction's when the page does not repeat them
//    with the same identity (the provider never learned of them);
//  * a non-empty page must advance the cursor.
// A correction page (reorg: true) is the documented exception: its range replaces what
// was applied there (delete and insert), up from `from` without end when it covers no
// block (null through: the chain now ends below it); the validator lists the orphaned
// positions and how far the applied position rewinds. It never clamps `from` to the
// start block.
//
// Pure function of its inputs; thread-compatible.
#ifndef HANDOFF_CONSUMER_PAGE_VALIDATOR_H_
#define HANDOFF_CONSUMER_PAGE_VALIDATOR_H_

#include <optional>
#include <string>
#include <vector>

#include "consumer/page.h"
#include "consumer/receipt_ledger.h"
#include "store/position.h"
#include "store/records.pb.h"

namespace handoff::consumer {

struct PageVerdict {
  // Non-empty: the page breaks the contract; the source halts as PROTOCOL_VIOLATION
  // with this text (the details an operator needs).
  std::string violation;
  // An empty page whose next equals the request cursor: nothing new, back off.
  bool nothing_new = false;
  // Correction (or receipts of an attempt a crash abandoned above the committed range,
  // see ValidatePage): positions whose durable outcome the page replaces.
  std::vector<Position> orphans;
  // Correction: the applied position after deleting the replaced range (nullopt with
  // clear_applied = true means "nothing applied").
  std::optional<Position> rewound_applied;
  bool clear_applied = false;
  // Correction: how many blocks below the committed range the page reaches.
  uint64_t correction_depth = 0;
};

// The position range a page replaces: [from:0, through:max]; for a correction with a
// null through, everything from `from` up; nullopt when a non-correction page covers no
// block (an empty page with a null through).
std::optional<std::pair<Position, Position>> PageRange(const Page& page);

PageVerdict ValidatePage(const Page& page, const std::string& request_cursor,
                         const store::CheckpointRecord& checkpoint,
                         const ReceiptLedger& ledger);

// True when ValidatePage would call `page` nothing new without a violation and without
// receipts to read (the page covers no block): applying it is a no-op. What a caught-up
// worker's IdlePoller decides alone; any other page goes through the whole attempt.
bool NothingNewWithoutReceipts(const Page& page, const std::string& request_cursor,
                               const store::CheckpointRecord& checkpoint);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PAGE_VALIDATOR_H_
