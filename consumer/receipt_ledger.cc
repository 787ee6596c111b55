#include "consumer/receipt_ledger.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "consumer/fault_points.h"
#include "store/records.pb.h"
#include "store/row_codec.h"

namespace handoff::consumer {

absl::StatusOr<ReceiptLedger> ReceiptLedger::Load(const store::Store& store,
                                                  absl::string_view source_id,
                                                  store::Stage stage, Position from,
                                                  Position to) {
  ReceiptLedger ledger;
  absl::Status parse_error;
  // Outcomes and holds from one point in time (Store::Snapshot explains the race).
  const std::unique_ptr<store::Store::Snapshot> at = store.NewSnapshot();
  if (stage == store::Stage::kIngest) {
    RETURN_IF_ERROR(store.ScanRows(source_id, from, to,
                                   [&](Position pos, absl::string_view value) {
                                     handoff::v1::EventRow row;
                                     absl::Status s = store::DecodeRow(value, &row);
                                     if (!s.ok()) {
                                       parse_error = absl::DataLossError(absl::StrCat(
                                           s.message(), " at ", pos.DebugString()));
                                       return false;
                                     }
                                     ledger.entries_[pos].terminal_hash = row.block_hash();
                                     return true;
                                   },
                                   at.get()));
  } else {
    RETURN_IF_ERROR(store.ScanStaged(
        store::StagedFamily::kReceipts, source_id, stage, from, to,
        [&](Position pos, absl::string_view value) {
          store::ReceiptRecord receipt;
          if (!receipt.ParseFromArray(value.data(), value.size())) {
            parse_error = absl::DataLossError(absl::StrCat("unreadable receipt at ",
                                                           pos.DebugString()));
            return false;
          }
          ledger.entries_[pos].terminal_hash = receipt.block_hash();
          return true;
        },
        at.get()));
  }
  RETURN_IF_ERROR(parse_error);
  // An interleaving point, not a crash point (a read has nothing to abandon): a test runs
  // a hold resolution here, between the two scans.
  FaultPoints::Hit("ledger.between_scans");
  RETURN_IF_ERROR(store.ScanStaged(store::StagedFamily::kHolds, source_id, stage, from, to,
                                   [&](Position pos, absl::string_view value) {
                                     handoff::v1::Hold hold;
                                     if (!hold.ParseFromArray(value.data(), value.size())) {
                                       parse_error = absl::DataLossError(absl::StrCat(
                                           "unreadable hold at ", pos.DebugString()));
                                       return false;
                                     }
                                     ledger.entries_[pos].hold = std::move(hold);
                                     return true;
                                   },
                                   at.get()));
  RETURN_IF_ERROR(parse_error);
  return ledger;
}

const ReceiptLedger::Entry* ReceiptLedger::Find(Position pos) const {
  auto it = entries_.find(pos);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace handoff::consumer
