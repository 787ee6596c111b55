// Store: Handoff's RocksDB database (one per process).
//
// Layout: the column families of column_families.h with keys from keys.h. The store
// offers exactly the durable operations the page procedure needs:
//
//  * CommitStep: one atomic, synced WriteBatch holding a step's effects, receipts,
//    holds and the stage's updated checkpoint.
//  * Fencing: every CommitStep names the checkpoint version its attempt loaded; a page
//    barrier also names the request cursor and moves (cursor, version) to
//    (next cursor, version + 1). RocksDB has no compare-and-swap of its own, so the
//    store serialises read-check-write per source with a mutex and writes the step and
//    the new checkpoint in one WriteBatch (RocksDB's LOCK file keeps the database to
//    one process, so an in-process lock is enough). cas_bench, p50 over 3 runs on a
//    2-vCPU ext4 VM: a 1000-row step commits in 4.8-8.7 ms synced / 2.2-2.5 ms unsynced,
//    against 7.9-12.4 / 4.8-12.2 ms with a pessimistic TransactionDB (GetForUpdate) and
//    9.4-10.7 / 8.5-13.1 ms with an OptimisticTransactionDB, which index (and lock)
//    every row; the barrier alone is fsync-bound and equal within noise (synced p50
//    0.24-4 ms, unsynced 6.7-12.6 us for all three). Details in README.md. If the stored
//    pair differs, the commit is ABORTED and nothing of it is written: a stale attempt
//    can never overwrite newer progress.
//
// Row epochs. Rows are keyed by the epoch they were written in, then by source and
// position (keys::RowKey), so that the rows family is written in key order whatever the
// number of sources: the store switches the rows memtable itself every
// kRowEpochFraction of its write buffer and starts a new epoch at that moment, every
// commit's rows taking the epoch current when it writes. Each flushed file then covers
// one epoch range above everything already on disk, and RocksDB moves it down the levels
// without merging it (with keys led by the source, every flush of many sources' rows
// overlapped every older file and was merged again: bench/HISTORY.md items 68 and 85).
// Within one memtable, the commits of several sources would still insert between each
// other's keys, and an insert in the middle of RocksDB's skip list costs about twice the
// key comparisons of an append (bench/HISTORY.md item 94). So a row key's epoch is the
// memtable epoch in its high bits and, in its low kCommitOrderBits, the order of the
// commit within it (CommitEpochLocked): each commit's rows then sort after every row
// written before them. A source whose commits follow each other keeps its number (a
// lone source has one segment per memtable epoch); a source interleaved with others
// takes a new one per commit, at most kCommitOrdersPerSource per memtable epoch, then
// keeps its last (its later rows insert between others' again). So a source has at most
// kCommitOrdersPerSource segments per memtable epoch it wrote in.
// Where a source's rows are: row_segments maps a position to the epoch that holds the
// rows at and above it (up to the next segment). Rules that keep it exact:
//  * A commit that puts a row at a position whose segment is of an older epoch starts a
//    new segment there, in the same WriteBatch, only if no row exists in that segment
//    at or above the position (so no row is ever hidden); otherwise the row goes to the
//    older epoch (a correction or a hold's resolution below rows already written), where
//    a put overwrites and a delete finds it.
//  * A deletion goes to the epoch of the position's segment.
//  * Segments are removed only with all of the source's rows (DeleteSource, ResetSource).
// Rows written before schema 4 are epoch 0: one segment from position 0.
//
// Invariants kept here:
//  * A step is all on disk or none of it (one WriteBatch); with sync, it survives a
//    crash once CommitStep returns OK, or, for a deferred commit, once AwaitSynced of
//    its ticket returns OK (WalSyncer). A deferred step is visible to this process's
//    reads before then: its caller must not act on it outside the process (publish it,
//    deliver from it) until it is synced. The WAL is one ordered log, so a step that
//    survives a crash brings every step written before it.
//  * The highest finalized and safe marks never decrease.
//  * The delivery stage never removes an outbox entry that an ingest correction wrote
//    after the delivery read it: an ingest step that deletes outbox entries, or writes
//    one at or below the delivery's applied position, fences the delivery stage in the
//    same WriteBatch and rewinds its applied position below that entry.
//  * A hold's version never repeats at its (source, stage, position), so that an
//    operator's decision, which quotes the version it read (Fence::HoldPrecondition),
//    applies to that hold only. A hold changed in place is stored above its stored version;
//    a hold put where none is live, above every version an earlier hold there had (the
//    hold floors in meta, left by every removal of a hold, including rebuilds and
//    deletions of the source). Writers keep numbering as before (a new hold at 1, a
//    change at + 1): the commit raises a version only where it would repeat.
//  * Every commit bumps step_seq, a hold resolution's too (Fence::any_version), so an
//    attempt in flight that read the hold before the resolution is ABORTED, and rereads.
//  * Every RocksDB error is returned as an absl::Status (rocks_status.h); after a
//    failed write the store refuses further writes (FAILED_PRECONDITION) until reopened,
//    so nothing advances on top of a write whose fate is unknown.
//
// Thread-safe.
#ifndef HANDOFF_STORE_STORE_H_
#define HANDOFF_STORE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "handoff/v1/source.pb.h"
#include "rocksdb/db.h"
#include "rocksdb/file_system.h"
#include "store/column_families.h"
#include "store/keys.h"
#include "store/position.h"
#include "store/records.pb.h"
#include "store/step_batch.h"
#include "store/wal_syncer.h"

