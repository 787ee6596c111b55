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

namespace {

size_t VarintLength(uint64_t v) {
  size_t n = 1;
  while (v >= 128) {
    v >>= 7;
    ++n;
  }
  return n;
}

}  // namespace

void StepBatch::PutRow(Position pos, absl::string_view serialized_row) {
  // Epoch 1 as the placeholder: the key's length and layout are final, only its first
  // eight bytes change (Store::CommitStep).
  keys::AssignRowKey(1, source_id_, pos, &key_);
  batch_.Put(cfs_->rows, key_, rocksdb::Slice(serialized_row.data(), serialized_row.size()));
  // A Put record ends with the key, the value's varint length and the value.
  const size_t value_offset = batch_.GetDataSize() - serialized_row.size();
  row_puts_.push_back(RowPut{pos,
                             value_offset - VarintLength(serialized_row.size()) - key_.size(),
                             value_offset, serialized_row.size()});
}

void StepBatch::DeleteRow(Position pos) { row_deletes_.push_back(pos); }

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

void StepBatch::DeleteOutboxRange(Position first, Position last) {
  NoteOutboxWrite(first);
  deletes_outbox_ = true;
  scratch_ = keys::Positional(source_id_, last);
  scratch_.push_back('\0');  // the key right after `last`'s: the end is exclusive
  batch_.DeleteRange(cfs_->outbox, PositionalKey(first), scratch_);
}

}  // namespace handoff::store
