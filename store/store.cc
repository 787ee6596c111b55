#include "store/store.h"

#include <openssl/sha.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/base/dynamic_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/slice_transform.h"
#include "rocksdb/table.h"
#include "rocksdb/transaction_log.h"
#include "rocksdb/utilities/options_util.h"
#include "store/rocks_status.h"

namespace handoff::store {
namespace {

constexpr char kSchemaKey[] = "schema_version";
constexpr char kMagicKey[] = "handoff";
// meta/"version_floor/<id>": the lowest checkpoint version a re-created source may use,
// written by DeleteSource so that an attempt fenced on the deleted source's checkpoint
// cannot pass the fence of a new source with the same id.
constexpr char kVersionFloorPrefix[] = "version_floor/";
// meta/"hold_floor/<id>/<stage>/<block>:<log_index>": the highest version a hold of that
// event position had when it was removed (resolved, applied, replaced by a correction,
// or wiped by a rebuild or the source's deletion). A later hold there, which the worker
// starts at version 1 again, is stored above it (Store::HoldVersionWritesLocked): an
// operator's decision quotes the hold version it read, and must never pass the check of
// another event's hold. Kept like the version floor, for the life of the database: one
// short record per position that ever had a hold.
constexpr char kHoldFloorPrefix[] = "hold_floor/";

// Order matters: index i of the handle vector is this name. A literal, not
// rocksdb::kDefaultColumnFamilyName.c_str(): that std::string lives in another
// translation unit and need not be constructed when this array is initialised.
const char* const kFamilyNames[] = {
    "default", "sources", "checkpoints", "receipts", "quarantine", "holds", "rows", "outbox",
    "meta", "row_segments",
};
constexpr int kFamilyCount = sizeof(kFamilyNames) / sizeof(kFamilyNames[0]);

// The families written once per event; the others take a few records per page.
bool IsPerEventFamily(absl::string_view name) {
  return name == "rows" || name == "receipts" || name == "outbox";
}

rocksdb::ColumnFamilyOptions FamilyOptions(const StoreOptions& options,
                                           const std::shared_ptr<rocksdb::Cache>& cache,
                                           absl::string_view family) {
  rocksdb::ColumnFamilyOptions cf;
  const size_t write_buffer = IsPerEventFamily(family)
                                  ? options.write_buffer_bytes
                                  : std::min(options.write_buffer_bytes, kSmallWriteBufferBytes);
  cf.write_buffer_size = write_buffer;
  cf.max_write_buffer_number = std::max(2, options.max_write_buffers);
  cf.min_write_buffer_number_to_merge = 1;
  // L1 holds about what L0 holds when it compacts (4 memtables' worth).
  cf.max_bytes_for_level_base = 4 * write_buffer;
  // Rows are mostly hex text that compresses about 2x. Ingest is CPU-bound on small
  // machines (bench/REPORT.md, History), and with ZSTD on the bottommost level every
  // early compaction (L1 is the bottommost level of a young database) cost about half
  // the CPU of a bare write loop. So: no compression where data is rewritten soon (L0,
  // L1: flushes and the first compaction), LZ4 (cheap, ~0.5 GB/s) below, where data
  // settles. The WAL (the synced bytes) is never compressed.
  cf.compression = rocksdb::kNoCompression;
  cf.compression_per_level = {rocksdb::kNoCompression, rocksdb::kNoCompression,
                              rocksdb::kLZ4Compression, rocksdb::kLZ4Compression,
                              rocksdb::kLZ4Compression, rocksdb::kLZ4Compression,
                              rocksdb::kLZ4Compression};
  cf.bottommost_compression = rocksdb::kDisableCompressionOption;  // per level, above
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  // No bloom filters: every read of the per-event families is a range scan over a page's
  // or a run's positions (ReceiptLedger::Load, QueryEvents, the outbox), which a
  // whole-key filter cannot answer, while building one at every flush and compaction
  // cost 4-10% of ingest's CPU (bench/HISTORY.md item 57). Point reads (checkpoints,
  // sources, holds) go to small families that stay in the block cache.
  // 16 KiB data blocks where rows are: their reads are range scans, which take whole
  // blocks anyway, and a flush or compaction pays per block (a block-cache lookup for
  // each input block, a checksum, an index entry): 4x fewer of them cost 64 sources
  // ~7-10% less CPU per event than RocksDB's 4 KiB (bench/HISTORY.md item 60).
  if (IsPerEventFamily(family)) table.block_size = 16 << 10;
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return cf;
}

absl::string_view View(const rocksdb::Slice& s) { return absl::string_view(s.data(), s.size()); }

rocksdb::Env* EnvOf(const StoreOptions& options) {
  return options.env != nullptr ? options.env : rocksdb::Env::Default();
}

// The smallest key greater than `key`: the exclusive bound of a scan ending at `key`.
std::string KeyAfter(const std::string& key) { return key + '\0'; }

absl::Status Corrupt(absl::string_view what, absl::string_view key) {
  return absl::DataLossError(
      absl::StrCat("storage: cannot parse ", what, " record at key of ", key.size(), " bytes"));
}

std::string VersionFloorKey(absl::string_view id) { return absl::StrCat(kVersionFloorPrefix, id); }

// The hold floor of the hold of `id` at `staged_key` (keys::Staged: "<id>\0", the stage
// byte, then the position).
absl::StatusOr<std::string> HoldFloorKey(absl::string_view id, absl::string_view staged_key) {
  if (staged_key.size() != id.size() + 2 + 16 || !absl::StartsWith(staged_key, id) ||
      staged_key[id.size()] != '\0') {
    return Corrupt("hold key", id);
  }
  ASSIGN_OR_RETURN(Position pos, keys::DecodePosition(staged_key));
  return absl::StrCat(kHoldFloorPrefix, id, "/", static_cast<int>(staged_key[id.size() + 1]),
                      "/", pos.block, ":", pos.log_index);
}

// The holds a step's batch puts and removes, in batch order. Steps remove holds one key at
// a time (StepBatch has no range form for them); any other form is refused.
class HoldWrites : public rocksdb::WriteBatch::Handler {
 public:
  struct Write {
    std::string key;
    std::optional<std::string> value;  // nullopt: a deletion
  };

  explicit HoldWrites(uint32_t holds_family) : holds_(holds_family) {}
  const std::vector<Write>& writes() const { return writes_; }

  rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                        const rocksdb::Slice& value) override {
    if (cf == holds_) writes_.push_back(Write{key.ToString(), value.ToString()});
    return rocksdb::Status::OK();
  }
  rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
    if (cf == holds_) writes_.push_back(Write{key.ToString(), std::nullopt});
    return rocksdb::Status::OK();
  }
  rocksdb::Status SingleDeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
    return DeleteCF(cf, key);
  }
  rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice&,
                                const rocksdb::Slice&) override {
    return Other(cf);
  }
  rocksdb::Status MergeCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Other(cf);
  }
  rocksdb::Status PutEntityCF(uint32_t cf, const rocksdb::Slice&,
                              const rocksdb::Slice&) override {
    return Other(cf);
  }
  rocksdb::Status PutBlobIndexCF(uint32_t cf, const rocksdb::Slice&,
                                 const rocksdb::Slice&) override {
    return Other(cf);
  }

 private:
  rocksdb::Status Other(uint32_t cf) const {
    return cf == holds_ ? rocksdb::Status::NotSupported("a step writes holds one by one")
                        : rocksdb::Status::OK();
  }

  const uint32_t holds_;
  std::vector<Write> writes_;
};

const char* BackgroundWork(rocksdb::BackgroundErrorReason reason) {
  switch (reason) {
    case rocksdb::BackgroundErrorReason::kFlush:
    case rocksdb::BackgroundErrorReason::kFlushNoWAL:
      return "flush";
    case rocksdb::BackgroundErrorReason::kCompaction:
      return "compaction";
    case rocksdb::BackgroundErrorReason::kWriteCallback:
      return "write";
    case rocksdb::BackgroundErrorReason::kMemTable:
      return "memtable switch";
    case rocksdb::BackgroundErrorReason::kManifestWrite:
    case rocksdb::BackgroundErrorReason::kManifestWriteNoWAL:
      return "manifest write";
  }
  return "work";
}

}  // namespace