namespace handoff::store {

// The schema this build reads and writes; kept in meta/"schema_version".
//  1: rows and outbox entries are serialized handoff.v1.EventRow.
//  2: they may also be in the compact StoredRow format (store/row_codec.h).
//  3: an outbox entry may be empty, standing for the row at its position in rows
//     (StepBatch::PutOutbox).
//  4: rows are keyed by their write epoch first, found through row_segments ("Row
//     epochs" below); older rows stay where they are, as epoch 0.
// An older database is upgraded in place when opened (its rows and entries still read;
// from 3 to 4 each source with rows gets an epoch-0 segment); a build that reads only
// older versions then refuses it.
inline constexpr int kSchemaVersion = 4;
inline constexpr int kOldestReadableSchemaVersion = 1;

struct StoreOptions {
  // Database directory; created if missing.
  std::string path;
  // fsync the WAL on every commit. Only tests and benchmarks of the limit turn it off.
  bool sync = true;
  // Pacing of the background syncs of deferred commits that nobody waits for yet
  // (WalSyncer): at most one begins per interval, and the commits written meanwhile share
  // it. A caller that awaits a commit's sync ends the wait at once. Zero: each sync
  // begins as soon as there is a commit to cover. 5 ms lets a source that commits a
  // page every 2.5 ms share one fsync between two pages, and caps the background syncs
  // at 200/s whatever the number of sources (bench/HISTORY.md 109).
  absl::Duration wal_sync_interval = absl::Milliseconds(5);
  // Tests inject faults through an Env wrapping a FileSystem (fault_injection_fs.h).
  rocksdb::Env* env = nullptr;
  // Tests: called by the background syncer before each sync of deferred commits (it may
  // block, holding those commits unsynced). Empty in production.
  std::function<void()> before_background_sync;
  // Memtable size of the families written once per event (rows, outbox, receipts);
  // bigger means fewer flushes while ingesting. The other families take a few records
  // per page and get kSmallWriteBufferBytes (or this, if smaller).
  size_t write_buffer_bytes = 64 << 20;
  // Memtables a family may hold: one filling, the rest immutable and waiting for their
  // flush. A family that has this many stops taking writes until a flush completes
  // (RocksDB's write stall), so a disk that falls behind slows ingest instead of growing
  // memory. Two keeps one flush in flight while the next memtable fills.
  int max_write_buffers = 2;
  // Block cache shared by all column families (index and filter blocks included).
  size_t block_cache_bytes = 64 << 20;
  // Free space kept in reserve on the data filesystem: a write that would leave less
  // (min(this, a quarter of the filesystem)) is refused as a storage failure before
  // RocksDB meets ENOSPC, which Debian's assertion-enabled librocksdb cannot survive.
  uint64_t min_free_disk_bytes = 256ull << 20;
};

inline constexpr size_t kSmallWriteBufferBytes = 4 << 20;

// The store switches the rows memtable (and starts a new row epoch) once the commits of
// the current epoch wrote this fraction of write_buffer_bytes: before RocksDB would switch
// it on its own (the memtable holds more than the batches' bytes), so that an epoch is
// never split between two memtables.
inline constexpr double kRowEpochFraction = 0.625;
// A row key's epoch: the memtable epoch << kCommitOrderBits | the commit's order in it
// ("Row epochs"). Orders start at 1; past kMaxCommitOrder a memtable epoch's later
// commits share the last order.
inline constexpr int kCommitOrderBits = 24;
inline constexpr uint64_t kMaxCommitOrder = (uint64_t{1} << kCommitOrderBits) - 1;
// The commit orders one source takes in one memtable epoch (so its segments there).
inline constexpr int kCommitOrdersPerSource = 16;

// The most memory the database holds for `options`: every family's memtables at their
// stop limit (each up to its write buffer, an arena block of an eighth more and the
// write group that filled it, 1 MiB or one larger step) plus the block cache. The
// storage term of the process's memory bound (bench/REPORT.md, scenario 5).
size_t StoreMemoryCeiling(const StoreOptions& options);

// The fence of a write: what the attempt believes the checkpoint is.
struct Fence {
  uint64_t expected_version = 0;
  // When set, the stored step_seq must equal it (finer fencing within one version).
  std::optional<uint64_t> expected_step_seq;
  // Set for a page barrier: the stored resume cursor must equal `expected_cursor`; the
  // commit sets it to `next_cursor` and the version to expected_version + 1.
  struct Barrier {
    std::string expected_cursor;
    std::string next_cursor;
  };
  std::optional<Barrier> barrier;
  // Skip the version and step_seq checks (hold resolutions, which are fenced by the hold
  // instead). The commit still bumps step_seq: every attempt in flight is fenced out.
  bool any_version = false;
  // Set for a hold resolution: the hold at (stage, position) must exist with this
  // version, else ABORTED and nothing is written.
  struct HoldPrecondition {
    Stage stage = Stage::kIngest;
    Position position;
    uint64_t version = 0;
  };
  std::optional<HoldPrecondition> hold;
};

// Checkpoint fields a step changes (besides a barrier's cursor and version).
struct CheckpointUpdate {
  // The new applied position (may go down only through a correction).
  std::optional<Position> applied;
  // A correction rewound below every applied event.
  bool clear_applied = false;
  std::optional<Mark> finalized;  // kept only if higher than the stored mark
  std::optional<Mark> safe;       // kept only if higher than the stored mark
  std::optional<uint64_t> tip;
  // The committed range after a barrier (unset: as it was; CheckpointRecord's
  // covered_through and covered_open say what each means).
  struct Covered {
    std::optional<uint64_t> through;
    bool open = false;
  };
  std::optional<Covered> covered;
  CounterRecord counter_deltas;   // added to the stored counters
};

// Which staged column family to scan.
enum class StagedFamily { kReceipts, kQuarantine, kHolds };

class BackgroundErrorListener;

class Store {
 public:
  class Snapshot;

