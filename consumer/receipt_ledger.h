// ReceiptLedger: what the store durably knows about the events of a position range.
//
// For the ingest stage a derived row is the event's receipt: a row is written, in the
// same batch as the applied position, only when the event has a durable terminal
// outcome (applied; or ignored/quarantined, then with a receipt record carrying the
// disposition). A row therefore proves a replay for its stable identity (block hash at
// that position); no high-water mark is ever trusted, because chain sources reorg.
// Holds (review, dead-letter, retrying with persisted attempts) are durable but not
// terminal.
//
// For the delivery stage the receipt records of stage kDelivery play the same role.
//
// A snapshot: loaded with one range scan per column family, then read in memory.
#ifndef HANDOFF_CONSUMER_RECEIPT_LEDGER_H_
#define HANDOFF_CONSUMER_RECEIPT_LEDGER_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "handoff/v1/source.pb.h"
#include "store/position.h"
#include "store/store.h"

namespace handoff::consumer {

class ReceiptLedger {
 public:
  struct Entry {
    // Stable identity of the terminal outcome at this position (empty: none).
    std::string terminal_hash;
    // A durable, non-terminal hold at this position, if any.
    std::optional<handoff::v1::Hold> hold;
  };

  // Loads the ledger of `stage` over [from, to].
  static absl::StatusOr<ReceiptLedger> Load(const store::Store& store,
                                            absl::string_view source_id, store::Stage stage,
                                            Position from, Position to);

  // The entry at `pos`, or nullptr.
  const Entry* Find(Position pos) const;
  const std::map<Position, Entry>& entries() const { return entries_; }

 private:
  std::map<Position, Entry> entries_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_RECEIPT_LEDGER_H_
