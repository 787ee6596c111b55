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
  ASSIGN_OR_RETURN(const std::unique_ptr<store::Store::SourceView> at,
                   store.NewSourceView(source_id));
  if (stage == store::Stage::kIngest) {
    store::RowDecoder decoder;
    handoff::v1::EventRow row;
    RETURN_IF_ERROR(at->ScanRows(from, to, [&](Position pos, absl::string_view value) {
      absl::Status s = decoder.Decode(value, &row);
      if (!s.ok()) {
        parse_error = absl::DataLossError(absl::StrCat(s.message(), " at ", pos.DebugString()));
        return false;
      }
      ledger.entries_[pos].terminal_hash = row.block_hash();
      return true;
    }));
  } else {
    RETURN_IF_ERROR(at->ScanStaged(
        store::StagedFamily::kReceipts, stage, from, to,
        [&](Position pos, absl::string_view value) {
          store::ReceiptRecord receipt;
          if (!receipt.ParseFromArray(value.data(), value.size())) {
            parse_error = absl::DataLossError(absl::StrCat("unreadable receipt at ",
                                                           pos.DebugString()));
            return false;
          }
          ledger.entries_[pos].terminal_hash = receipt.block_hash();
          return true;
        }));
  }
  RETURN_IF_ERROR(parse_error);
  // An interleaving point, not a crash point (a read has nothing to abandon): a test runs
  // a hold resolution here, between the two scans.
  FaultPoints::Hit("ledger.between_scans");
  RETURN_IF_ERROR(at->ScanStaged(store::StagedFamily::kHolds, stage, from, to,
                                 [&](Position pos, absl::string_view value) {
                                   handoff::v1::Hold hold;
                                   if (!hold.ParseFromArray(value.data(), value.size())) {
                                     parse_error = absl::DataLossError(
                                         absl::StrCat("unreadable hold at ", pos.DebugString()));
                                     return false;
                                   }
                                   ledger.entries_[pos].hold = std::move(hold);
                                   return true;
                                 }));
  RETURN_IF_ERROR(parse_error);
  return ledger;
}

const ReceiptLedger::Entry* ReceiptLedger::Find(Position pos) const {
  auto it = entries_.find(pos);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace handoff::consumer