  // Opens (creating if needed) the database at options.path. Fails with
  // FAILED_PRECONDITION and a clear message when the directory holds a database of an
  // unknown schema or is not a Handoff database.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);

  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // ---- Sources ----
  absl::Status PutSource(const handoff::v1::Source& source);
  absl::StatusOr<handoff::v1::Source> GetSource(absl::string_view id);
  // Sources with id > start_after, in id order, at most `limit`.
  absl::StatusOr<std::vector<handoff::v1::Source>> ListSources(absl::string_view start_after,
                                                             int limit);
  // Removes the source and every key it owns in every column family, in one batch. It
  // leaves meta keys: the version floor, so that a source later re-created under the same
  // id (ResetSource) starts above every version the deleted one had and an attempt still
  // holding the old checkpoint is fenced out; and the hold floors (one per position that
  // had a hold), so that its holds never take a version of the deleted source's.
  absl::Status DeleteSource(absl::string_view id);

  // ---- Checkpoints ----
  // NOT_FOUND when the stage has no checkpoint yet. As of `at` when given.
  absl::StatusOr<CheckpointRecord> LoadCheckpoint(absl::string_view id, Stage stage,
                                                  const Snapshot* at = nullptr);

  // Rebuild: erases the source's rows, receipts, holds, quarantine and outbox, and
  // writes fresh checkpoints: each gets max(its version, 1 + the highest stored version
  // of either stage or of a deleted source of this id), so any attempt still in flight
  // is fenced out. `delivery` may be absent (its checkpoint is then removed). The erased
  // holds leave their floors (the hold-version invariant above).
  absl::Status ResetSource(absl::string_view id, const CheckpointRecord& ingest,
                           const std::optional<CheckpointRecord>& delivery);