// Keeps the first failure of RocksDB's background work. RocksDB stops writes after a
// hard one and returns it to the next write, but a store whose sources are all caught
// up may not write for hours, and a soft one (a compaction out of space) does not stop
// writes at all: the store's health reports either at once, and the store refuses
// writes after it as after a failed write (no automatic resume, StoreRocksOptions).
class BackgroundErrorListener : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                         rocksdb::Status* error) override {
    if (error == nullptr || error->ok() || error->IsShutdownInProgress() ||
        error->IsColumnFamilyDropped()) {
      return;
    }
    absl::Status s = FromRocks(*error, absl::StrCat("background ", BackgroundWork(reason)));
    absl::MutexLock lock(&mu_);
    if (first_.ok()) first_ = std::move(s);
  }

  absl::Status first() const {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status first_ ABSL_GUARDED_BY(mu_);
};

std::string IdentityHash(const handoff::v1::SourceSpec& spec) {
  std::string identity;
  for (const std::string* part : {&spec.provider_url(), &spec.chain(), &spec.source(),
                                  &spec.filter()}) {
    absl::StrAppend(&identity, part->size(), ":", *part, ";");
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(identity.data()), identity.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

RocksOptions StoreRocksOptions(const StoreOptions& options) {
  RocksOptions out;
  rocksdb::DBOptions& db_options = out.db;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;
  db_options.keep_log_file_num = 5;
  db_options.max_total_wal_size = 256 << 20;
  // Concurrent commits (many sources) form write groups that share one WAL write and
  // one fsync; pipelining lets the next group's WAL write overlap this group's memtable
  // inserts.
  db_options.enable_pipelined_write = true;
  // The group's leader inserts every batch of the group into the memtable itself. The
  // concurrent path searches the skip list from the top for every key (no splice kept
  // between keys), which with many sources' batches in one group cost a quarter of the
  // CPU in key comparisons; one inserter keeps its splice, and each batch is a run of
  // keys in order. Measured: 64 sources 109-111k -> 139-142k ev/s (bench/HISTORY.md).
  db_options.allow_concurrent_memtable_write = false;
  // Paranoid checks turn background write errors into a stopped DB rather than
  // silently continuing.
  db_options.paranoid_checks = true;
  // No automatic resume after a background write error (a full disk): RocksDB's
  // recovery would write and sync the WAL file that just failed again, which Debian's
  // assertion-enabled librocksdb aborts on. A failed store stays failed (sticky, see
  // health()); the operator frees space and restarts the process.
  db_options.max_bgerror_resume_count = 0;
  if (options.env != nullptr) db_options.env = options.env;
  auto cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  for (const char* name : kFamilyNames) {
    out.families.emplace_back(name, FamilyOptions(options, cache, name));
  }
  return out;
}

size_t StoreMemoryCeiling(const StoreOptions& options) {
  constexpr size_t kWriteGroupBytes = 1 << 20;
  size_t memtables = 0;
  for (const rocksdb::ColumnFamilyDescriptor& family : StoreRocksOptions(options).families) {
    const size_t write_buffer = family.options.write_buffer_size;
    // A memtable is switched once its arena passes the write buffer, so it can hold up
    // to an arena block (an eighth) more, plus the write group that crossed the line
    // (RocksDB's max_write_batch_group_size_bytes, 1 MiB, or one larger batch).
    memtables += static_cast<size_t>(family.options.max_write_buffer_number) *
                 (write_buffer + write_buffer / 8 + kWriteGroupBytes);
  }
  return memtables + options.block_cache_bytes;
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("store: empty data path");
  RocksOptions rocks = StoreRocksOptions(options);
  rocksdb::DBOptions& db_options = rocks.db;

  // A directory with files but no RocksDB CURRENT file is somebody else's: refuse it.
  rocksdb::Env* env = EnvOf(options);
  std::vector<std::string> children;
  if (env->GetChildren(options.path, &children).ok()) {
    bool has_current = false, has_other = false;
    for (const std::string& c : children) {
      if (c == "." || c == "..") continue;
      if (c == "CURRENT") has_current = true;
      else has_other = true;
    }
    if (has_other && !has_current) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store: ", options.path, " is not empty and holds no RocksDB database; refusing "
          "to use a foreign data directory"));
    }
  }

  std::vector<rocksdb::ColumnFamilyDescriptor>& families = rocks.families;
  // Refuse databases that carry column families we do not know (a foreign RocksDB).
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_options, options.path, &existing).ok()) {
    for (const std::string& name : existing) {
      bool known = false;
      for (int i = 0; i < kFamilyCount; ++i) known |= name == kFamilyNames[i];
      if (!known) {
        return absl::FailedPreconditionError(absl::StrCat(
            "store: ", options.path, " holds a RocksDB database with an unknown column "
            "family '", name, "'; it is not a Handoff database"));
      }
    }
  }

  auto background_errors = std::make_shared<BackgroundErrorListener>();
  db_options.listeners.push_back(background_errors);
  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(db_options, options.path, families, &handles, &raw),
                            absl::StrCat("open ", options.path)));
  std::unique_ptr<Store> store(
      new Store(options, std::move(background_errors), raw, std::move(handles)));
  RETURN_IF_ERROR(store->CheckSchema());
  return store;
}

Store::Store(const StoreOptions& options,
             std::shared_ptr<BackgroundErrorListener> background_errors, rocksdb::DB* db,
             std::vector<rocksdb::ColumnFamilyHandle*> handles)
    : options_(options),
      db_(db),
      handles_(std::move(handles)),
      background_errors_(std::move(background_errors)) {
  cfs_.sources = handles_[1];
  cfs_.checkpoints = handles_[2];
  cfs_.receipts = handles_[3];
  cfs_.quarantine = handles_[4];
  cfs_.holds = handles_[5];
  cfs_.rows = handles_[6];
  cfs_.outbox = handles_[7];
  cfs_.meta = handles_[8];
  cfs_.row_segments = handles_[9];
  write_options_.sync = options.sync;
  if (options.sync) {
    syncer_ = std::make_unique<WalSyncer>(
        [this, before = options.before_background_sync] {
          if (before) before();
          return SyncWal();
        },
        options.wal_sync_interval);
  }
}

Store::~Store() {
  // Makes the deferred commits durable (unless the store failed), then stops its thread.
  syncer_.reset();
  {
    absl::MutexLock lock(&wal_file_mu_);
    wal_file_.reset();
  }
  // After a write failure, closing must not flush or sync again (see Open).
  if (!health().ok()) {
    db_->SetDBOptions({{"avoid_flush_during_shutdown", "true"}}).PermitUncheckedError();
  }
  for (rocksdb::ColumnFamilyHandle* h : handles_) db_->DestroyColumnFamilyHandle(h);
  handles_.clear();
  // Close reports background errors; nothing more can be done with them at this point.
  db_->Close().PermitUncheckedError();
}

absl::Status Store::CheckSchema() {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cfs_.meta, kSchemaKey, &value);
  if (s.IsNotFound()) {
    // A new database, unless some family already holds data: then either the schema key
    // was lost or this is another program's RocksDB (which would use "default").
    for (size_t i = 0; i < handles_.size(); ++i) {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), handles_[i]));
      it->SeekToFirst();
      RETURN_IF_ERROR(FromRocks(it->status(), "read family"));
      if (it->Valid()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "store: ", options_.path, " holds data in column family '", kFamilyNames[i],
            "' but no Handoff schema version; refusing to open a foreign or damaged "
            "database"));
      }
    }
    rocksdb::WriteBatch batch;
    batch.Put(cfs_.meta, kSchemaKey, std::to_string(kSchemaVersion));
    batch.Put(cfs_.meta, kMagicKey, "handoff event consumer");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Write(wo, &batch), "write schema version");
  }
  RETURN_IF_ERROR(FromRocks(s, "read schema version"));
  int version = 0;
  if (!absl::SimpleAtoi(value, &version) || version < kOldestReadableSchemaVersion ||
      version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store: ", options_.path, " has schema version '", value, "', this build reads "
        "versions ", kOldestReadableSchemaVersion, " to ", kSchemaVersion,
        "; refusing to open (upgrade or use another data_dir)"));
  }
  if (version < kSchemaVersion) {
    rocksdb::WriteBatch batch;
    if (version < 4) RETURN_IF_ERROR(AddEpochZeroSegments(&batch));
    batch.Put(cfs_.meta, kSchemaKey, std::to_string(kSchemaVersion));
    rocksdb::WriteOptions wo;
    wo.sync = true;
    RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "upgrade schema version"));
  }
  return StartRowEpoch();
}

