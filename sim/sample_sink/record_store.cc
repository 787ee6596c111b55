#include "sim/sample_sink/record_store.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace handoff::sim {
namespace {

// The one place rocksdb::Status becomes absl::Status. Storage failures are transient
// from a caller's point of view (the sink answers UNAVAILABLE, Handoff retries).
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("sample sink storage: ", what, ": ", s.ToString()));
}

// Value layout: 4-byte little-endian attempts, then the serialized ApplyRequest.
std::string Encode(const SinkRecord& record) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((record.attempts >> (8 * i)) & 0xff);
  record.request.AppendToString(&out);
  return out;
}

absl::StatusOr<SinkRecord> Decode(const rocksdb::Slice& value) {
  if (value.size() < 4) return absl::DataLossError("sample sink record too short");
  SinkRecord record;
  for (int i = 0; i < 4; ++i) {
    record.attempts |= static_cast<uint32_t>(static_cast<unsigned char>(value[i])) << (8 * i);
  }
  if (!record.request.ParseFromArray(value.data() + 4, static_cast<int>(value.size() - 4))) {
    return absl::DataLossError("sample sink record: unparsable request");
  }
  return record;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordStore>> RecordStore::Open(const std::string& path, bool sync) {
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  absl::Status s = FromRocks(rocksdb::DB::Open(options, path, &raw), "open");
  if (!s.ok()) return s;
  std::unique_ptr<rocksdb::DB> db(raw);
  uint64_t size = 0;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++size;
  s = FromRocks(it->status(), "count");
  if (!s.ok()) return s;
  it.reset();
  return std::unique_ptr<RecordStore>(new RecordStore(std::move(db), sync, size));
}

RecordStore::RecordStore(std::unique_ptr<rocksdb::DB> db, bool sync, uint64_t size)
    : db_(std::move(db)), sync_(sync), size_(size) {}

RecordStore::~RecordStore() = default;

absl::StatusOr<std::optional<SinkRecord>> RecordStore::Get(const std::string& key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) return std::optional<SinkRecord>();
  absl::Status status = FromRocks(s, "get");
  if (!status.ok()) return status;
  absl::StatusOr<SinkRecord> record = Decode(value);
  if (!record.ok()) return record.status();
  return std::optional<SinkRecord>(*std::move(record));
}

absl::Status RecordStore::Write(const std::vector<std::pair<std::string, SinkRecord>>& records,
                                uint64_t new_keys) {
  if (records.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& [key, record] : records) {
    absl::Status s = FromRocks(batch.Put(key, Encode(record)), "batch");
    if (!s.ok()) return s;
  }
  rocksdb::WriteOptions options;
  options.sync = sync_;
  absl::Status s = FromRocks(db_->Write(options, &batch), "write");
  if (s.ok()) size_.fetch_add(new_keys, std::memory_order_relaxed);
  return s;
}

absl::StatusOr<std::map<std::string, SinkRecord>> RecordStore::All() const {
  std::map<std::string, SinkRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    absl::StatusOr<SinkRecord> record = Decode(it->value());
    if (!record.ok()) return record.status();
    out.emplace(it->key().ToString(), *std::move(record));
  }
  absl::Status s = FromRocks(it->status(), "scan");
  if (!s.ok()) return s;
  return out;
}

}  // namespace handoff::sim