  // ---- Fenced writes ----
  // `reserve_bytes`: the expected size of the step's writes (a step of 1000 rows is
  // ~650 KB; reserving it avoids regrowing and copying the batch while it is built).
  std::unique_ptr<StepBatch> NewStep(absl::string_view id, size_t reserve_bytes = 0) const {
    return std::make_unique<StepBatch>(&cfs_, id, reserve_bytes);
  }

  // Writes `batch` and the checkpoint update of `stage` atomically, synced, if `fence`
  // holds; returns the new checkpoint. ABORTED (nothing written) when the fence fails;
  // NOT_FOUND without a checkpoint; UNAVAILABLE on a storage failure, after which the
  // outcome is unknown (a WAL record whose fsync failed may still be found after a
  // reopen: all of the step, never part of it), so reread the checkpoint after
  // reopening; FAILED_PRECONDITION once an earlier write failed (before the fence is
  // checked). On failure `batch` is left as the caller built it. An ingest step that
  // deletes outbox entries, writes one the delivery stage has passed, or replaces history
  // (StepBatch::MarkReplacesHistory) also commits the fenced (and, where it had passed
  // them, rewound) delivery checkpoint (FenceDeliveryLocked), and is then written synced
  // even when `deferred` asks otherwise (its ticket is 0). A hold the step puts may be
  // stored at a higher version than the caller gave it (the hold-version invariant above),
  // which a reader of the hold sees.
  //
  // With `deferred`, the write does not wait for its fsync: *deferred names it for
  // AwaitSynced, and the store's WalSyncer syncs it in the background (one sync for
  // every write before it). Without sync (StoreOptions::sync false) the ticket is 0.
  absl::StatusOr<CheckpointRecord> CommitStep(Stage stage, StepBatch* batch,
                                              const Fence& fence,
                                              const CheckpointUpdate& update,
                                              SyncTicket* deferred = nullptr);
  // Blocks until the deferred write of `ticket` is durable. UNAVAILABLE if its sync
  // failed: the store then refuses writes (as after any failed write) and the step's
  // fate is unknown until the database is reopened.
  absl::Status AwaitSynced(SyncTicket ticket);
  // Whether that write is durable already (does not wait).
  bool IsSynced(SyncTicket ticket) const;

  // The page barrier alone: (expected_cursor, expected_version) ->
  // (next_cursor, expected_version + 1), or ABORTED and nothing changes.
  absl::StatusOr<CheckpointRecord> CompareAndSwap(absl::string_view id, Stage stage,
                                                  absl::string_view expected_cursor,
                                                  uint64_t expected_version,
                                                  absl::string_view next_cursor);

  // ---- Reads (consistent per call; across calls only through one Snapshot) ----
  // A point-in-time view for reads that must agree with each other. A receipt ledger
  // scans rows, then holds: without one view, a hold resolved between the two scans
  // (terminal row written, hold deleted) looks like neither, i.e. like a RETRY, and the
  // event would be delivered again after the operator's decision.
  class Snapshot {
   public:
    ~Snapshot();
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;

   private:
    friend class Store;
    explicit Snapshot(rocksdb::DB* db);
    rocksdb::DB* const db_;
    const rocksdb::Snapshot* const snapshot_;
  };
  // Must not outlive the store. For the admin API's reads (QueryEvents), not for every
  // page: see SourceView.
  std::unique_ptr<Snapshot> NewSnapshot() const;
  // A snapshot holding only durable data: taken first, then a WAL sync that begins
  // after it covers every deferred commit it sees. Readers that answer outside the
  // process (QueryEvents) read through one. UNAVAILABLE if that sync failed.
  absl::StatusOr<std::unique_ptr<Snapshot>> NewSyncedSnapshot();