// ---- Row epochs ----

namespace {

constexpr Position kMaxPosition{std::numeric_limits<uint64_t>::max(),
                                std::numeric_limits<uint64_t>::max()};

}  // namespace

absl::Status Store::StartRowEpoch() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cfs_.rows));
  it->SeekForPrev(keys::RowEpochPrefix(keys::kMaxRowEpoch + 1));
  uint64_t highest = 0;
  if (it->Valid()) highest = keys::RowKeyEpoch(View(it->key()));
  RETURN_IF_ERROR(FromRocks(it->status(), "find the last row epoch"));
  const uint64_t memtable_epoch = (highest >> kCommitOrderBits) + 1;
  if (memtable_epoch > (keys::kMaxRowEpoch >> kCommitOrderBits)) {
    return absl::FailedPreconditionError("store: every row epoch is used up");
  }
  absl::MutexLock lock(&epoch_mu_);
  row_epoch_ = memtable_epoch;
  return absl::OkStatus();
}

uint64_t Store::CommitEpochLocked(absl::string_view id) {
  const uint64_t base = row_epoch_ << kCommitOrderBits;
  absl::MutexLock lock(&order_mu_);
  if (ordered_epoch_ != row_epoch_) {  // the first commit of this memtable epoch
    ordered_epoch_ = row_epoch_;
    last_order_ = 0;
    last_ordered_source_.clear();
    orders_.clear();
  }
  // Nobody wrote after this source's last commit: its rows still append.
  if (last_order_ != 0 && last_ordered_source_ == id) return base | last_order_;
  SourceOrders& mine = orders_[id];
  if (mine.taken >= kCommitOrdersPerSource || last_order_ == kMaxCommitOrder) {
    return base | (mine.taken > 0 ? mine.last : kMaxCommitOrder);
  }
  ++last_order_;
  last_ordered_source_ = std::string(id);
  ++mine.taken;
  mine.last = last_order_;
  return base | last_order_;
}

uint64_t Store::row_epoch() const {
  absl::ReaderMutexLock lock(&epoch_mu_);
  return row_epoch_;
}

absl::Status Store::AddEpochZeroSegments(rocksdb::WriteBatch* batch) const {
  std::unique_ptr<rocksdb::Iterator> sources(db_->NewIterator(rocksdb::ReadOptions(), cfs_.sources));
  std::unique_ptr<rocksdb::Iterator> rows(db_->NewIterator(rocksdb::ReadOptions(), cfs_.rows));
  for (sources->SeekToFirst(); sources->Valid(); sources->Next()) {
    const std::string prefix = keys::SourcePrefix(View(sources->key()));
    rows->Seek(prefix);
    if (rows->Valid() && absl::StartsWith(View(rows->key()), prefix)) {
      batch->Put(cfs_.row_segments, keys::Positional(View(sources->key()), Position{0, 0}),
                 keys::RowEpochPrefix(0));
    }
    RETURN_IF_ERROR(FromRocks(rows->status(), "schema 4: scan rows"));
  }
  return FromRocks(sources->status(), "schema 4: scan sources");
}

absl::StatusOr<std::optional<Store::RowSegment>> Store::FindRowSegment(
    rocksdb::Iterator* segments, absl::string_view id, Position pos) {
  const std::string prefix = keys::SourcePrefix(id);
  segments->SeekForPrev(keys::Positional(id, pos));
  return ReadRowSegment(segments, prefix);
}

absl::StatusOr<std::optional<Store::RowSegment>> Store::ReadRowSegment(
    rocksdb::Iterator* segments, absl::string_view prefix) {
  if (!segments->Valid() || !absl::StartsWith(View(segments->key()), prefix)) {
    RETURN_IF_ERROR(FromRocks(segments->status(), "find a row segment"));
    return std::optional<RowSegment>();
  }
  RowSegment segment;
  ASSIGN_OR_RETURN(segment.start, keys::DecodePosition(View(segments->key())));
  if (segments->value().size() != 8) return Corrupt("row segment", View(segments->key()));
  segment.epoch = keys::DecodeBigEndian64(segments->value().data());
  segments->Next();
  if (segments->Valid() && absl::StartsWith(View(segments->key()), prefix)) {
    ASSIGN_OR_RETURN(Position end, keys::DecodePosition(View(segments->key())));
    segment.end = end;
  }
  RETURN_IF_ERROR(FromRocks(segments->status(), "find a row segment"));
  return std::optional<RowSegment>(segment);
}

absl::StatusOr<std::optional<Store::RowSegment>> Store::LoadRowTailLocked(absl::string_view id) {
  {
    absl::MutexLock lock(&tails_mu_);
    auto it = row_tails_.find(id);
    if (it != row_tails_.end()) return it->second;
  }
  std::unique_ptr<rocksdb::Iterator> segments(
      db_->NewIterator(rocksdb::ReadOptions(), cfs_.row_segments));
  ASSIGN_OR_RETURN(std::optional<RowSegment> tail, FindRowSegment(segments.get(), id, kMaxPosition));
  absl::MutexLock lock(&tails_mu_);
  row_tails_[id] = tail;
  return tail;
}

void Store::ForgetRowTail(absl::string_view id) {
  absl::MutexLock lock(&tails_mu_);
  row_tails_.erase(id);
}

absl::StatusOr<bool> Store::HasRowsFrom(absl::string_view id, uint64_t epoch, Position pos,
                                        const std::optional<Position>& end) const {
  const std::string upper =
      end.has_value() ? keys::RowKey(epoch, id, *end) : keys::RowRangeEnd(epoch, id);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cfs_.rows));
  it->Seek(keys::RowKey(epoch, id, pos));
  const bool found = it->Valid();
  RETURN_IF_ERROR(FromRocks(it->status(), "look for rows"));
  return found;
}

absl::Status Store::ResolveRowsLocked(StepBatch* step, uint64_t epoch,
                                      std::optional<RowSegment>* tail) {
  const std::string& id = step->source_id();
  rocksdb::WriteBatch* batch = &step->batch_;
  std::unique_ptr<rocksdb::Iterator> segments;
  // Segments this step starts below the tail's start, which the database does not hold
  // yet (rare: a hold resolved below the source's first row).
  std::vector<RowSegment> started;
  // The segment holding `pos`, as this commit will leave it.
  auto holding = [&](Position pos) -> absl::StatusOr<std::optional<RowSegment>> {
    if (tail->has_value() && pos >= (*tail)->start) return *tail;
    if (segments == nullptr) {
      segments.reset(db_->NewIterator(rocksdb::ReadOptions(), cfs_.row_segments));
    }
    ASSIGN_OR_RETURN(std::optional<RowSegment> found, FindRowSegment(segments.get(), id, pos));
    for (const RowSegment& s : started) {
      if (s.start <= pos && (!found.has_value() || s.start > found->start)) found = s;
    }
    return found;
  };
  std::string& rep = const_cast<std::string&>(batch->Data());  // see StepBatch::PutRow
  const std::string epoch_bytes = keys::RowEpochPrefix(epoch);
  std::set<Position> put_positions;
  for (const StepBatch::RowPut& put : step->row_puts_) {
    ASSIGN_OR_RETURN(std::optional<RowSegment> segment, holding(put.pos));
    uint64_t into = epoch;
    if (segment.has_value() && segment->epoch != epoch) {
      // A new segment from here would hide the older epoch's rows at and above this
      // position: with any there, the row joins them.
      ASSIGN_OR_RETURN(bool rows_above, HasRowsFrom(id, segment->epoch, put.pos, segment->end));
      if (rows_above || !tail->has_value() || put.pos < (*tail)->start) into = segment->epoch;
    }
    if (!segment.has_value() || (into == epoch && segment->epoch != epoch)) {
      batch->Put(cfs_.row_segments, keys::Positional(id, put.pos), epoch_bytes);
      RowSegment s{put.pos, epoch, std::nullopt};
      if (!tail->has_value() || put.pos >= (*tail)->start) {
        *tail = s;
      } else {
        started.push_back(s);
      }
    }
    // The placeholder key's epoch, patched in place (one 8-byte copy: this runs per row).
    const std::string prefix =
        into == epoch || into == 0 ? epoch_bytes : keys::RowEpochPrefix(into);
    std::memcpy(&rep[put.epoch_offset], prefix.data(), prefix.size());
    if (into == 0) {
      // An epoch-0 row is keyed without an epoch, which the placeholder key cannot be
      // patched into (rare: a correction or a hold below rows written before schema 4).
      // The put is repeated with the epoch-0 key and the placeholder's deleted after it.
      const std::string copy = rep.substr(put.value_offset, put.value_size);
      batch->Put(cfs_.rows, keys::RowKey(0, id, put.pos), copy);
      batch->Delete(cfs_.rows, keys::RowKey(epoch, id, put.pos));
    }
    if (!step->row_deletes_.empty()) put_positions.insert(put.pos);
  }
  for (Position pos : step->row_deletes_) {
    if (put_positions.count(pos) > 0) continue;  // the put overwrites it
    ASSIGN_OR_RETURN(std::optional<RowSegment> segment, holding(pos));
    if (!segment.has_value()) continue;  // below every segment: no row there
    batch->Delete(cfs_.rows, keys::RowKey(segment->epoch, id, pos));
  }
  return absl::OkStatus();
}

