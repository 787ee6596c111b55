// RecordStore: the sample sink's durable idempotency table, one RocksDB of its own.
//
// Model: key = the delivery's idempotency key, value = the first request recorded for it
// plus the number of Apply attempts seen for it. A key is written at most once as a new
// record; later attempts only raise its attempt count.
//
// Invariant: Write() is atomic (one WriteBatch) and, with sync on, durable when it returns
// OK: a crash after OK loses nothing, a crash before loses the whole batch.
//
// Thread-safe (RocksDB is); callers that need read-then-write atomicity serialise
// themselves (SinkCore does).
#ifndef HANDOFF_SIM_SAMPLE_SINK_RECORD_STORE_H_
#define HANDOFF_SIM_SAMPLE_SINK_RECORD_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "handoff/v1/event_sink.pb.h"
#include "rocksdb/db.h"

namespace handoff::sim {

// One recorded delivery.
struct SinkRecord {
  // The request as first recorded (source_id, idempotency_key, event, finality).
  handoff::v1::ApplyRequest request;
  // 1 + the duplicate attempts answered ALREADY_APPLIED.
  uint32_t attempts = 0;
};

class RecordStore {
 public:
  // Opens (creating if missing) the table at `path`. `sync`: fsync every Write.
  static absl::StatusOr<std::unique_ptr<RecordStore>> Open(const std::string& path, bool sync);

  RecordStore(const RecordStore&) = delete;
  RecordStore& operator=(const RecordStore&) = delete;
  ~RecordStore();

  // The record of `key`, or nullopt.
  absl::StatusOr<std::optional<SinkRecord>> Get(const std::string& key) const;

  // Writes all (key, record) pairs in one batch with one sync; `new_keys` of them are keys
  // not in the table before (kept in size()).
  absl::Status Write(const std::vector<std::pair<std::string, SinkRecord>>& records,
                     uint64_t new_keys);

  // Every record, by key.
  absl::StatusOr<std::map<std::string, SinkRecord>> All() const;

  // Number of keys in the table: counted at Open, then kept by Write. Cheap.
  uint64_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  RecordStore(std::unique_ptr<rocksdb::DB> db, bool sync, uint64_t size);

  // Constant after construction.
  const std::unique_ptr<rocksdb::DB> db_;
  const bool sync_;
  std::atomic<uint64_t> size_;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SAMPLE_SINK_RECORD_STORE_H_