  // Visits rows of `id` in [from, to] in source order until `fn` returns false; as of
  // `at` when given, else the latest state.
  using RowVisitor = std::function<bool(Position, absl::string_view serialized_row)>;
  absl::Status ScanRows(absl::string_view id, Position from, Position to, const RowVisitor& fn,
                        const Snapshot* at = nullptr) const;
  // Visits the outbox entries of `id` in [from, to] with their rows: an entry's own row,
  // or, for an entry that stands for the row at its position (StepBatch::PutOutbox), that
  // row, read at the same moment (one SourceView-like pair of iterators). DATA_LOSS when
  // such an entry has no row.
  absl::Status ScanOutbox(absl::string_view id, Position from, Position to,
                          const RowVisitor& fn) const;
  absl::StatusOr<std::optional<std::string>> GetRow(absl::string_view id, Position pos) const;

  using StagedVisitor = std::function<bool(Position, absl::string_view value)>;

  // One source's rows and staged records (receipts, quarantine, holds) as of one moment:
  // what a page's receipt ledger reads (rows or receipts, then holds; Snapshot explains
  // why they must agree). Its iterators are made together (RocksDB's NewIterators), which
  // pins one sequence number without registering a RocksDB snapshot. A snapshot would do
  // the same, but releasing one, once per page, makes RocksDB mark every bottommost file
  // written since for a rewrite that only zeroes its sequence numbers ("BottommostFiles"
  // compactions): 0.25-0.4 s of CPU per 1M events for one source and 0.9 s for 64, where
  // the bare write loop pays none (bench/HISTORY.md item 65). Must not outlive the store;
  // one thread at a time.
  class SourceView {
   public:
    ~SourceView();
    SourceView(const SourceView&) = delete;
    SourceView& operator=(const SourceView&) = delete;

    // As Store::ScanRows and Store::ScanStaged, for this view's source.
    absl::Status ScanRows(Position from, Position to, const RowVisitor& fn) const;
    absl::Status ScanStaged(StagedFamily family, Stage stage, Position from, Position to,
                            const StagedVisitor& fn) const;

   private:
    friend class Store;
    SourceView(const Store* store, absl::string_view id);
    rocksdb::Iterator* IteratorFor(rocksdb::ColumnFamilyHandle* cf) const;

    const Store* const store_;
    const std::string id_;
    // Every iterator stops at the end of the source's keys (the scans stop at their own
    // end), so skipping deleted keys never runs into another source's.
    const std::string upper_;
    const rocksdb::Slice upper_slice_;
    // Parallel to families_; destroyed before upper_.
    std::vector<rocksdb::ColumnFamilyHandle*> families_;
    std::vector<std::unique_ptr<rocksdb::Iterator>> iterators_;
  };
  absl::StatusOr<std::unique_ptr<SourceView>> NewSourceView(absl::string_view id) const;
  // RocksDB snapshots registered now (a SourceView registers none).
  uint64_t live_snapshots() const;
  absl::Status ScanStaged(StagedFamily family, absl::string_view id, Stage stage,
                          Position from, Position to, const StagedVisitor& fn,
                          const Snapshot* at = nullptr) const;
  // Visits every hold or quarantine record of every source, from the key after
  // `start_after_key` (empty: from the start); fn gets the raw key for paging.
  using KeyedVisitor = std::function<bool(absl::string_view key, absl::string_view value)>;
  absl::Status ScanAll(StagedFamily family, absl::string_view start_after_key,
                       const KeyedVisitor& fn) const;
  absl::StatusOr<std::optional<std::string>> GetStaged(StagedFamily family,
                                                       absl::string_view id, Stage stage,
                                                       Position pos) const;

  // The WalSyncer's syncs so far (SyncWal), failed ones included: through the live WAL's
  // own handle, or through RocksDB's SyncWAL (the first, and the first after a WAL switch).
  struct WalSyncStats {
    uint64_t by_handle = 0;
    uint64_t by_rocksdb = 0;
  };
  WalSyncStats wal_sync_stats() const ABSL_LOCKS_EXCLUDED(wal_file_mu_);

  // OK while writes succeed; the first write failure otherwise, or the first failure
  // of RocksDB's own background work (a flush, a compaction, a memtable switch), which
  // no write need have met yet (sticky until reopen).
  absl::Status health() const ABSL_LOCKS_EXCLUDED(health_mu_);

  // Flushes memtables (tests, shutdown). FAILED_PRECONDITION after a failed write.
  absl::Status Flush();