void Store::AfterRowWrite(size_t bytes) {
  const uint64_t limit =
      static_cast<uint64_t>(kRowEpochFraction * static_cast<double>(options_.write_buffer_bytes));
  if (epoch_bytes_.fetch_add(bytes) + bytes < limit) return;
  absl::MutexLock lock(&epoch_mu_);
  if (epoch_bytes_.load() < limit) return;  // another commit switched
  // Switched now, with no commit of rows in flight: every row of this epoch is in the
  // memtable switched here, every row of the next in later ones.
  rocksdb::FlushOptions fo;
  fo.wait = false;
  fo.allow_write_stall = true;
  // A failed switch only costs the next flush's alignment (the epochs stay correct).
  // None after a failed write: the switch would flush (and sync) through the WAL
  // writer that failed (see Flush()).
  if (CheckWritable("switch the rows' memtable").ok()) {
    db_->Flush(fo, cfs_.rows).PermitUncheckedError();
  }
  if (row_epoch_ < (keys::kMaxRowEpoch >> kCommitOrderBits)) ++row_epoch_;
  epoch_bytes_.store(0);
}

absl::Status Store::DeleteRowsOf(absl::string_view id, rocksdb::WriteBatch* batch) const {
  const std::string prefix = keys::SourcePrefix(id);
  std::unique_ptr<rocksdb::Iterator> segments(
      db_->NewIterator(rocksdb::ReadOptions(), cfs_.row_segments));
  std::set<uint64_t> epochs;
  segments->Seek(prefix);
  while (true) {  // ReadRowSegment steps to the next segment
    ASSIGN_OR_RETURN(std::optional<RowSegment> segment, ReadRowSegment(segments.get(), prefix));
    if (!segment.has_value()) break;
    epochs.insert(segment->epoch);
  }
  if (epochs.empty()) return absl::OkStatus();
  for (uint64_t epoch : epochs) {
    if (epoch == 0) continue;  // epoch-0 rows have the source's prefix (DeleteKeysOf)
    batch->DeleteRange(cfs_.rows, keys::RowRangeBegin(epoch, id), keys::RowRangeEnd(epoch, id));
  }
  batch->DeleteRange(cfs_.row_segments, prefix, keys::PrefixSuccessor(prefix));
  return absl::OkStatus();
}

absl::Mutex* Store::SourceLock(absl::string_view id) {
  absl::MutexLock lock(&locks_mu_);
  auto& slot = locks_[id];
  if (slot == nullptr) slot = std::make_unique<absl::Mutex>();
  return slot.get();
}

Store::MemoryUsage Store::memory_usage() const {
  MemoryUsage usage;
  db_->GetAggregatedIntProperty(rocksdb::DB::Properties::kSizeAllMemTables,
                                &usage.memtable_bytes);
  db_->GetIntProperty(cfs_.rows, rocksdb::DB::Properties::kBlockCacheUsage,
                      &usage.block_cache_bytes);
  return usage;
}

absl::Status Store::FailureLocked() const {
  if (!write_failure_.ok()) return write_failure_;
  return background_errors_->first();
}

absl::Status Store::health() const {
  absl::MutexLock lock(&health_mu_);
  return FailureLocked();
}

absl::Status Store::CheckWritable(absl::string_view operation) const {
  absl::MutexLock lock(&health_mu_);
  const absl::Status failure = FailureLocked();
  if (failure.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("storage: refusing ", operation,
                                                    " after an earlier write failure: ",
                                                    failure.message()));
}

absl::Status Store::CheckFreeSpace(size_t bytes) const {
  struct statvfs fs;
  if (statvfs(options_.path.c_str(), &fs) != 0) return absl::OkStatus();  // cannot tell
  const uint64_t total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  const uint64_t reserve = std::min<uint64_t>(options_.min_free_disk_bytes, total / 4);
  // The WAL record, and later its memtable flush, need about twice the batch.
  if (free < reserve + 2 * static_cast<uint64_t>(bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "storage: the disk of ", options_.path, " is nearly full (", free,
        " bytes free, reserve ", reserve, "); refusing to write: free space, then restart"));
  }
  return absl::OkStatus();
}

absl::Status Store::Write(rocksdb::WriteBatch* batch, absl::string_view operation,
                          SyncTicket* deferred) {
  {
    absl::ReaderMutexLock wal(&wal_mu_);
    RETURN_IF_ERROR(CheckWritable(operation));
    absl::Status s = CheckFreeSpace(batch->GetDataSize());
    if (s.ok()) {
      rocksdb::WriteOptions wo = write_options_;
      if (deferred != nullptr) wo.sync = false;
      // ThreadSanitizer builds only (empty otherwise): RocksDB's write-group leader copies
      // the other writers' batches into its own and inserts them, handed over through
      // RocksDB's atomics, which TSan cannot see in the uninstrumented library; the
      // leader's copy, made by libstdc++ on RocksDB's behalf, was reported against the
      // follower's filling of its batch in every test with concurrent writers. This
      // thread's accesses inside RocksDB (and the file system it calls) are not checked;
      // the caller's are, before and after (DEVELOPERS.md, "Sanitizers").
      ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_BEGIN();
      const rocksdb::Status written = db_->Write(wo, batch);
      ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_END();
      s = FromRocks(written, operation);
    }
    if (!s.ok()) return Fail(s);
  }
  if (deferred != nullptr) *deferred = syncer_ != nullptr ? syncer_->Written() : SyncTicket{};
  return absl::OkStatus();
}

absl::Status Store::Fail(absl::Status s) {
  absl::MutexLock lock(&health_mu_);
  if (write_failure_.ok()) write_failure_ = s;
  return s;
}

absl::Status Store::SyncWal() {
  absl::MutexLock file_lock(&wal_file_mu_);
  RETURN_IF_ERROR(CheckWritable("WAL sync"));
  std::unique_ptr<rocksdb::LogFile> live;
  absl::Status s = FromRocks(db_->GetCurrentWalFile(&live), "WAL sync: find the live WAL");
  if (!s.ok()) return Fail(s);
  // A write that returned before this sync began appended to this WAL or an older one,
  // and the older ones were synced when the live WAL was last found to have changed.
  if (wal_file_ != nullptr && live->LogNumber() == wal_file_number_) {
    ++wal_sync_stats_.by_handle;
    s = FromRocks(wal_file_->Sync(rocksdb::IOOptions(), nullptr), "WAL sync");
    return s.ok() ? s : Fail(s);
  }
  // A new WAL (or the first sync): RocksDB syncs it, every older one and the directory.
  // No write is inside RocksDB meanwhile, and every earlier write's failure is recorded:
  // a WAL writer that failed an append must not be synced (Debian's assertion-enabled
  // RocksDB aborts the process in SyncWithoutFlush then; a release build returns the
  // earlier error).
  absl::WriterMutexLock wal(&wal_mu_);
  RETURN_IF_ERROR(CheckWritable("WAL sync"));
  // Again: a write may have switched the WAL before this lock stopped writes.
  s = FromRocks(db_->GetCurrentWalFile(&live), "WAL sync: find the live WAL");
  if (!s.ok()) return Fail(s);
  ++wal_sync_stats_.by_rocksdb;
  s = FromRocks(db_->SyncWAL(), "WAL sync");
  if (!s.ok()) return Fail(s);
  // The handle for the next syncs. Opening it changes nothing on disk (the file exists:
  // it is the live WAL and no write can switch it now); without one, the next sync
  // takes this path again.
  wal_file_.reset();
  std::unique_ptr<rocksdb::FSRandomRWFile> file;
  if (EnvOf(options_)->GetFileSystem()
          ->NewRandomRWFile(options_.path + live->PathName(), rocksdb::FileOptions(), &file,
                            nullptr)
          .ok()) {
    wal_file_ = std::move(file);
    wal_file_number_ = live->LogNumber();
  }
  return absl::OkStatus();
}

