// The column families of the Handoff database, named for what they hold.
#ifndef HANDOFF_STORE_COLUMN_FAMILIES_H_
#define HANDOFF_STORE_COLUMN_FAMILIES_H_

#include "rocksdb/db.h"

namespace handoff::store {

// Handles owned by the Store; valid while the Store is open.
struct ColumnFamilies {
  rocksdb::ColumnFamilyHandle* sources = nullptr;      // <id> -> handoff.v1.Source
  rocksdb::ColumnFamilyHandle* checkpoints = nullptr;  // <id,stage> -> CheckpointRecord
  rocksdb::ColumnFamilyHandle* receipts = nullptr;     // <id,stage,pos> -> ReceiptRecord
  rocksdb::ColumnFamilyHandle* quarantine = nullptr;   // <id,stage,pos> -> QuarantineRecord
  rocksdb::ColumnFamilyHandle* holds = nullptr;        // <id,stage,pos> -> Hold
  rocksdb::ColumnFamilyHandle* rows = nullptr;         // <epoch,id,pos> -> encoded EventRow (row_codec.h)
  rocksdb::ColumnFamilyHandle* outbox = nullptr;       // <id,pos> -> "" (= its row) or a row
  rocksdb::ColumnFamilyHandle* meta = nullptr;         // name -> value
  rocksdb::ColumnFamilyHandle* row_segments = nullptr;  // <id,pos> -> epoch (store.h)
};

}  // namespace handoff::store

#endif  // HANDOFF_STORE_COLUMN_FAMILIES_H_