  // The memtable epoch new rows are written in ("Row epochs"); tests.
  uint64_t row_epoch() const ABSL_LOCKS_EXCLUDED(epoch_mu_);

  // What the database holds in memory now; never above StoreMemoryCeiling(options).
  struct MemoryUsage {
    uint64_t memtable_bytes = 0;     // all families, mutable and immutable
    uint64_t block_cache_bytes = 0;  // the shared block cache
  };
  MemoryUsage memory_usage() const;

 private:
  Store(const StoreOptions& options, std::shared_ptr<BackgroundErrorListener> background_errors,
        rocksdb::DB* db,
        std::vector<rocksdb::ColumnFamilyHandle*> handles);

  absl::Status CheckSchema();
  // RESOURCE_EXHAUSTED when writing `bytes` would eat into the free-space reserve.
  absl::Status CheckFreeSpace(size_t bytes) const;
  absl::Mutex* SourceLock(absl::string_view id) ABSL_LOCKS_EXCLUDED(locks_mu_);
  // Writes `batch` synced, or, with `deferred`, unsynced and takes its WalSyncer ticket.
  absl::Status Write(rocksdb::WriteBatch* batch, absl::string_view operation,
                     SyncTicket* deferred = nullptr) ABSL_LOCKS_EXCLUDED(health_mu_, wal_mu_);
  // The WalSyncer's sync, refused after a write failure; a failure of its own fails the
  // store. Every write that returned before it began is durable when it returns OK.
  //
  // While the live WAL is the one the last sync opened, it is fdatasync'ed through a
  // handle of our own, concurrently with writes, which go on appending meanwhile (one
  // sync costs 1-2 ms; bench/HISTORY.md item 62). After a WAL switch (and the first
  // time) it is RocksDB's SyncWAL, which syncs every older WAL too and the directory,
  // with no write in flight: RocksDB's WAL writer asserts, in Debian's assertion-enabled
  // build, if it is synced after an append of its own failed, so that sync must begin
  // only once every earlier write's failure has been recorded.
  absl::Status SyncWal() ABSL_LOCKS_EXCLUDED(health_mu_, wal_mu_, wal_file_mu_);
  // Records a failed write or sync: the store refuses writes from then on.
  absl::Status Fail(absl::Status s) ABSL_LOCKS_EXCLUDED(health_mu_);
  // OK, or FAILED_PRECONDITION naming `operation` after an earlier write failure.
  absl::Status CheckWritable(absl::string_view operation) const
      ABSL_LOCKS_EXCLUDED(health_mu_);
  absl::StatusOr<CheckpointRecord> LoadCheckpointLocked(absl::string_view id, Stage stage);
  // For an ingest step that deletes outbox entries, or writes one the delivery stage
  // has passed (a correction): the delivery checkpoint to commit with it, its applied
  // position rewound below the lowest entry written and its step_seq and outbox_epoch
  // bumped, so the delivery step in flight (which removes entries by position) is
  // ABORTED and the replacing events are delivered. nullopt when the step leaves the
  // delivery stage alone or the source has none. REQUIRES: SourceLock(id) held.
  absl::StatusOr<std::optional<CheckpointRecord>> FenceDeliveryLocked(absl::string_view id,
                                                                      const StepBatch& step);
  // A put a commit adds to the end of a step's batch.
  struct ExtraWrite {
    rocksdb::ColumnFamilyHandle* cf;
    std::string key;
    std::string value;
  };
  // What keeps the hold versions of `step` unique at their positions (the invariant at
  // the top): the puts to add after the step's own writes, of each hold whose version must
  // be higher than its writer gave (of two puts of a key in one batch, the later wins),
  // and of the floors of the live holds it removes. Reads only the holds the step writes;
  // nothing for a step that writes none. REQUIRES: SourceLock(step.source_id()) held.
  absl::StatusOr<std::vector<ExtraWrite>> HoldVersionWritesLocked(const StepBatch& step) const;
  // Adds to `batch` the floors of the live holds of `id`, before a rebuild or a deletion
  // removes them. REQUIRES: SourceLock(id) held.
  absl::Status AddHoldFloorsLocked(absl::string_view id, rocksdb::WriteBatch* batch) const;
  // The hold floor stored at `floor_key`, if any.
  absl::StatusOr<std::optional<uint64_t>> HoldFloor(const std::string& floor_key) const;
  // The lowest version a fresh checkpoint of `id` may carry: above both stages' stored
  // versions and the floor a DeleteSource of `id` left. REQUIRES: SourceLock(id) held.
  absl::StatusOr<uint64_t> NextVersionLocked(absl::string_view id);
  rocksdb::ColumnFamilyHandle* Family(StagedFamily family) const;
  // Adds to `batch` a range deletion of every key of source `id` in each of `families`
  // that holds one: a range tombstone in a file of the bottommost level makes RocksDB
  // rewrite the whole file to drop it ("BottommostFiles" compaction), so creating a
  // source (whose ranges are empty) must not leave one in every memtable it shares with
  // ingest. REQUIRES: SourceLock(id) held (no write of `id` between scan and write).
  absl::Status DeleteKeysOf(absl::string_view id,
                            std::initializer_list<rocksdb::ColumnFamilyHandle*> families,
                            rocksdb::WriteBatch* batch) const;
  // Visits the positional or staged keys of `cf` in [begin, end_inclusive], as of `at`
  // when given; DATA_LOSS on a key without a position.
  absl::Status ScanPositions(rocksdb::ColumnFamilyHandle* cf, const std::string& begin,
                             const std::string& end_inclusive,
                             const std::function<bool(Position, absl::string_view)>& fn,
                             const Snapshot* at = nullptr) const;