Store::WalSyncStats Store::wal_sync_stats() const {
  absl::MutexLock lock(&wal_file_mu_);
  return wal_sync_stats_;
}

bool Store::IsSynced(SyncTicket ticket) const {
  return syncer_ == nullptr || syncer_->IsSynced(ticket);
}

absl::Status Store::AwaitSynced(SyncTicket ticket) {
  if (syncer_ == nullptr || ticket.value == 0) return absl::OkStatus();
  return syncer_->Await(ticket);
}

absl::Status Store::Flush() {
  // After a failed write or sync, a flush would write (and sync) what the failure left
  // unknown, through a WAL writer that already failed (Debian's assertion-enabled
  // RocksDB aborts there): refused, as every other write is.
  RETURN_IF_ERROR(CheckWritable("flush"));
  rocksdb::FlushOptions fo;
  return FromRocks(db_->Flush(fo, handles_), "flush");
}

// ---- Sources ----

absl::Status Store::PutSource(const handoff::v1::Source& source) {
  rocksdb::WriteBatch batch;
  batch.Put(cfs_.sources, keys::Source(source.spec().id()), source.SerializeAsString());
  return Write(&batch, "put source");
}

absl::StatusOr<handoff::v1::Source> Store::GetSource(absl::string_view id) {
  std::string value;
  RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), cfs_.sources, keys::Source(id), &value),
                            absl::StrCat("get source ", id)));
  handoff::v1::Source source;
  if (!source.ParseFromString(value)) return Corrupt("source", id);
  return source;
}

absl::StatusOr<std::vector<handoff::v1::Source>> Store::ListSources(absl::string_view start_after,
                                                                  int limit) {
  std::vector<handoff::v1::Source> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cfs_.sources));
  if (start_after.empty()) {
    it->SeekToFirst();
  } else {
    it->Seek(keys::Source(start_after));
    if (it->Valid() && View(it->key()) == start_after) it->Next();
  }
  for (; it->Valid() && static_cast<int>(out.size()) < limit; it->Next()) {
    handoff::v1::Source source;
    if (!source.ParseFromArray(it->value().data(), it->value().size())) {
      return Corrupt("source", View(it->key()));
    }
    out.push_back(std::move(source));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list sources"));
  return out;
}

absl::Status Store::DeleteSource(absl::string_view id) {
  absl::MutexLock lock(SourceLock(id));
  rocksdb::WriteBatch batch;
  // Remember the fence: a source re-created under this id starts above every version
  // an attempt of the deleted one may still hold.
  ASSIGN_OR_RETURN(uint64_t floor, NextVersionLocked(id));
  batch.Put(cfs_.meta, VersionFloorKey(id), std::to_string(floor));
  // And the holds' floors: a hold of the re-created source never takes a version that
  // an operator read from a hold of the deleted one.
  RETURN_IF_ERROR(AddHoldFloorsLocked(id, &batch));
  RETURN_IF_ERROR(DeleteKeysOf(id,
                               {cfs_.checkpoints, cfs_.receipts, cfs_.quarantine, cfs_.holds,
                                cfs_.rows, cfs_.outbox},
                               &batch));
  RETURN_IF_ERROR(DeleteRowsOf(id, &batch));
  batch.Delete(cfs_.sources, keys::Source(id));
  ForgetRowTail(id);  // reloaded from the database by the next commit, whatever happens
  return Write(&batch, absl::StrCat("delete source ", id));
}

absl::StatusOr<uint64_t> Store::NextVersionLocked(absl::string_view id) {
  uint64_t next = 0;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cfs_.meta, VersionFloorKey(id), &value);
  if (s.ok()) {
    if (!absl::SimpleAtoi(value, &next)) return Corrupt("version floor", id);
  } else if (!s.IsNotFound()) {
    RETURN_IF_ERROR(FromRocks(s, absl::StrCat("read version floor of ", id)));
  }
  for (Stage stage : {Stage::kIngest, Stage::kDelivery}) {
    absl::StatusOr<CheckpointRecord> old = LoadCheckpointLocked(id, stage);
    if (old.ok()) {
      next = std::max(next, old->version() + 1);
    } else if (!absl::IsNotFound(old.status())) {
      return old.status();
    }
  }
  return next;
}

// ---- Checkpoints ----

absl::StatusOr<CheckpointRecord> Store::LoadCheckpoint(absl::string_view id, Stage stage,
                                                       const Snapshot* at) {
  std::string value;
  rocksdb::ReadOptions ro;
  if (at != nullptr) ro.snapshot = at->snapshot_;
  RETURN_IF_ERROR(FromRocks(db_->Get(ro, cfs_.checkpoints, keys::Checkpoint(id, stage), &value),
                            absl::StrCat("load checkpoint of ", id)));
  CheckpointRecord record;
  if (!record.ParseFromString(value)) return Corrupt("checkpoint", id);
  return record;
}

absl::StatusOr<CheckpointRecord> Store::LoadCheckpointLocked(absl::string_view id, Stage stage) {
  return LoadCheckpoint(id, stage);
}

