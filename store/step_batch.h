// StepBatch: the contents of one atomic step of one source.
//
// A step is everything one durable commit changes: effects (rows, outbox entries),
// receipts, quarantine records, holds or their removal. Store::CommitStep writes the
// batch together with the checkpoint update in one RocksDB WriteBatch, synced, only if
// the checkpoint fence still holds; otherwise nothing of it is written.
//
// Not thread-safe: one step is built by one thread.
#ifndef HANDOFF_STORE_STEP_BATCH_H_
#define HANDOFF_STORE_STEP_BATCH_H_

#include <optional>
#include <vector>
#include <string>

#include "absl/strings/string_view.h"
#include "handoff/v1/source.pb.h"
#include "rocksdb/write_batch.h"
#include "store/column_families.h"
#include "store/keys.h"
#include "store/position.h"
#include "store/records.pb.h"

namespace handoff::store {

class Store;

class StepBatch {
 public:
  // Use Store::NewStep.
  StepBatch(const ColumnFamilies* cfs, absl::string_view source_id, size_t reserve_bytes = 0)
      : cfs_(cfs), source_id_(source_id), batch_(reserve_bytes) {}

  StepBatch(const StepBatch&) = delete;
  StepBatch& operator=(const StepBatch&) = delete;

  const std::string& source_id() const { return source_id_; }

  // Derived rows. `row` is an encoded event row (store/row_codec.h); a row is also the ingest
  // receipt of its event when the source's effect is local rows. A row's key names the
  // epoch it is written in, which only Store::CommitStep knows: the batch holds the key
  // with a placeholder epoch that the commit fills in, and a deletion is only noted
  // (the commit finds the epoch that holds the row). See store.h, "Row epochs".
  void PutRow(Position pos, absl::string_view serialized_row);
  void DeleteRow(Position pos);

  void PutReceipt(Stage stage, Position pos, const ReceiptRecord& receipt);
  void DeleteReceipt(Stage stage, Position pos);

  void PutQuarantine(Stage stage, Position pos, const handoff::v1::QuarantineRecord& rec);
  void DeleteQuarantine(Stage stage, Position pos);

  void PutHold(Stage stage, Position pos, const handoff::v1::Hold& hold);
  void DeleteHold(Stage stage, Position pos);

  // Outbox entries: the positions awaiting gated delivery. An entry put without a row
  // stands for the row at its position, which this step or an earlier one wrote
  // (PutRow): a gated event's row is stored once, not twice (schema version 3), and
  // Store::ScanOutbox reads it from the rows. An entry given `serialized_row` (an encoded
  // row, store/row_codec.h) carries it itself, as every entry of a version 1-2 database.
  void PutOutbox(Position pos, absl::string_view serialized_row = {});
  void DeleteOutbox(Position pos);
  // Deletes every outbox entry of the source in [first, last] with one range deletion:
  // what the delivery stage stages for a run of consecutive entries it delivered, in
  // place of a deletion per entry (each one a memtable insert). REQUIRES: first <= last.
  void DeleteOutboxRange(Position first, Position last);

  // The lowest position of an outbox entry this step puts or deletes, and whether it
  // deletes one: an ingest step that rewrites entries the delivery stage may have read
  // fences that stage (Store::CommitStep).
  const std::optional<Position>& lowest_outbox_write() const { return lowest_outbox_write_; }
  bool deletes_outbox() const { return deletes_outbox_; }
  // A step of a page that replaces history (a correction, or the outcomes of an attempt a
  // crash abandoned): whatever it writes, it fences the delivery stage. Its new entries
  // may lie inside a run the delivery already read from before the correction (up to the
  // ingest position published then), even above the delivery's own position and with
  // nothing deleted: a commit of that run would step over them, or delete them with its
  // range deletion.
  void MarkReplacesHistory() { replaces_history_ = true; }
  bool replaces_history() const { return replaces_history_; }

  // Number of operations added so far (a noted row deletion counts once added).
  int count() const { return batch_.Count() + static_cast<int>(row_deletes_.size()); }
  bool empty() const { return count() == 0; }
  size_t byte_size() const { return batch_.GetDataSize(); }
  // True once the step puts or deletes a hold or a quarantine record: what operators
  // list and act on (such a step is never committed deferred, see Store::CommitStep).
  bool changes_operator_records() const { return changes_operator_records_; }
  void Clear() {
    batch_.Clear();
    changes_operator_records_ = false;
    lowest_outbox_write_.reset();
    deletes_outbox_ = false;
    replaces_history_ = false;
    row_puts_.clear();
    row_deletes_.clear();
  }

 private:
  friend class Store;
  void Put(rocksdb::ColumnFamilyHandle* cf, const std::string& key,
           const google::protobuf::MessageLite& msg);

  void NoteOutboxWrite(Position pos) {
    if (!lowest_outbox_write_.has_value() || pos < *lowest_outbox_write_) {
      lowest_outbox_write_ = pos;
    }
  }

  // The key of an event's entry, in key_ (valid until the next call).
  const std::string& PositionalKey(Position pos);
  const std::string& StagedKey(Stage stage, Position pos);

  // A row put: its position, and where its key's epoch bytes and its value lie in the
  // batch.
  struct RowPut {
    Position pos;
    size_t epoch_offset;
    size_t value_offset;
    size_t value_size;
  };

  const ColumnFamilies* const cfs_;
  const std::string source_id_;
  rocksdb::WriteBatch batch_;
  std::string scratch_;  // a serialized record
  std::string key_;      // an event's key
  bool changes_operator_records_ = false;
  std::optional<Position> lowest_outbox_write_;
  bool deletes_outbox_ = false;
  bool replaces_history_ = false;
  std::vector<RowPut> row_puts_;        // in the order put
  std::vector<Position> row_deletes_;  // resolved to keys by the commit
};

}  // namespace handoff::store

#endif  // HANDOFF_STORE_STEP_BATCH_H_