  // ---- Row epochs (see the comment at the top) ----
  // A segment of a source's rows: those at positions in [start, end) are keyed in
  // `epoch` (no end: every position from start up).
  struct RowSegment {
    Position start;
    uint64_t epoch = 0;
    std::optional<Position> end;
  };
  // The source's segment of highest start (nullopt: it has none), cached per source.
  // REQUIRES: SourceLock(id) held.
  absl::StatusOr<std::optional<RowSegment>> LoadRowTailLocked(absl::string_view id)
      ABSL_LOCKS_EXCLUDED(tails_mu_);
  void ForgetRowTail(absl::string_view id) ABSL_LOCKS_EXCLUDED(tails_mu_);
  // The segment that holds `pos`, read through `segments` (an iterator over
  // row_segments); nullopt when `pos` lies below the source's first segment.
  static absl::StatusOr<std::optional<RowSegment>> FindRowSegment(rocksdb::Iterator* segments,
                                                                   absl::string_view id,
                                                                   Position pos);
  // The segment `segments` is at (nullopt if it is not one of the source of `prefix`),
  // leaving `segments` at the next entry.
  static absl::StatusOr<std::optional<RowSegment>> ReadRowSegment(rocksdb::Iterator* segments,
                                                                  absl::string_view prefix);
  // Visits the rows of `id` in [from, to] in source order through `segments` and `rows`,
  // iterators of one moment.
  static absl::Status VisitRows(rocksdb::Iterator* segments, rocksdb::Iterator* rows,
                                absl::string_view id, Position from, Position to,
                                const RowVisitor& fn);
  // Whether a row of `id` keyed in `epoch` lies at or above `pos` (and below `end`).
  absl::StatusOr<bool> HasRowsFrom(absl::string_view id, uint64_t epoch, Position pos,
                                   const std::optional<Position>& end) const;
  // Gives the rows `step` puts the epoch they are written in, and adds to its batch the
  // deletions it noted and the segments it starts; `tail` (the source's last segment)
  // is updated as the commit will leave it. REQUIRES: SourceLock(id), epoch_mu_ shared.
  absl::Status ResolveRowsLocked(StepBatch* step, uint64_t epoch,
                                 std::optional<RowSegment>* tail);
  // The epoch a commit of `id` keys its rows in: the current memtable epoch and the
  // commit's order in it ("Row epochs"). REQUIRES: SourceLock(id), epoch_mu_ shared.
  uint64_t CommitEpochLocked(absl::string_view id) ABSL_SHARED_LOCKS_REQUIRED(epoch_mu_)
      ABSL_LOCKS_EXCLUDED(order_mu_);
  // After a write of `bytes` with rows: switches the rows memtable and starts the next
  // epoch once kRowEpochFraction of the write buffer was written in this one.
  void AfterRowWrite(size_t bytes) ABSL_LOCKS_EXCLUDED(epoch_mu_);
  // Adds to `batch` the deletion of every row (every epoch) and segment of `id`.
  // REQUIRES: SourceLock(id) held.
  absl::Status DeleteRowsOf(absl::string_view id, rocksdb::WriteBatch* batch) const;
  // At open: the memtable epoch is one above the highest a stored row is keyed in.
  absl::Status StartRowEpoch() ABSL_LOCKS_EXCLUDED(epoch_mu_);
  // Schema 3 -> 4: an epoch-0 segment for every source with rows.
  absl::Status AddEpochZeroSegments(rocksdb::WriteBatch* batch) const;