absl::Status Store::ResetSource(absl::string_view id, const CheckpointRecord& ingest,
                                const std::optional<CheckpointRecord>& delivery) {
  absl::MutexLock lock(SourceLock(id));
  rocksdb::WriteBatch batch;
  // The holds go: their versions stay as floors for the holds the rebuilt source writes.
  RETURN_IF_ERROR(AddHoldFloorsLocked(id, &batch));
  RETURN_IF_ERROR(DeleteKeysOf(
      id, {cfs_.receipts, cfs_.quarantine, cfs_.holds, cfs_.rows, cfs_.outbox}, &batch));
  RETURN_IF_ERROR(DeleteRowsOf(id, &batch));
  ForgetRowTail(id);  // reloaded from the database by the next commit, whatever happens
  // Both stages continue above the highest version either stage (or a deleted source of
  // the same id) ever had.
  ASSIGN_OR_RETURN(uint64_t floor, NextVersionLocked(id));
  auto put = [&](Stage stage, CheckpointRecord record) -> absl::Status {
    record.set_version(std::max(record.version(), floor));
    record.set_updated_unix_ms(absl::ToUnixMillis(absl::Now()));
    batch.Put(cfs_.checkpoints, keys::Checkpoint(id, stage), record.SerializeAsString());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(put(Stage::kIngest, ingest));
  if (delivery.has_value()) {
    RETURN_IF_ERROR(put(Stage::kDelivery, *delivery));
  } else {
    batch.Delete(cfs_.checkpoints, keys::Checkpoint(id, Stage::kDelivery));
  }
  return Write(&batch, absl::StrCat("reset source ", id));
}

absl::StatusOr<CheckpointRecord> Store::CommitStep(Stage stage, StepBatch* step,
                                                   const Fence& fence,
                                                   const CheckpointUpdate& update,
                                                   SyncTicket* deferred) {
  const std::string& id = step->source_id();
  // A failed store answers FAILED_PRECONDITION before the fence is looked at: an
  // ABORTED would send the caller to reread and retry against a store that cannot write.
  RETURN_IF_ERROR(CheckWritable(absl::StrCat("commit step of ", id)));
  absl::MutexLock lock(SourceLock(id));
  ASSIGN_OR_RETURN(CheckpointRecord record, LoadCheckpointLocked(id, stage));
  if (fence.hold.has_value()) {
    std::string value;
    rocksdb::Status hs = db_->Get(rocksdb::ReadOptions(), cfs_.holds,
                                  keys::Staged(id, fence.hold->stage, fence.hold->position),
                                  &value);
    if (hs.IsNotFound()) {
      return absl::AbortedError(absl::StrCat("hold of ", id, " at ",
                                             fence.hold->position.DebugString(),
                                             " no longer exists; reread"));
    }
    RETURN_IF_ERROR(FromRocks(hs, "read hold"));
    handoff::v1::Hold hold;
    if (!hold.ParseFromString(value)) return Corrupt("hold", id);
    if (hold.version() != fence.hold->version) {
      return absl::AbortedError(absl::StrCat("hold of ", id, " at ",
                                             fence.hold->position.DebugString(), " is at version ",
                                             hold.version(), ", not ", fence.hold->version,
                                             "; nothing changed: reread it and decide again"));
    }
  }
  if (!fence.any_version && record.version() != fence.expected_version) {
    return absl::AbortedError(absl::StrCat(
        "checkpoint of ", id, " moved: attempt holds version ", fence.expected_version,
        ", stored version is ", record.version(), "; reread and retry"));
  }
  if (!fence.any_version && fence.expected_step_seq.has_value() &&
      record.step_seq() != *fence.expected_step_seq) {
    return absl::AbortedError(absl::StrCat(
        "checkpoint of ", id, " was written by another attempt of version ",
        record.version(), "; reread and retry"));
  }
  // A hold resolution (any_version) moves step_seq too: the worker's attempt may have read
  // the hold before it and be about to commit its own outcome for the event (a retry whose
  // sink call was in flight). Its step, fenced by the step_seq it loaded, is then ABORTED
  // and it rereads, instead of overwriting the operator's decision.
  record.set_step_seq(record.step_seq() + 1);
  if (fence.barrier.has_value()) {
    if (record.resume_cursor() != fence.barrier->expected_cursor) {
      return absl::AbortedError(absl::StrCat(
          "checkpoint of ", id, " has another resume cursor than the attempt's; reread"));
    }
    record.set_resume_cursor(fence.barrier->next_cursor);
    record.set_version(record.version() + 1);
  }
  if (update.clear_applied) {
    record.set_has_applied(false);
    record.set_applied_block(0);
    record.set_applied_log_index(0);
  }
  if (update.applied.has_value()) {
    record.set_has_applied(true);
    record.set_applied_block(update.applied->block);
    record.set_applied_log_index(update.applied->log_index);
  }
  if (update.finalized.has_value() && update.finalized->present() &&
      (!record.highest_finalized().present() ||
       update.finalized->number() > record.highest_finalized().number())) {
    *record.mutable_highest_finalized() = *update.finalized;
  }
  if (update.safe.has_value() && update.safe->present() &&
      (!record.highest_safe().present() ||
       update.safe->number() > record.highest_safe().number())) {
    *record.mutable_highest_safe() = *update.safe;
  }
  if (update.tip.has_value()) record.set_tip(*update.tip);
  if (update.covered.has_value()) {
    record.set_has_covered(update.covered->through.has_value());
    record.set_covered_through(update.covered->through.value_or(0));
    record.set_covered_open(update.covered->open);
  }
  const CounterRecord& d = update.counter_deltas;
  CounterRecord* c = record.mutable_counters();
  c->set_applied(c->applied() + d.applied());
  c->set_replayed(c->replayed() + d.replayed());
  c->set_ignored(c->ignored() + d.ignored());
  c->set_quarantined(c->quarantined() + d.quarantined());
  c->set_corrections(c->corrections() + d.corrections());
  c->set_pages_committed(c->pages_committed() + d.pages_committed());
  c->set_delivered(c->delivered() + d.delivered());
  c->set_max_correction_depth(std::max(c->max_correction_depth(), d.max_correction_depth()));
  record.set_updated_unix_ms(absl::ToUnixMillis(absl::Now()));

  std::optional<CheckpointRecord> fenced_delivery;
  if (stage == Stage::kIngest) {
    ASSIGN_OR_RETURN(fenced_delivery, FenceDeliveryLocked(id, *step));
  }
  ASSIGN_OR_RETURN(const std::vector<ExtraWrite> hold_writes, HoldVersionWritesLocked(*step));

  rocksdb::WriteBatch* batch = &step->batch_;
  std::string value;
  record.SerializeToString(&value);
  // The checkpoints join the caller's batch only for this write: on failure the step is
  // left as the caller built it, not with a stale checkpoint appended.
  batch->SetSavePoint();
  // A step that fences the delivery stage rewrites entries it may read at once (its reads
  // are not capped below them, as they are below new entries): written synced, so that
  // no sink is sent an event this step could still lose.
  SyncTicket* const ticket = fenced_delivery.has_value() ? nullptr : deferred;
  if (ticket == nullptr && deferred != nullptr) *deferred = SyncTicket{};
  auto write = [&]() -> absl::Status {
    batch->Put(cfs_.checkpoints, keys::Checkpoint(id, stage), value);
    if (fenced_delivery.has_value()) {
      batch->Put(cfs_.checkpoints, keys::Checkpoint(id, Stage::kDelivery),
                 fenced_delivery->SerializeAsString());
    }
    for (const ExtraWrite& w : hold_writes) batch->Put(w.cf, w.key, w.value);
    return Write(batch, absl::StrCat("commit step of ", id), ticket);
  };
  const bool has_rows = !step->row_puts_.empty() || !step->row_deletes_.empty();
  absl::Status s;
  std::optional<RowSegment> tail;
  if (has_rows) {
    absl::StatusOr<std::optional<RowSegment>> loaded = LoadRowTailLocked(id);
    s = loaded.status();
    if (s.ok()) {
      tail = *std::move(loaded);
      // The epoch stays current until this write is done (AfterRowWrite).
      absl::ReaderMutexLock epoch_lock(&epoch_mu_);
      s = ResolveRowsLocked(step, CommitEpochLocked(id), &tail);
      if (s.ok()) s = write();
    }
  } else {
    s = write();
  }
  if (!s.ok()) {
    batch->RollbackToSavePoint().PermitUncheckedError();
    return s;
  }
  batch->PopSavePoint().PermitUncheckedError();
  if (has_rows) {
    {
      absl::MutexLock lock(&tails_mu_);
      row_tails_[id] = tail;
    }
    AfterRowWrite(batch->GetDataSize());
  }
  return record;
}

absl::StatusOr<std::optional<uint64_t>> Store::HoldFloor(const std::string& floor_key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cfs_.meta, floor_key, &value);
  if (s.IsNotFound()) return std::optional<uint64_t>();
  RETURN_IF_ERROR(FromRocks(s, "read a hold floor"));
  uint64_t floor = 0;
  if (!absl::SimpleAtoi(value, &floor)) return Corrupt("hold floor", floor_key);
  return std::optional<uint64_t>(floor);
}

absl::StatusOr<std::vector<Store::ExtraWrite>> Store::HoldVersionWritesLocked(
    const StepBatch& step) const {
  std::vector<ExtraWrite> out;
  if (!step.changes_operator_records()) return out;  // no hold in it
  const std::string& id = step.source_id();
  HoldWrites holds(cfs_.holds->GetID());
  RETURN_IF_ERROR(FromRocks(step.batch_.Iterate(&holds), "read the holds of a step"));
  // Each key's state as the batch leaves it so far, starting from the stored one.
  struct KeyState {
    std::string key;
    std::string floor_key;
    std::optional<uint64_t> live;  // the version of the hold there
    // The hold floor, read only where needed: most keys a step touches are a correction's
    // removals where there is no hold.
    bool floor_read = false;
    std::optional<uint64_t> floor;
    bool floor_raised = false;
    std::optional<std::string> put;  // the key's last put, if its version had to be raised
  };
  std::vector<KeyState> states;  // in order of first write, so the output is deterministic
  absl::flat_hash_map<std::string, size_t> index;
  auto read_floor = [this](KeyState* k) -> absl::Status {
    if (k->floor_read) return absl::OkStatus();
    ASSIGN_OR_RETURN(k->floor, HoldFloor(k->floor_key));
    k->floor_read = true;
    return absl::OkStatus();
  };
  for (const HoldWrites::Write& w : holds.writes()) {
    auto [it, first] = index.try_emplace(w.key, states.size());
    if (first) {
      KeyState& fresh = states.emplace_back();
      fresh.key = w.key;
      ASSIGN_OR_RETURN(fresh.floor_key, HoldFloorKey(id, w.key));
      std::string value;
      rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cfs_.holds, w.key, &value);
      if (!s.IsNotFound()) {
        RETURN_IF_ERROR(FromRocks(s, "read a hold"));
        handoff::v1::Hold stored;
        if (!stored.ParseFromString(value)) return Corrupt("hold", id);
        fresh.live = stored.version();
      }
    }
    KeyState& k = states[it->second];
    if (!w.value.has_value()) {
      if (k.live.has_value()) {
        RETURN_IF_ERROR(read_floor(&k));
        if (!k.floor.has_value() || *k.live > *k.floor) {
          k.floor = k.live;
          k.floor_raised = true;
        }
      }
      k.live.reset();
      k.put.reset();
      continue;
    }
    handoff::v1::Hold hold;
    if (!hold.ParseFromString(*w.value)) return Corrupt("hold", id);
    // A changed hold goes above its stored version even if its writer's copy was stale; a
    // new one above every version an earlier hold at its position had.
    uint64_t version = hold.version();
    if (k.live.has_value()) {
      version = std::max(version, *k.live + 1);
    } else {
      RETURN_IF_ERROR(read_floor(&k));
      if (k.floor.has_value()) version = std::max(version, *k.floor + 1);
    }
    k.live = version;
    k.put.reset();
    if (version != hold.version()) {
      hold.set_version(version);
      k.put = hold.SerializeAsString();
    }
  }
  for (KeyState& k : states) {
    if (k.put.has_value()) out.push_back(ExtraWrite{cfs_.holds, k.key, *std::move(k.put)});
    if (k.floor_raised) {
      out.push_back(ExtraWrite{cfs_.meta, k.floor_key, std::to_string(*k.floor)});
    }
  }
  return out;
}

