#include "store/step_batch.h"

namespace handoff::store {

void StepBatch::Put(rocksdb::ColumnFamilyHandle* cf, const std::string& key,
                    const google::protobuf::MessageLite& msg) {
  scratch_.clear();
  msg.AppendToString(&scratch_);
  batch_.Put(cf, key, scratch_);
}

void StepBatch::PutRow(Position pos, absl::string_view serialized_row) {
  batch_.Put(cfs_->rows, keys::Positional(source_id_, pos),
             rocksdb::Slice(serialized_row.data(), serialized_row.size()));
}

void StepBatch::DeleteRow(Position pos) {
  batch_.Delete(cfs_->rows, keys::Positional(source_id_, pos));
}

void StepBatch::PutReceipt(Stage stage, Position pos, const ReceiptRecord& receipt) {
  Put(cfs_->receipts, keys::Staged(source_id_, stage, pos), receipt);
}

void StepBatch::DeleteReceipt(Stage stage, Position pos) {
  batch_.Delete(cfs_->receipts, keys::Staged(source_id_, stage, pos));
}

void StepBatch::PutQuarantine(Stage stage, Position pos,
                              const handoff::v1::QuarantineRecord& rec) {
  Put(cfs_->quarantine, keys::Staged(source_id_, stage, pos), rec);
}

void StepBatch::DeleteQuarantine(Stage stage, Position pos) {
  batch_.Delete(cfs_->quarantine, keys::Staged(source_id_, stage, pos));
}

void StepBatch::PutHold(Stage stage, Position pos, const handoff::v1::Hold& hold) {
  Put(cfs_->holds, keys::Staged(source_id_, stage, pos), hold);
}

void StepBatch::DeleteHold(Stage stage, Position pos) {
  batch_.Delete(cfs_->holds, keys::Staged(source_id_, stage, pos));
}

void StepBatch::PutOutbox(Position pos, absl::string_view serialized_row) {
  batch_.Put(cfs_->outbox, keys::Positional(source_id_, pos),
             rocksdb::Slice(serialized_row.data(), serialized_row.size()));
}

void StepBatch::DeleteOutbox(Position pos) {
  batch_.Delete(cfs_->outbox, keys::Positional(source_id_, pos));
}

}  // namespace handoff::store