  // Constant after construction.
  const StoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  ColumnFamilies cfs_;
  rocksdb::WriteOptions write_options_;

  // One lock per source serialises its fenced read-check-write.
  mutable absl::Mutex locks_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<absl::Mutex>> locks_
      ABSL_GUARDED_BY(locks_mu_);

  mutable absl::Mutex health_mu_;
  absl::Status write_failure_ ABSL_GUARDED_BY(health_mu_);
  // RocksDB's background failures, as RocksDB reports them (constant pointer).
  const std::shared_ptr<BackgroundErrorListener> background_errors_;
  // The first failure: a write's, else a background one's.
  absl::Status FailureLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_mu_);
  // Writes hold it shared from their writability check to the recording of their
  // failure; RocksDB's SyncWAL holds it exclusively (see SyncWal).
  absl::Mutex wal_mu_ ABSL_ACQUIRED_BEFORE(health_mu_);
  // The live WAL's sync handle (SyncWal); only the WalSyncer's thread uses it.
  mutable absl::Mutex wal_file_mu_ ABSL_ACQUIRED_BEFORE(wal_mu_);
  std::unique_ptr<rocksdb::FSRandomRWFile> wal_file_ ABSL_GUARDED_BY(wal_file_mu_);
  uint64_t wal_file_number_ ABSL_GUARDED_BY(wal_file_mu_) = 0;
  WalSyncStats wal_sync_stats_ ABSL_GUARDED_BY(wal_file_mu_);

  // Commits with rows hold it shared from resolving their epochs to the end of their
  // write; a switch of epoch holds it exclusively (AfterRowWrite).
  mutable absl::Mutex epoch_mu_ ABSL_ACQUIRED_BEFORE(wal_mu_);
  uint64_t row_epoch_ ABSL_GUARDED_BY(epoch_mu_) = 1;  // the memtable epoch
  std::atomic<uint64_t> epoch_bytes_{0};  // written in the current epoch (approximate)
  // Commit orders handed out in the memtable epoch `ordered_epoch_` (CommitEpochLocked).
  struct SourceOrders {
    int taken = 0;
    uint64_t last = 0;
  };
  absl::Mutex order_mu_ ABSL_ACQUIRED_AFTER(epoch_mu_);
  uint64_t ordered_epoch_ ABSL_GUARDED_BY(order_mu_) = 0;
  uint64_t last_order_ ABSL_GUARDED_BY(order_mu_) = 0;
  std::string last_ordered_source_ ABSL_GUARDED_BY(order_mu_);  // the one that took it
  absl::flat_hash_map<std::string, SourceOrders> orders_ ABSL_GUARDED_BY(order_mu_);
  mutable absl::Mutex tails_mu_;
  absl::flat_hash_map<std::string, std::optional<RowSegment>> row_tails_ ABSL_GUARDED_BY(tails_mu_);

  // Syncs deferred commits; null without sync. Destroyed before the database closes.
  std::unique_ptr<WalSyncer> syncer_;
};

// The RocksDB options Store::Open uses: database options and one descriptor per column
// family, in the store's order. Exposed so that benchmarks can write the same rows with
// a bare RocksDB loop under exactly the same tuning (bench/).
struct RocksOptions {
  rocksdb::DBOptions db;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
};
RocksOptions StoreRocksOptions(const StoreOptions& options);

// Hash of a source's identity (provider_url, chain, source, filter): a checkpoint's
// cursor is only valid under the identity it was written for.
std::string IdentityHash(const handoff::v1::SourceSpec& spec);

}  // namespace handoff::store

#endif  // HANDOFF_STORE_STORE_H_