absl::Status Store::AddHoldFloorsLocked(absl::string_view id, rocksdb::WriteBatch* batch) const {
  const std::string prefix = keys::SourcePrefix(id);
  const std::string end = keys::PrefixSuccessor(prefix);
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end);
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cfs_.holds));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    handoff::v1::Hold hold;
    if (!hold.ParseFromArray(it->value().data(), it->value().size())) {
      return Corrupt("hold", id);
    }
    ASSIGN_OR_RETURN(const std::string floor_key, HoldFloorKey(id, View(it->key())));
    ASSIGN_OR_RETURN(const std::optional<uint64_t> floor, HoldFloor(floor_key));
    if (!floor.has_value() || hold.version() > *floor) {
      batch->Put(cfs_.meta, floor_key, std::to_string(hold.version()));
    }
  }
  return FromRocks(it->status(), "scan holds for their floors");
}

absl::StatusOr<std::optional<CheckpointRecord>> Store::FenceDeliveryLocked(
    absl::string_view id, const StepBatch& step) {
  if (!step.lowest_outbox_write().has_value() && !step.replaces_history()) return std::nullopt;
  absl::StatusOr<CheckpointRecord> delivery = LoadCheckpointLocked(id, Stage::kDelivery);
  if (absl::IsNotFound(delivery.status())) return std::nullopt;
  RETURN_IF_ERROR(delivery.status());
  const std::optional<Position>& lowest = step.lowest_outbox_write();
  const bool passed =
      lowest.has_value() && delivery->has_applied() &&
      Position{delivery->applied_block(), delivery->applied_log_index()} >= *lowest;
  // A plain page's puts above the applied position are new events, which the delivery
  // reads when it gets there; anything else may rewrite what a delivery in flight has
  // read (StepBatch::MarkReplacesHistory).
  if (!passed && !step.deletes_outbox() && !step.replaces_history()) return std::nullopt;
  if (passed) {
    const Position low = *lowest;
    if (low == Position{0, 0}) {
      delivery->set_has_applied(false);
      delivery->set_applied_block(0);
      delivery->set_applied_log_index(0);
    } else {
      const Position before = low.log_index > 0
                                  ? Position{low.block, low.log_index - 1}
                                  : Position{low.block - 1, std::numeric_limits<uint64_t>::max()};
      delivery->set_applied_block(before.block);
      delivery->set_applied_log_index(before.log_index);
    }
  }
  delivery->set_step_seq(delivery->step_seq() + 1);
  delivery->set_outbox_epoch(delivery->outbox_epoch() + 1);
  delivery->set_updated_unix_ms(absl::ToUnixMillis(absl::Now()));
  return *std::move(delivery);
}

absl::StatusOr<CheckpointRecord> Store::CompareAndSwap(absl::string_view id, Stage stage,
                                                       absl::string_view expected_cursor,
                                                       uint64_t expected_version,
                                                       absl::string_view next_cursor) {
  StepBatch step(&cfs_, id);
  Fence fence;
  fence.expected_version = expected_version;
  fence.barrier = Fence::Barrier{std::string(expected_cursor), std::string(next_cursor)};
  return CommitStep(stage, &step, fence, CheckpointUpdate{});
}

// ---- Reads ----

Store::Snapshot::Snapshot(rocksdb::DB* db) : db_(db), snapshot_(db->GetSnapshot()) {}

Store::Snapshot::~Snapshot() { db_->ReleaseSnapshot(snapshot_); }

std::unique_ptr<Store::Snapshot> Store::NewSnapshot() const {
  return std::unique_ptr<Snapshot>(new Snapshot(db_.get()));
}

absl::StatusOr<std::unique_ptr<Store::Snapshot>> Store::NewSyncedSnapshot() {
  std::unique_ptr<Snapshot> snapshot = NewSnapshot();
  // A write the snapshot sees wrote its WAL record before its memtable insert, so
  // before the snapshot: a sync requested now begins after it and covers it.
  if (syncer_ != nullptr) RETURN_IF_ERROR(syncer_->Await(syncer_->Written()));
  return snapshot;
}

absl::Status Store::DeleteKeysOf(absl::string_view id,
                                 std::initializer_list<rocksdb::ColumnFamilyHandle*> families,
                                 rocksdb::WriteBatch* batch) const {
  const std::string prefix = keys::SourcePrefix(id);
  const std::string end = keys::PrefixSuccessor(prefix);
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end);
  ro.iterate_upper_bound = &upper;
  for (rocksdb::ColumnFamilyHandle* cf : families) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf));
    it->Seek(prefix);
    if (it->Valid()) batch->DeleteRange(cf, prefix, end);
    RETURN_IF_ERROR(FromRocks(it->status(), "scan before a range deletion"));
  }
  return absl::OkStatus();
}

namespace {

// Visits the keys of [begin, end_inclusive] with their positions, from `it` (whose upper
// bound may lie beyond end_inclusive); DATA_LOSS on a key without a position.
absl::Status VisitPositions(rocksdb::Iterator* it, const std::string& begin,
                            const std::string& end_inclusive,
                            const std::function<bool(Position, absl::string_view)>& fn) {
  for (it->Seek(begin); it->Valid(); it->Next()) {
    const absl::string_view key = View(it->key());
    if (key > end_inclusive) break;
    absl::StatusOr<Position> pos = keys::DecodePosition(key);
    if (!pos.ok()) return pos.status();
    if (!fn(*pos, View(it->value()))) break;
  }
  return FromRocks(it->status(), "scan");
}

}  // namespace

absl::Status Store::ScanPositions(
    rocksdb::ColumnFamilyHandle* cf, const std::string& begin, const std::string& end_inclusive,
    const std::function<bool(Position, absl::string_view)>& fn, const Snapshot* at) const {
  rocksdb::ReadOptions ro;
  if (at != nullptr) ro.snapshot = at->snapshot_;
  const std::string upper = KeyAfter(end_inclusive);
  rocksdb::Slice upper_slice(upper);
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf));
  return VisitPositions(it.get(), begin, end_inclusive, fn);
}

Store::SourceView::SourceView(const Store* store, absl::string_view id)
    : store_(store),
      id_(id),
      upper_(keys::PrefixSuccessor(keys::SourcePrefix(id))),
      upper_slice_(upper_),
      // Every epoch key sorts below the source's prefix, so upper_ bounds rows too.
      families_{store->cfs_.rows, store->cfs_.receipts, store->cfs_.quarantine,
                store->cfs_.holds, store->cfs_.row_segments} {}

Store::SourceView::~SourceView() = default;

rocksdb::Iterator* Store::SourceView::IteratorFor(rocksdb::ColumnFamilyHandle* cf) const {
  for (size_t i = 0; i < families_.size(); ++i) {
    if (families_[i] == cf) return iterators_[i].get();
  }
  return nullptr;
}

absl::Status Store::SourceView::ScanRows(Position from, Position to,
                                         const RowVisitor& fn) const {
  return VisitRows(IteratorFor(store_->cfs_.row_segments), IteratorFor(store_->cfs_.rows), id_,
                   from, to, fn);
}

