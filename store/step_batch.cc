#include "store/step_batch.h"

namespace handoff::store {

void StepBatch::Put(rocksdb::ColumnFamilyHandle* cf, const std::string& key,
                    const google::protobuf::MessageLite& msg) {
  scratch_.clear();
  msg.AppendToString(&scratch_);
  batch_.Put(cf, key, scratch_);
}

const std::string& StepBatch::PositionalKey(Position pos) {
  keys::AssignPositional(source_id_, pos, &key_);
  return key_;
}

const std::string& StepBatch::StagedKey(Stage stage, Position pos) {
  keys::AssignStaged(source_id_, stage, pos, &key_);
  return key_;
}

void StepBatch::PutRow(Position pos, absl::string_view serialized_row) {
  batch_.Put(cfs_->rows, PositionalKey(pos),
             rocksdb::Slice(serialized_row.data(), serialized_row.size()));
}

void StepBatch::DeleteRow(Position pos) {
  batch_.Delete(cfs_->rows, PositionalKey(pos));
}

void StepBatch::PutReceipt(Stage stage, Position pos, const ReceiptRecord& receipt) {
  Put(cfs_->receipts, StagedKey(stage, pos), receipt);
}

void StepBatch::DeleteReceipt(Stage stage, Position pos) {
  batch_.Delete(cfs_->receipts, StagedKey(stage, pos));
}

void StepBatch::PutQuarantine(Stage stage, Position pos,
                              const handoff::v1::QuarantineRecord& rec) {
  changes_operator_records_ = true;
  Put(cfs_->quarantine, StagedKey(stage, pos), rec);
}

void StepBatch::DeleteQuarantine(Stage stage, Position pos) {
  changes_operator_records_ = true;
  batch_.Delete(cfs_->quarantine, StagedKey(stage, pos));
}

void StepBatch::PutHold(Stage stage, Position pos, const handoff::v1::Hold& hold) {
  changes_operator_records_ = true;
  Put(cfs_->holds, StagedKey(stage, pos), hold);
}

void StepBatch::DeleteHold(Stage stage, Position pos) {
  changes_operator_records_ = true;
  batch_.Delete(cfs_->holds, StagedKey(stage, pos));
}

void StepBatch::PutOutbox(Position pos, absl::string_view serialized_row) {
  NoteOutboxWrite(pos);
  batch_.Put(cfs_->outbox, PositionalKey(pos),
             rocksdb::Slice(serialized_row.data(), serialized_row.size()));
}

void StepBatch::DeleteOutbox(Position pos) {
  NoteOutboxWrite(pos);
  deletes_outbox_ = true;
  batch_.Delete(cfs_->outbox, PositionalKey(pos));
}

}  // namespace handoff::store