absl::Status Store::SourceView::ScanStaged(StagedFamily family, Stage stage, Position from,
                                           Position to, const StagedVisitor& fn) const {
  return VisitPositions(IteratorFor(store_->Family(family)), keys::Staged(id_, stage, from),
                        keys::Staged(id_, stage, to), fn);
}

absl::StatusOr<std::unique_ptr<Store::SourceView>> Store::NewSourceView(
    absl::string_view id) const {
  std::unique_ptr<SourceView> view(new SourceView(this, id));
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &view->upper_slice_;
  std::vector<rocksdb::Iterator*> raw;
  RETURN_IF_ERROR(FromRocks(db_->NewIterators(ro, view->families_, &raw), "open a source view"));
  for (rocksdb::Iterator* it : raw) view->iterators_.emplace_back(it);
  return view;
}

uint64_t Store::live_snapshots() const {
  uint64_t n = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kNumSnapshots, &n);
  return n;
}

absl::Status Store::VisitRows(rocksdb::Iterator* segments, rocksdb::Iterator* rows,
                              absl::string_view id, Position from, Position to,
                              const RowVisitor& fn) {
  if (to < from) return absl::OkStatus();
  const std::string prefix = keys::SourcePrefix(id);
  ASSIGN_OR_RETURN(std::optional<RowSegment> segment, FindRowSegment(segments, id, from));
  if (!segment.has_value()) {  // `from` lies below the first segment: start at it
    segments->Seek(keys::Positional(id, from));
    ASSIGN_OR_RETURN(segment, ReadRowSegment(segments, prefix));
  }
  std::string last, end;
  while (segment.has_value() && segment->start <= to) {
    const uint64_t epoch = segment->epoch;
    keys::AssignRowKey(epoch, id, to, &last);
    end = segment->end.has_value() ? keys::RowKey(epoch, id, *segment->end)
                                   : keys::RowRangeEnd(epoch, id);
    for (rows->Seek(keys::RowKey(epoch, id, std::max(from, segment->start))); rows->Valid();
         rows->Next()) {
      const absl::string_view key = View(rows->key());
      if (key > last || key >= end) break;
      absl::StatusOr<Position> pos = keys::DecodePosition(key);
      if (!pos.ok()) return pos.status();
      if (!fn(*pos, View(rows->value()))) return absl::OkStatus();
    }
    RETURN_IF_ERROR(FromRocks(rows->status(), "scan rows"));
    if (!segment->end.has_value()) break;
    // ReadRowSegment left `segments` at the next segment.
    ASSIGN_OR_RETURN(segment, ReadRowSegment(segments, prefix));
  }
  return absl::OkStatus();
}

absl::Status Store::ScanRows(absl::string_view id, Position from, Position to,
                             const RowVisitor& fn, const Snapshot* at) const {
  rocksdb::ReadOptions ro;
  if (at != nullptr) ro.snapshot = at->snapshot_;
  std::vector<rocksdb::Iterator*> raw;
  RETURN_IF_ERROR(FromRocks(db_->NewIterators(ro, {cfs_.row_segments, cfs_.rows}, &raw),
                            "scan rows"));
  const std::unique_ptr<rocksdb::Iterator> segments(raw[0]);
  const std::unique_ptr<rocksdb::Iterator> rows(raw[1]);
  return VisitRows(segments.get(), rows.get(), id, from, to, fn);
}

absl::Status Store::ScanOutbox(absl::string_view id, Position from, Position to,
                               const RowVisitor& fn) const {
  const std::string begin = keys::Positional(id, from);
  const std::string upper = KeyAfter(keys::Positional(id, to));
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::vector<rocksdb::Iterator*> raw;
  RETURN_IF_ERROR(FromRocks(
      db_->NewIterators(ro, {cfs_.outbox, cfs_.rows, cfs_.row_segments}, &raw), "scan outbox"));
  const std::unique_ptr<rocksdb::Iterator> entries(raw[0]);
  const std::unique_ptr<rocksdb::Iterator> rows(raw[1]);
  const std::unique_ptr<rocksdb::Iterator> segments(raw[2]);
  // The segment of the last row read (every row key sorts below `upper`); a segment
  // whose end lies above `to` reads as endless, which changes nothing up to `to`.
  std::optional<RowSegment> segment;
  std::string row_key;
  for (entries->Seek(begin); entries->Valid(); entries->Next()) {
    const rocksdb::Slice key = entries->key();
    absl::StatusOr<Position> pos = keys::DecodePosition(View(key));
    if (!pos.ok()) return pos.status();
    if (!entries->value().empty()) {
      if (!fn(*pos, View(entries->value()))) break;
      continue;
    }
    if (!segment.has_value() || *pos < segment->start ||
        (segment->end.has_value() && *pos >= *segment->end)) {
      ASSIGN_OR_RETURN(segment, FindRowSegment(segments.get(), id, *pos));
      if (!segment.has_value()) {
        return absl::DataLossError(absl::StrCat("storage: the outbox entry of ", id, " at ",
                                                pos->DebugString(), " has no row segment"));
      }
      keys::AssignRowKey(segment->epoch, id, *pos, &row_key);
      rows->Seek(row_key);
    } else {
      keys::AssignRowKey(segment->epoch, id, *pos, &row_key);
      // Pending entries are mostly consecutive rows: step forward, seek only on a gap.
      if (rows->Valid() && rows->key().compare(row_key) < 0) {
        rows->Next();
        if (rows->Valid() && rows->key().compare(row_key) < 0) rows->Seek(row_key);
      }
    }
    if (!rows->Valid() || rows->key() != row_key) {
      RETURN_IF_ERROR(FromRocks(rows->status(), "scan outbox rows"));
      return absl::DataLossError(absl::StrCat("storage: the outbox entry of ", id, " at ",
                                              pos->DebugString(), " has no row"));
    }
    if (!fn(*pos, View(rows->value()))) break;
  }
  RETURN_IF_ERROR(FromRocks(rows->status(), "scan outbox rows"));
  return FromRocks(entries->status(), "scan outbox");
}

absl::StatusOr<std::optional<std::string>> Store::GetRow(absl::string_view id,
                                                         Position pos) const {
  // A position's segment never changes while it holds a row, so the segment read here
  // and the row read after it agree.
  std::unique_ptr<rocksdb::Iterator> segments(
      db_->NewIterator(rocksdb::ReadOptions(), cfs_.row_segments));
  ASSIGN_OR_RETURN(std::optional<RowSegment> segment, FindRowSegment(segments.get(), id, pos));
  if (!segment.has_value()) return std::optional<std::string>();
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cfs_.rows,
                               keys::RowKey(segment->epoch, id, pos), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  RETURN_IF_ERROR(FromRocks(s, "get row"));
  return std::optional<std::string>(std::move(value));
}

rocksdb::ColumnFamilyHandle* Store::Family(StagedFamily family) const {
  switch (family) {
    case StagedFamily::kReceipts:
      return cfs_.receipts;
    case StagedFamily::kQuarantine:
      return cfs_.quarantine;
    case StagedFamily::kHolds:
      return cfs_.holds;
  }
  return nullptr;
}

absl::Status Store::ScanStaged(StagedFamily family, absl::string_view id, Stage stage,
                               Position from, Position to, const StagedVisitor& fn,
                               const Snapshot* at) const {
  return ScanPositions(Family(family), keys::Staged(id, stage, from),
                       keys::Staged(id, stage, to), fn, at);
}

absl::Status Store::ScanAll(StagedFamily family, absl::string_view start_after_key,
                            const KeyedVisitor& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), Family(family)));
  if (start_after_key.empty()) {
    it->SeekToFirst();
  } else {
    it->Seek(rocksdb::Slice(start_after_key.data(), start_after_key.size()));
    if (it->Valid() && View(it->key()) == start_after_key) it->Next();
  }
  for (; it->Valid(); it->Next()) {
    if (!fn(View(it->key()), View(it->value()))) break;
  }
  return FromRocks(it->status(), "scan all");
}

absl::StatusOr<std::optional<std::string>> Store::GetStaged(StagedFamily family,
                                                            absl::string_view id, Stage stage,
                                                            Position pos) const {
  std::string value;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), Family(family), keys::Staged(id, stage, pos), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  RETURN_IF_ERROR(FromRocks(s, "get staged record"));
  return std::optional<std::string>(std::move(value));
}

}  // namespace handoff::store
