// Store against a real RocksDB under TEST_TMPDIR: fencing (hold resolutions and hold
// versions included), atomicity, durability across reopen and simulated power loss,
// error propagation through FaultInjectionFs, schema and foreign-directory refusal,
// source deletion and reset.
#include "store/store.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/table_properties.h"
#include "store/fault_injection_fs.h"
#include "store/keys.h"
#include "store/row_codec.h"

namespace handoff::store {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

#define ASSERT_OK(expr)                              \
  do {                                               \
    absl::Status assert_ok_status_ = (expr);         \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

// A fresh directory per test under TEST_TMPDIR.
std::string TestPath(absl::string_view suffix = "") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", info->test_suite_name(),
                                  ".", info->name(), suffix);
  std::filesystem::remove_all(path);
  return path;
}

CheckpointRecord Fresh(absl::string_view cursor, uint64_t version = 0) {
  CheckpointRecord r;
  r.set_resume_cursor(std::string(cursor));
  r.set_version(version);
  r.set_identity_hash("identity");
  return r;
}

std::string RowBytes(Position p, size_t padding = 200) {
  handoff::v1::EventRow row;
  row.set_block_number(p.block);
  row.set_log_index(p.log_index);
  row.set_block_hash(absl::StrCat("0xhash", p.block));
  row.set_data(std::string(padding, 'd'));
  return row.SerializeAsString();
}

handoff::v1::Hold HoldAt(absl::string_view id, Position p) {
  handoff::v1::Hold hold;
  hold.set_source_id(std::string(id));
  hold.mutable_event()->set_block_number(p.block);
  hold.mutable_event()->set_log_index(p.log_index);
  hold.set_reason("sink rejected");
  return hold;
}

ReceiptRecord Receipt(Position p) {
  ReceiptRecord r;
  r.set_block_hash(absl::StrCat("0xhash", p.block));
  r.set_outcome(RECEIPT_APPLIED);
  return r;
}

Mark MarkAt(uint64_t n) {
  Mark m;
  m.set_number(n);
  m.set_hash(absl::StrCat("0x", n));
  m.set_present(true);
  return m;
}

// A step with `rows` rows, receipts and outbox entries from block `first_block`, and a
// hold for every tenth one.
std::unique_ptr<StepBatch> BigStep(Store* store, absl::string_view id, int rows,
                                   uint64_t first_block = 1000) {
  std::unique_ptr<StepBatch> step = store->NewStep(id);
  for (int i = 0; i < rows; ++i) {
    Position p{first_block + static_cast<uint64_t>(i / 4), static_cast<uint64_t>(i % 4)};
    step->PutRow(p, RowBytes(p));
    step->PutReceipt(Stage::kIngest, p, Receipt(p));
    step->PutOutbox(p, RowBytes(p, 10));
    if (i % 10 == 0) step->PutHold(Stage::kDelivery, p, HoldAt(id, p));
  }
  return step;
}

int CountRows(Store* store, absl::string_view id) {
  int n = 0;
  absl::Status s = store->ScanRows(id, Position{0, 0}, Position{kMax, kMax},
                                   [&](Position, absl::string_view) { return ++n, true; });
  EXPECT_TRUE(s.ok()) << s;
  return n;
}

int CountOutbox(Store* store, absl::string_view id) {
  int n = 0;
  absl::Status s = store->ScanOutbox(id, Position{0, 0}, Position{kMax, kMax},
                                     [&](Position, absl::string_view) { return ++n, true; });
  EXPECT_TRUE(s.ok()) << s;
  return n;
}

int CountStaged(Store* store, StagedFamily family, absl::string_view id, Stage stage) {
  int n = 0;
  absl::Status s = store->ScanStaged(family, id, stage, Position{0, 0}, Position{kMax, kMax},
                                     [&](Position, absl::string_view) { return ++n, true; });
  EXPECT_TRUE(s.ok()) << s;
  return n;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = TestPath(); }

  // Opens at path_ (through env_ when a fault FS is in use).
  void Open(bool sync = true, size_t write_buffer_bytes = 64 << 20) {
    store_.reset();
    StoreOptions options;
    options.path = path_;
    options.sync = sync;
    options.env = env_.get();
    options.write_buffer_bytes = write_buffer_bytes;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void Reopen(bool sync = true) { Open(sync); }
  void UseFaultInjection() {
    fs_ = std::make_shared<FaultInjectionFs>();
    env_ = rocksdb::NewCompositeEnv(fs_);
  }
  void Seed(absl::string_view id, absl::string_view cursor = "c0") {
    ASSERT_TRUE(store_->ResetSource(id, Fresh(cursor), std::nullopt).ok());
  }
  CheckpointRecord Checkpoint(absl::string_view id, Stage stage = Stage::kIngest) {
    absl::StatusOr<CheckpointRecord> r = store_->LoadCheckpoint(id, stage);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : CheckpointRecord();
  }

  std::string path_;
  // Declared before store_: the database must close before its Env and FileSystem go.
  std::shared_ptr<FaultInjectionFs> fs_;
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<Store> store_;
};

// ---- Compare-and-swap and fencing ----

TEST_F(StoreTest, CompareAndSwapStaleWriterLosesAndNothingChanges) {
  Open();
  Seed("s");
  absl::StatusOr<CheckpointRecord> won = store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c1");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(won->resume_cursor(), "c1");
  EXPECT_EQ(won->version(), 1u);

  // Same (cursor, version) again: the stale writer loses.
  absl::StatusOr<CheckpointRecord> stale = store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c2");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  // The right version with another cursor, and the right cursor with an old version.
  EXPECT_EQ(store_->CompareAndSwap("s", Stage::kIngest, "c9", 1, "c2").status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(store_->CompareAndSwap("s", Stage::kIngest, "c1", 0, "c2").status().code(),
            absl::StatusCode::kAborted);
  // The other stage has no checkpoint.
  EXPECT_EQ(store_->CompareAndSwap("s", Stage::kDelivery, "c1", 1, "c2").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->CompareAndSwap("nope", Stage::kIngest, "c0", 0, "c1").status().code(),
            absl::StatusCode::kNotFound);

  Reopen();
  CheckpointRecord after = Checkpoint("s");
  EXPECT_EQ(after.resume_cursor(), "c1");
  EXPECT_EQ(after.version(), 1u);
  // And the winner's successor still moves it.
  EXPECT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c1", 1, "c2").ok());
}

TEST_F(StoreTest, StaleStepWritesNoneOfItsRows) {
  Open();
  Seed("s");
  ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c1").ok());  // v1

  std::unique_ptr<StepBatch> stale = BigStep(store_.get(), "s", 40);
  const int ops = stale->count();
  Fence fence;
  fence.expected_version = 0;
  CheckpointUpdate update;
  update.applied = Position{1010, 3};
  update.counter_deltas.set_applied(40);
  absl::StatusOr<CheckpointRecord> r = store_->CommitStep(Stage::kIngest, stale.get(), fence, update);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stale->count(), ops);  // the step is left as built

  // A barrier whose cursor is not the stored one is fenced out too, version or not.
  std::unique_ptr<StepBatch> wrong_cursor = BigStep(store_.get(), "s", 40);
  fence.expected_version = 1;
  fence.barrier = Fence::Barrier{"c0", "c2"};
  EXPECT_EQ(store_->CommitStep(Stage::kIngest, wrong_cursor.get(), fence, update).status().code(),
            absl::StatusCode::kAborted);

  Reopen();
  EXPECT_EQ(CountRows(store_.get(), "s"), 0);
  EXPECT_EQ(CountOutbox(store_.get(), "s"), 0);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kReceipts, "s", Stage::kIngest), 0);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "s", Stage::kDelivery), 0);
  CheckpointRecord cp = Checkpoint("s");
  EXPECT_EQ(cp.version(), 1u);
  EXPECT_EQ(cp.resume_cursor(), "c1");
  EXPECT_FALSE(cp.has_applied());
  EXPECT_EQ(cp.counters().applied(), 0u);
}

TEST_F(StoreTest, FencedStepCommitsWithItsCheckpoint) {
  Open();
  Seed("s");
  std::unique_ptr<StepBatch> step = BigStep(store_.get(), "s", 8);
  Fence fence;
  fence.expected_version = 0;
  fence.barrier = Fence::Barrier{"c0", "c1"};
  CheckpointUpdate update;
  update.applied = Position{1001, 3};
  update.tip = 5000;
  update.counter_deltas.set_applied(8);
  update.counter_deltas.set_pages_committed(1);
  absl::StatusOr<CheckpointRecord> r = store_->CommitStep(Stage::kIngest, step.get(), fence, update);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 1u);
  Reopen();
  CheckpointRecord cp = Checkpoint("s");
  EXPECT_EQ(cp.resume_cursor(), "c1");
  EXPECT_EQ(cp.version(), 1u);
  EXPECT_TRUE(cp.has_applied());
  EXPECT_EQ(cp.applied_block(), 1001u);
  EXPECT_EQ(cp.applied_log_index(), 3u);
  EXPECT_EQ(cp.tip(), 5000u);
  EXPECT_EQ(cp.counters().applied(), 8u);
  EXPECT_EQ(cp.counters().pages_committed(), 1u);
  EXPECT_EQ(cp.identity_hash(), "identity");
  EXPECT_EQ(CountRows(store_.get(), "s"), 8);
}

// The delivery stage has read and delivered through 101:1 and has a step in flight that
// removes 102:0 from the outbox by position. Each ingest step below is a correction, or
// a plain page, and what it does to the delivery stage is checked, then the in-flight
// delivery step commits (or not) against it.
TEST_F(StoreTest, IngestCorrectionFencesAndRewindsTheDeliveryStage) {
  Open();
  CheckpointRecord delivered = Fresh("");
  delivered.set_has_applied(true);
  delivered.set_applied_block(101);
  delivered.set_applied_log_index(1);
  ASSERT_TRUE(store_->ResetSource("s", Fresh("c0"), delivered).ok());
  const CheckpointRecord before = Checkpoint("s", Stage::kDelivery);
  auto delivery_step = [&](const CheckpointRecord& loaded) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    step->DeleteOutbox(Position{102, 0});
    step->PutReceipt(Stage::kDelivery, Position{102, 0}, Receipt(Position{102, 0}));
    Fence fence;
    fence.expected_version = loaded.version();
    fence.expected_step_seq = loaded.step_seq();
    CheckpointUpdate update;
    update.applied = Position{102, 0};
    return store_->CommitStep(Stage::kDelivery, step.get(), fence, update);
  };
  auto ingest = [&](const std::function<void(StepBatch*)>& build) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    build(step.get());
    Fence fence;
    fence.any_version = true;
    absl::StatusOr<CheckpointRecord> r =
        store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{});
    ASSERT_TRUE(r.ok()) << r.status();
  };

  // A plain page: new entries above what was delivered leave the delivery stage alone.
  ingest([](StepBatch* step) {
    step->PutOutbox(Position{102, 0}, RowBytes(Position{102, 0}));
    step->PutOutbox(Position{103, 0}, RowBytes(Position{103, 0}));
  });
  CheckpointRecord d = Checkpoint("s", Stage::kDelivery);
  EXPECT_EQ(d.step_seq(), before.step_seq());
  EXPECT_EQ(d.outbox_epoch(), before.outbox_epoch());
  EXPECT_EQ(d.applied_block(), 101u);

  // A correction replacing 102:0 while the delivery step that removes it is in flight:
  // the delivery stage is fenced (its step is ABORTED, the new entry stays), and its
  // applied position is untouched (it had not passed 102:0).
  ingest([](StepBatch* step) {
    step->DeleteOutbox(Position{102, 0});
    step->PutOutbox(Position{102, 0}, RowBytes(Position{102, 0}, 7));
  });
  d = Checkpoint("s", Stage::kDelivery);
  EXPECT_EQ(d.step_seq(), before.step_seq() + 1);
  EXPECT_EQ(d.outbox_epoch(), before.outbox_epoch() + 1);
  EXPECT_EQ(d.applied_block(), 101u);
  EXPECT_EQ(d.applied_log_index(), 1u);
  absl::StatusOr<CheckpointRecord> stale = delivery_step(before);
  EXPECT_TRUE(absl::IsAborted(stale.status())) << stale.status();
  EXPECT_EQ(CountOutbox(store_.get(), "s"), 2);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kReceipts, "s", Stage::kDelivery), 0);
  // Reread, the delivery step commits.
  ASSERT_TRUE(delivery_step(d).ok());
  EXPECT_EQ(CountOutbox(store_.get(), "s"), 1);

  // A correction step that only inserts, above the delivery's position (the old fork
  // had no event there, 102:5): a delivery reading a run from before it (here, 102:0 to
  // 103:0) would step over the new entry, or delete it with its range deletion. The step
  // fences the stage all the same; the applied position stays (it had not passed it).
  const CheckpointRecord before_insert = Checkpoint("s", Stage::kDelivery);
  ingest([](StepBatch* step) {
    step->MarkReplacesHistory();
    step->PutOutbox(Position{102, 5}, RowBytes(Position{102, 5}));
  });
  d = Checkpoint("s", Stage::kDelivery);
  EXPECT_EQ(d.step_seq(), before_insert.step_seq() + 1) << "a delivery in flight went on";
  EXPECT_EQ(d.outbox_epoch(), before_insert.outbox_epoch() + 1);
  EXPECT_EQ(d.applied_block(), before_insert.applied_block());
  EXPECT_EQ(d.applied_log_index(), before_insert.applied_log_index());
  EXPECT_TRUE(absl::IsAborted(delivery_step(before_insert).status()));
  ASSERT_TRUE(delivery_step(d).ok());

  // A deeper correction writing 101:1 and 101:0, which the delivery stage has passed:
  // its applied position goes back below the lowest entry written, so they are read.
  ingest([](StepBatch* step) {
    step->PutOutbox(Position{101, 1}, RowBytes(Position{101, 1}, 7));
    step->PutOutbox(Position{101, 0}, RowBytes(Position{101, 0}, 7));
  });
  d = Checkpoint("s", Stage::kDelivery);
  EXPECT_EQ(d.outbox_epoch(), before.outbox_epoch() + 3);
  EXPECT_TRUE(d.has_applied());
  EXPECT_EQ(d.applied_block(), 100u);
  EXPECT_EQ(d.applied_log_index(), kMax);
  // One reaching the first position clears it; and all of it is on disk.
  ingest([](StepBatch* step) { step->DeleteOutbox(Position{0, 0}); });
  Reopen();
  d = Checkpoint("s", Stage::kDelivery);
  EXPECT_FALSE(d.has_applied());
  EXPECT_EQ(d.outbox_epoch(), before.outbox_epoch() + 4);
  EXPECT_EQ(d.step_seq(), before.step_seq() + 6);  // four fences and two delivery steps
}

TEST_F(StoreTest, RacingCompareAndSwapHasExactlyOneWinner) {
  Open(/*sync=*/false);
  Seed("s");
  constexpr int kThreads = 8;
  constexpr int kRounds = 25;
  uint64_t version = 0;
  std::string cursor = "c0";
  for (int round = 0; round < kRounds; ++round) {
    absl::Barrier* start = new absl::Barrier(kThreads);  // deleted by the last to pass
    std::vector<absl::Status> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        if (start->Block()) delete start;
        results[t] = store_
                         ->CompareAndSwap("s", Stage::kIngest, cursor, version,
                                          absl::StrCat("r", round, "t", t))
                         .status();
      });
    }
    for (std::thread& th : threads) th.join();
    int winners = 0, winner = -1;
    for (int t = 0; t < kThreads; ++t) {
      if (results[t].ok()) {
        ++winners;
        winner = t;
      } else {
        EXPECT_EQ(results[t].code(), absl::StatusCode::kAborted) << results[t];
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    cursor = absl::StrCat("r", round, "t", winner);
    ++version;
    CheckpointRecord cp = Checkpoint("s");
    EXPECT_EQ(cp.resume_cursor(), cursor);
    EXPECT_EQ(cp.version(), version);
  }
}

// ---- Atomicity and durability ----

TEST_F(StoreTest, LargeStepIsAllThereAfterReopen) {
  Open();
  Seed("s");
  std::unique_ptr<StepBatch> step = BigStep(store_.get(), "s", 2000);
  Fence fence;
  fence.expected_version = 0;
  fence.barrier = Fence::Barrier{"c0", "c1"};
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}).ok());
  store_.reset();
  Open();
  EXPECT_EQ(CountRows(store_.get(), "s"), 2000);
  EXPECT_EQ(CountOutbox(store_.get(), "s"), 2000);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kReceipts, "s", Stage::kIngest), 2000);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "s", Stage::kDelivery), 200);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), "c1");
  // Flushed to tables, it is still all there.
  ASSERT_TRUE(store_->Flush().ok());
  Reopen();
  EXPECT_EQ(CountRows(store_.get(), "s"), 2000);
  absl::StatusOr<std::optional<std::string>> row = store_->GetRow("s", Position{1000, 0});
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_TRUE(row->has_value());
  EXPECT_EQ(**row, RowBytes(Position{1000, 0}));
  absl::StatusOr<std::optional<std::string>> hold =
      store_->GetStaged(StagedFamily::kHolds, "s", Stage::kDelivery, Position{1000, 0});
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_TRUE(hold->has_value());
}

// The ceiling is computed from the options RocksDB is given, family by family: each
// family stops its writes at max_write_buffer_number memtables.
TEST(StoreMemoryCeilingTest, FollowsTheOptionsEveryFamilyIsOpenedWith) {
  for (size_t write_buffer : {size_t{64} << 20, size_t{16} << 20, size_t{2} << 20}) {
    StoreOptions options;
    options.write_buffer_bytes = write_buffer;
    options.block_cache_bytes = 32 << 20;
    const RocksOptions rocks = StoreRocksOptions(options);
    size_t expected = options.block_cache_bytes;
    size_t per_event_families = 0;
    for (const rocksdb::ColumnFamilyDescriptor& family : rocks.families) {
      const rocksdb::ColumnFamilyOptions& cf = family.options;
      EXPECT_EQ(cf.max_write_buffer_number, 2) << family.name;
      if (cf.write_buffer_size == write_buffer) ++per_event_families;
      EXPECT_LE(cf.write_buffer_size, write_buffer) << family.name;
      expected += static_cast<size_t>(cf.max_write_buffer_number) *
                  (cf.write_buffer_size + cf.write_buffer_size / 8 + (1 << 20));
    }
    EXPECT_GE(per_event_families, 3u);  // rows, outbox, receipts
    EXPECT_EQ(StoreMemoryCeiling(options), expected) << write_buffer;
  }
}

TEST_F(StoreTest, MemtablesStayUnderTheCeilingWhileWritingFarMore) {
  constexpr size_t kWriteBuffer = 256 << 10;
  Open(/*sync=*/false, kWriteBuffer);
  StoreOptions options;
  options.write_buffer_bytes = kWriteBuffer;
  const uint64_t memtable_ceiling = StoreMemoryCeiling(options) - options.block_cache_bytes;
  Seed("s");
  uint64_t peak = 0;
  uint64_t version = 0;
  // ~36 MB of rows, outbox entries and receipts (a hundred times the write buffer), in
  // steps of ~60 KB.
  for (int i = 0; i < 600; ++i) {
    std::unique_ptr<StepBatch> step = BigStep(store_.get(), "s", 200, 1000 + 50 * i);
    Fence fence;
    fence.expected_version = version;
    fence.barrier = Fence::Barrier{absl::StrCat("c", i), absl::StrCat("c", i + 1)};
    absl::StatusOr<CheckpointRecord> r =
        store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{});
    ASSERT_TRUE(r.ok()) << r.status();
    version = r->version();
    const Store::MemoryUsage usage = store_->memory_usage();
    peak = std::max(peak, usage.memtable_bytes);
    ASSERT_LE(usage.memtable_bytes, memtable_ceiling) << "after step " << i;
  }
  EXPECT_GT(peak, kWriteBuffer) << "the memtables never filled: the bound was not exercised";
  EXPECT_EQ(CountRows(store_.get(), "s"), 600 * 200);
}

TEST_F(StoreTest, HighestMarksNeverDecrease) {
  Open();
  Seed("s");
  auto commit = [&](std::optional<Mark> finalized, std::optional<Mark> safe) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    Fence fence;
    fence.expected_version = Checkpoint("s").version();
    CheckpointUpdate update;
    update.finalized = finalized;
    update.safe = safe;
    absl::StatusOr<CheckpointRecord> r = store_->CommitStep(Stage::kIngest, step.get(), fence, update);
    EXPECT_TRUE(r.ok()) << r.status();
  };
  commit(MarkAt(100), MarkAt(120));
  EXPECT_EQ(Checkpoint("s").highest_finalized().number(), 100u);
  commit(MarkAt(50), MarkAt(60));  // lower: ignored
  EXPECT_EQ(Checkpoint("s").highest_finalized().number(), 100u);
  EXPECT_EQ(Checkpoint("s").highest_safe().number(), 120u);
  commit(Mark(), Mark());  // null marks (provider said nothing): ignored
  commit(std::nullopt, std::nullopt);
  EXPECT_EQ(Checkpoint("s").highest_finalized().number(), 100u);
  commit(MarkAt(150), MarkAt(121));
  Reopen();
  EXPECT_EQ(Checkpoint("s").highest_finalized().number(), 150u);
  EXPECT_EQ(Checkpoint("s").highest_finalized().hash(), "0x150");
  EXPECT_EQ(Checkpoint("s").highest_safe().number(), 121u);
  commit(MarkAt(149), MarkAt(0));
  EXPECT_EQ(Checkpoint("s").highest_finalized().number(), 150u);
  EXPECT_EQ(Checkpoint("s").highest_safe().number(), 121u);
}

// What a hold resolution does (terminal row written, hold deleted) between the two
// scans of a receipt ledger: through one Snapshot both scans see the state before it.
TEST_F(StoreTest, ScansThroughOneSnapshotSeeOnePointInTime) {
  Open();
  Seed("s");
  const Position held{120, 1};
  handoff::v1::Hold hold;
  hold.set_version(1);
  std::unique_ptr<StepBatch> put = store_->NewStep("s");
  put->PutHold(Stage::kIngest, held, hold);
  Fence any;
  any.any_version = true;
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, put.get(), any, CheckpointUpdate{}).ok());

  const std::unique_ptr<Store::Snapshot> at = store_->NewSnapshot();
  std::unique_ptr<StepBatch> resolve = store_->NewStep("s");
  resolve->PutRow(held, RowBytes(held, 1));
  resolve->DeleteHold(Stage::kIngest, held);
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, resolve.get(), any, CheckpointUpdate{}).ok());

  auto count = [&](bool rows, const Store::Snapshot* view) {
    int n = 0;
    auto visit = [&](Position, absl::string_view) {
      ++n;
      return true;
    };
    absl::Status s = rows ? store_->ScanRows("s", held, held, visit, view)
                          : store_->ScanStaged(StagedFamily::kHolds, "s", Stage::kIngest, held,
                                               held, visit, view);
    EXPECT_TRUE(s.ok()) << s;
    return n;
  };
  EXPECT_EQ(count(/*rows=*/true, at.get()), 0);   // not terminal yet, and
  EXPECT_EQ(count(/*rows=*/false, at.get()), 1);  // still held: never "neither"
  EXPECT_EQ(count(/*rows=*/true, nullptr), 1);    // the latest state: terminal,
  EXPECT_EQ(count(/*rows=*/false, nullptr), 0);   // hold gone
}

// The same resolution racing a page's receipt ledger, which reads through a SourceView:
// both scans see the moment the view was made, and no RocksDB snapshot is registered
// (releasing one per page makes RocksDB rewrite bottommost files; see SourceView).
TEST_F(StoreTest, SourceViewSeesOneMomentWithoutASnapshot) {
  Open();
  Seed("s");
  Seed("s0");  // a neighbour whose keys follow "s"'s: never visible through s's view
  const Position before{119, 0}, held{120, 1};
  handoff::v1::Hold hold;
  hold.set_version(1);
  Fence any;
  any.any_version = true;
  std::unique_ptr<StepBatch> put = store_->NewStep("s");
  put->PutRow(before, RowBytes(before, 1));
  put->PutHold(Stage::kIngest, held, hold);
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, put.get(), any, CheckpointUpdate{}).ok());
  std::unique_ptr<StepBatch> neighbour = store_->NewStep("s0");
  neighbour->PutRow(held, RowBytes(held, 1));
  neighbour->PutHold(Stage::kIngest, held, hold);
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, neighbour.get(), any, CheckpointUpdate{}).ok());

  absl::StatusOr<std::unique_ptr<Store::SourceView>> view = store_->NewSourceView("s");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(store_->live_snapshots(), 0u);
  std::unique_ptr<StepBatch> resolve = store_->NewStep("s");
  resolve->PutRow(held, RowBytes(held, 1));
  resolve->DeleteHold(Stage::kIngest, held);
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, resolve.get(), any, CheckpointUpdate{}).ok());

  std::vector<Position> rows, holds;
  ASSERT_OK((*view)->ScanRows(Position{0, 0}, Position{kMax, kMax},
                              [&](Position p, absl::string_view) {
                                rows.push_back(p);
                                return true;
                              }));
  ASSERT_OK((*view)->ScanStaged(StagedFamily::kHolds, Stage::kIngest, Position{0, 0},
                                Position{kMax, kMax}, [&](Position p, absl::string_view) {
                                  holds.push_back(p);
                                  return true;
                                }));
  EXPECT_EQ(rows, std::vector<Position>{before});  // not terminal yet, and
  EXPECT_EQ(holds, std::vector<Position>{held});   // still held: never "neither"
  // A scan's end bounds it inside the source too.
  int upto_before = 0;
  ASSERT_OK((*view)->ScanRows(Position{0, 0}, before, [&](Position, absl::string_view) {
    return ++upto_before, true;
  }));
  EXPECT_EQ(upto_before, 1);
  EXPECT_EQ(CountRows(store_.get(), "s"), 2);  // the latest state: terminal, hold gone
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "s", Stage::kIngest), 0);
  // A Snapshot does register one (what the admin API's reads use).
  const std::unique_ptr<Store::Snapshot> at = store_->NewSnapshot();
  EXPECT_EQ(store_->live_snapshots(), 1u);
}

// ---- Holds: their versions fence an operator's decision ----

// The stored version of the hold of "s" at (stage, pos); 0 when there is none.
uint64_t HoldVersion(Store* store, Stage stage, Position pos) {
  absl::StatusOr<std::optional<std::string>> value =
      store->GetStaged(StagedFamily::kHolds, "s", stage, pos);
  EXPECT_TRUE(value.ok()) << value.status();
  if (!value.ok() || !value->has_value()) return 0;
  handoff::v1::Hold hold;
  EXPECT_TRUE(hold.ParseFromString(**value));
  return hold.version();
}

// An operator quotes the version of the hold he read (ResolveHold). A new hold at the
// same position, for the event a correction or a rebuild put there, is written by the
// worker at version 1 again (PageAttempt::MakeHold): the store keeps it above every
// version an earlier hold there had, so that a decision about the old hold can never
// pass the version check of the new one.
TEST_F(StoreTest, AHoldNeverTakesAVersionAnEarlierHoldAtItsPositionHad) {
  Open();
  ASSERT_OK(store_->ResetSource("s", Fresh("c0"), Fresh("")));
  const Position p{120, 1}, other{121, 0};
  Fence any;
  any.any_version = true;
  auto put = [&](Stage stage, Position pos, uint64_t version, bool delete_first = false) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    if (delete_first) step->DeleteHold(stage, pos);
    handoff::v1::Hold hold = HoldAt("s", pos);
    hold.set_version(version);
    step->PutHold(stage, pos, hold);
    return store_->CommitStep(stage, step.get(), any, CheckpointUpdate{}).status();
  };
  auto remove = [&](Stage stage, Position pos) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    step->DeleteHold(stage, pos);
    return store_->CommitStep(stage, step.get(), any, CheckpointUpdate{}).status();
  };
  // The first hold at a position keeps the versions its writer gives it.
  ASSERT_OK(put(Stage::kIngest, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 1u);
  ASSERT_OK(put(Stage::kIngest, p, 2));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 2u);
  // A correction replaces the held event in the step that holds its successor ...
  ASSERT_OK(put(Stage::kIngest, p, 1, /*delete_first=*/true));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 3u);
  // ... or in an earlier one (or the hold was resolved, then the event replaced).
  ASSERT_OK(remove(Stage::kIngest, p));
  ASSERT_OK(put(Stage::kIngest, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 4u);
  // A writer with a stale copy of the hold never takes its version back.
  ASSERT_OK(put(Stage::kIngest, p, 2));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 5u);
  // Another position, and the other stage at this one, have their own histories.
  ASSERT_OK(put(Stage::kIngest, other, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, other), 1u);
  ASSERT_OK(put(Stage::kDelivery, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kDelivery, p), 1u);

  // Kept across a reopen, ...
  Reopen();
  ASSERT_OK(remove(Stage::kIngest, p));
  ASSERT_OK(put(Stage::kIngest, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 6u);
  // ... a rebuild, which removes every hold (`other` was live at version 1), ...
  ASSERT_OK(store_->ResetSource("s", Fresh("c0"), Fresh("")));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 0u);
  ASSERT_OK(put(Stage::kIngest, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 7u);
  ASSERT_OK(put(Stage::kIngest, other, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, other), 2u);
  // ... and the deletion of the source and its re-creation under the same id.
  ASSERT_OK(store_->DeleteSource("s"));
  ASSERT_OK(store_->ResetSource("s", Fresh("c0"), Fresh("")));
  ASSERT_OK(put(Stage::kIngest, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, p), 8u);
  ASSERT_OK(put(Stage::kDelivery, p, 1));
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kDelivery, p), 2u);
}

// A hold resolution is fenced by the hold, not by the checkpoint version (the operator
// never saw one), yet it must fence the worker: an attempt that read the hold before the
// resolution and commits its own outcome for the event after it (a retry whose sink call
// was in flight) is ABORTED, and rereads, instead of overwriting the operator's decision.
TEST_F(StoreTest, AHoldResolutionFencesTheAttemptInFlight) {
  Open();
  Seed("s");
  const Position held{120, 1};
  handoff::v1::Hold hold = HoldAt("s", held);
  hold.set_version(1);
  hold.set_kind(handoff::v1::HOLD_KIND_RETRYING);
  std::unique_ptr<StepBatch> first = store_->NewStep("s");
  first->PutHold(Stage::kIngest, held, hold);
  Fence fence;
  fence.expected_version = 0;
  absl::StatusOr<CheckpointRecord> attempt =
      store_->CommitStep(Stage::kIngest, first.get(), fence, CheckpointUpdate{});
  ASSERT_TRUE(attempt.ok()) << attempt.status();

  // The operator's QUARANTINE (what SourceManagerImpl::ResolveHold commits).
  std::unique_ptr<StepBatch> resolve = store_->NewStep("s");
  ReceiptRecord quarantined = Receipt(held);
  quarantined.set_outcome(RECEIPT_QUARANTINED);
  resolve->PutReceipt(Stage::kIngest, held, quarantined);
  resolve->PutRow(held, RowBytes(held));
  resolve->DeleteHold(Stage::kIngest, held);
  Fence by_hold;
  by_hold.any_version = true;
  by_hold.hold = Fence::HoldPrecondition{Stage::kIngest, held, 1};
  CheckpointUpdate decided;
  decided.counter_deltas.set_quarantined(1);
  ASSERT_OK(store_->CommitStep(Stage::kIngest, resolve.get(), by_hold, decided).status());

  // The attempt's retry answered APPLIED; its step is fenced as all of its steps are.
  std::unique_ptr<StepBatch> retry = store_->NewStep("s");
  ReceiptRecord applied = Receipt(held);
  retry->PutReceipt(Stage::kIngest, held, applied);
  retry->PutRow(held, RowBytes(held));
  retry->DeleteHold(Stage::kIngest, held);
  Fence stale;
  stale.expected_version = attempt->version();
  stale.expected_step_seq = attempt->step_seq();
  CheckpointUpdate counted;
  counted.counter_deltas.set_applied(1);
  EXPECT_EQ(store_->CommitStep(Stage::kIngest, retry.get(), stale, counted).status().code(),
            absl::StatusCode::kAborted);
  CheckpointRecord cp = Checkpoint("s");
  EXPECT_EQ(cp.counters().applied(), 0u);
  EXPECT_EQ(cp.counters().quarantined(), 1u);
  absl::StatusOr<std::optional<std::string>> receipt =
      store_->GetStaged(StagedFamily::kReceipts, "s", Stage::kIngest, held);
  ASSERT_TRUE(receipt.ok() && receipt->has_value());
  ReceiptRecord stored;
  ASSERT_TRUE(stored.ParseFromString(**receipt));
  EXPECT_EQ(stored.outcome(), RECEIPT_QUARANTINED);

  // The other order: the worker's step first, then a resolution quoting the version the
  // operator read loses (the hold changed, or is gone).
  std::unique_ptr<StepBatch> again = store_->NewStep("s");
  const Position next{121, 0};
  hold = HoldAt("s", next);
  hold.set_version(1);
  again->PutHold(Stage::kIngest, next, hold);
  Fence current;
  current.expected_version = cp.version();
  current.expected_step_seq = cp.step_seq();
  ASSERT_OK(store_->CommitStep(Stage::kIngest, again.get(), current, CheckpointUpdate{}).status());
  std::unique_ptr<StepBatch> worker = store_->NewStep("s");
  hold.set_version(2);
  worker->PutHold(Stage::kIngest, next, hold);
  current.expected_step_seq = cp.step_seq() + 1;
  ASSERT_OK(store_->CommitStep(Stage::kIngest, worker.get(), current, CheckpointUpdate{}).status());
  std::unique_ptr<StepBatch> late = store_->NewStep("s");
  late->DeleteHold(Stage::kIngest, next);
  by_hold.hold = Fence::HoldPrecondition{Stage::kIngest, next, 1};
  EXPECT_EQ(store_->CommitStep(Stage::kIngest, late.get(), by_hold, decided).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(HoldVersion(store_.get(), Stage::kIngest, next), 2u);
}

TEST_F(StoreTest, ScanRowsOrdersLargePositions) {
  Open();
  Seed("s");
  Seed("s-x");
  const std::vector<Position> sorted = {
      {1, 1},
      {(uint64_t{1} << 32) - 1, 5},
      {uint64_t{1} << 32, 0},
      {(uint64_t{1} << 32) + 1, uint64_t{1} << 40},
      {uint64_t{1} << 63, 0},
      {kMax - 1, kMax},
      {kMax, 0},
      {kMax, kMax},
  };
  std::unique_ptr<StepBatch> step = store_->NewStep("s");
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Position& p = sorted[(i * 5) % sorted.size()];  // a permutation
    step->PutRow(p, RowBytes(p, 1));
    step->PutReceipt(Stage::kDelivery, p, Receipt(p));
  }
  Fence fence;
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}).ok());
  // A neighbour whose id extends "s" must not show up in the scans of "s".
  std::unique_ptr<StepBatch> other = store_->NewStep("s-x");
  other->PutRow(Position{2, 2}, RowBytes(Position{2, 2}, 1));
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, other.get(), fence, CheckpointUpdate{}).ok());

  std::vector<Position> seen;
  ASSERT_TRUE(store_
                  ->ScanRows("s", Position{0, 0}, Position{kMax, kMax},
                             [&](Position p, absl::string_view) {
                               seen.push_back(p);
                               return true;
                             })
                  .ok());
  EXPECT_EQ(seen, sorted);

  seen.clear();
  ASSERT_TRUE(store_
                  ->ScanRows("s", Position{uint64_t{1} << 32, 0}, Position{uint64_t{1} << 63, 0},
                             [&](Position p, absl::string_view) {
                               seen.push_back(p);
                               return true;
                             })
                  .ok());
  EXPECT_EQ(seen, std::vector<Position>(sorted.begin() + 2, sorted.begin() + 5));

  seen.clear();
  ASSERT_TRUE(store_
                  ->ScanStaged(StagedFamily::kReceipts, "s", Stage::kDelivery,
                               Position{kMax - 1, 0}, Position{kMax, kMax},
                               [&](Position p, absl::string_view) {
                                 seen.push_back(p);
                                 return true;
                               })
                  .ok());
  EXPECT_EQ(seen, std::vector<Position>(sorted.end() - 3, sorted.end()));

  // The visitor stops the scan.
  int visited = 0;
  ASSERT_TRUE(store_
                  ->ScanRows("s", Position{0, 0}, Position{kMax, kMax},
                             [&](Position, absl::string_view) { return ++visited < 3; })
                  .ok());
  EXPECT_EQ(visited, 3);
}

// ---- Opening: schema and foreign directories ----

// Opens the database at `path` with plain RocksDB (every existing family) and runs `fn`.
void WithRawDb(const std::string& path,
               const std::function<void(rocksdb::DB*, const std::vector<std::string>&,
                                        const std::vector<rocksdb::ColumnFamilyHandle*>&)>& fn) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(options, path, &names).ok()) names = {"default"};
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, families, &handles, &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  fn(db.get(), names, handles);
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  ASSERT_TRUE(db->Close().ok());
}

absl::Status OpenStatus(const std::string& path) {
  StoreOptions options;
  options.path = path;
  return Store::Open(options).status();
}

// Writes meta/schema_version with plain RocksDB.
void SetSchemaVersion(const std::string& path, const std::string& version) {
  WithRawDb(path, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "meta") {
        ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], "schema_version", version).ok());
      }
    }
  });
}

TEST_F(StoreTest, RefusesANewerSchemaVersion) {
  Open();
  Seed("s");
  store_.reset();
  SetSchemaVersion(path_, std::to_string(kSchemaVersion + 1));
  absl::Status s = OpenStatus(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("schema version '", kSchemaVersion + 1,
                                                          "'")))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("reads versions 1 to ", kSchemaVersion)))
      << s;
}

// A version 1 database (rows and outbox entries as serialized EventRow) opens, is marked
// the current version, and its rows and entries still read next to ones written in the
// current formats (compact rows, entries that stand for their row).
TEST_F(StoreTest, UpgradesSchemaVersionOneInPlace) {
  Open();
  Seed("s");
  handoff::v1::EventRow legacy;
  legacy.set_block_number(1);
  legacy.set_block_hash("0x" + std::string(64, 'a'));
  legacy.set_data("0xABCD");
  std::unique_ptr<StepBatch> step = store_->NewStep("s");
  step->PutRow(Position{1, 0}, legacy.SerializeAsString());
  step->PutOutbox(Position{1, 0}, legacy.SerializeAsString());
  handoff::v1::EventRow current = legacy;
  current.set_block_number(2);
  step->PutRow(Position{2, 0}, EncodeRow(current));
  step->PutOutbox(Position{2, 0});
  Fence fence;
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}).ok());
  store_.reset();
  SetSchemaVersion(path_, "1");
  Open();
  std::vector<handoff::v1::EventRow> rows;
  ASSERT_TRUE(store_
                  ->ScanRows("s", Position{0, 0}, Position{9, 9},
                             [&](Position, absl::string_view value) {
                               rows.emplace_back();
                               EXPECT_TRUE(DecodeRow(value, &rows.back()).ok());
                               return true;
                             })
                  .ok());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].SerializeAsString(), legacy.SerializeAsString());
  EXPECT_EQ(rows[1].SerializeAsString(), current.SerializeAsString());
  std::vector<handoff::v1::EventRow> entries;
  ASSERT_OK(store_->ScanOutbox("s", Position{0, 0}, Position{9, 9},
                               [&](Position, absl::string_view value) {
                                 entries.emplace_back();
                                 EXPECT_TRUE(DecodeRow(value, &entries.back()).ok());
                                 return true;
                               }));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].SerializeAsString(), legacy.SerializeAsString());
  EXPECT_EQ(entries[1].SerializeAsString(), current.SerializeAsString());
  store_.reset();
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != "meta") continue;
      std::string v;
      ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), handles[i], "schema_version", &v).ok());
      EXPECT_EQ(v, std::to_string(kSchemaVersion));
    }
  });
}

// Outbox entries put without a row stand for the row at their position: stored empty,
// read with the row; an entry that carries its own row (older databases) reads as
// stored; an entry whose row is missing is DATA_LOSS, never an empty event.
TEST_F(StoreTest, OutboxEntriesStandForTheirRows) {
  Open();
  Seed("s");
  Seed("s0");
  std::unique_ptr<StepBatch> step = store_->NewStep("s");
  for (uint64_t b = 1; b <= 5; ++b) {
    step->PutRow(Position{b, 0}, RowBytes(Position{b, 0}, b));
    if (b != 3) step->PutOutbox(Position{b, 0});  // a row delivered already: no entry
  }
  step->PutOutbox(Position{6, 0}, "own row");
  Fence any;
  any.any_version = true;
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, step.get(), any, CheckpointUpdate{}).ok());
  std::unique_ptr<StepBatch> other = store_->NewStep("s0");
  other->PutRow(Position{7, 0}, RowBytes(Position{7, 0}));
  other->PutOutbox(Position{7, 0});
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, other.get(), any, CheckpointUpdate{}).ok());

  auto scan = [&](Position from, Position to) {
    std::map<uint64_t, std::string> seen;
    absl::Status s = store_->ScanOutbox("s", from, to, [&](Position p, absl::string_view v) {
      seen[p.block] = std::string(v);
      return true;
    });
    EXPECT_TRUE(s.ok()) << s;
    return seen;
  };
  std::map<uint64_t, std::string> all = scan(Position{0, 0}, Position{kMax, kMax});
  ASSERT_EQ(all.size(), 5u);
  for (uint64_t b : {1, 2, 4, 5}) EXPECT_EQ(all[b], RowBytes(Position{b, 0}, b)) << b;
  EXPECT_EQ(all[6], "own row");
  EXPECT_EQ(scan(Position{2, 0}, Position{4, 0}).size(), 2u);  // 2 and 4
  store_.reset();
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != "outbox") continue;
      std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
      int empty = 0;
      for (it->SeekToFirst(); it->Valid(); it->Next()) empty += it->value().empty();
      EXPECT_EQ(empty, 5);  // the row is stored once
    }
  });

  Open();
  std::unique_ptr<StepBatch> lose = store_->NewStep("s");
  lose->DeleteRow(Position{4, 0});
  ASSERT_TRUE(store_->CommitStep(Stage::kIngest, lose.get(), any, CheckpointUpdate{}).ok());
  int visited = 0;
  absl::Status s = store_->ScanOutbox("s", Position{0, 0}, Position{kMax, kMax},
                                      [&](Position, absl::string_view) { return ++visited, true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "at 4:0 has no row")) << s;
  EXPECT_EQ(visited, 2);  // 1 and 2, then the entry of 4 stops the scan
}

TEST_F(StoreTest, OutboxRangeRemovalTakesExactlyItsRange) {
  Open();
  Seed("s");
  Seed("s0");
  Seed("s\x01");  // sorts right after "s"'s keys: a range of "s" must not reach it
  Fence any;
  any.any_version = true;
  for (const char* id : {"s", "s0", "s\x01"}) {
    std::unique_ptr<StepBatch> step = store_->NewStep(id);
    for (uint64_t b = 1; b <= 4; ++b) {
      for (uint64_t l : {uint64_t{0}, uint64_t{1}, kMax}) step->PutOutbox(Position{b, l}, "row");
    }
    ASSERT_TRUE(store_->CommitStep(Stage::kIngest, step.get(), any, CheckpointUpdate{}).ok());
  }
  auto positions = [&](absl::string_view id) {
    std::vector<Position> seen;
    absl::Status s = store_->ScanOutbox(id, Position{0, 0}, Position{kMax, kMax},
                                        [&](Position p, absl::string_view) {
                                          seen.push_back(p);
                                          return true;
                                        });
    EXPECT_TRUE(s.ok()) << s;
    return seen;
  };
  std::unique_ptr<StepBatch> step = store_->NewStep("s");
  step->DeleteOutboxRange(Position{1, 1}, Position{3, 0});  // both ends included
  step->DeleteOutboxRange(Position{4, kMax}, Position{4, kMax});
  EXPECT_EQ(step->lowest_outbox_write(), (Position{1, 1}));
  EXPECT_TRUE(step->deletes_outbox());
  absl::StatusOr<CheckpointRecord> r =
      store_->CommitStep(Stage::kIngest, step.get(), any, CheckpointUpdate{});
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<Position> kept = {Position{1, 0}, Position{3, 1}, Position{3, kMax},
                                      Position{4, 0}, Position{4, 1}};
  EXPECT_EQ(positions("s"), kept);
  Reopen();  // the same from the files, after a flush of the memtable
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(positions("s"), kept);
  EXPECT_EQ(positions("s0").size(), 12u);
  EXPECT_EQ(positions("s\x01").size(), 12u);
}

TEST_F(StoreTest, RefusesForeignDirectory) {
  std::filesystem::create_directories(path_);
  std::ofstream(path_ + "/notes.txt") << "not a database\n";
  absl::Status s = OpenStatus(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "foreign data directory")) << s;
  // And leaves it alone.
  EXPECT_FALSE(std::filesystem::exists(path_ + "/CURRENT"));
}

TEST_F(StoreTest, RefusesForeignRocksDb) {
  // Another program's RocksDB using only the default family.
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>&,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[0], "user:1", "alice").ok());
  });
  absl::Status s = OpenStatus(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "no Handoff schema version")) << s;

  // One with a family we do not know.
  const std::string other = TestPath(".families");
  WithRawDb(other, [](rocksdb::DB* db, const std::vector<std::string>&,
                      const std::vector<rocksdb::ColumnFamilyHandle*>&) {
    rocksdb::ColumnFamilyHandle* h = nullptr;
    ASSERT_TRUE(db->CreateColumnFamily(rocksdb::ColumnFamilyOptions(), "accounts", &h).ok());
    db->DestroyColumnFamilyHandle(h);
  });
  s = OpenStatus(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "unknown column family 'accounts'")) << s;
}

TEST_F(StoreTest, ScanReportsKeysWithoutPosition) {
  Open();
  Seed("s");
  store_.reset();
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "rows") {
        ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], std::string("s\0xyz", 5), "?").ok());
      }
      if (names[i] == "row_segments") {  // an epoch-0 segment, so that the key is read
        ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i],
                            keys::Positional("s", Position{0, 0}), std::string(8, '\0'))
                        .ok());
      }
    }
  });
  Open();
  absl::Status s = store_->ScanRows("s", Position{0, 0}, Position{kMax, kMax},
                                    [](Position, absl::string_view) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
}

// ---- Row epochs ----

// Commits `rows` rows of `id` from `first` (consecutive log indexes of one block each
// ten), each row's bytes tagged with `tag`; returns the positions.
std::vector<Position> CommitRows(Store* store, absl::string_view id, Position first, int rows,
                                 absl::string_view tag,
                                 const std::vector<Position>& deletes = {}) {
  if (absl::IsNotFound(store->LoadCheckpoint(id, Stage::kIngest).status())) {
    EXPECT_TRUE(store->ResetSource(id, Fresh("c0"), std::nullopt).ok());
  }
  std::unique_ptr<StepBatch> step = store->NewStep(id);
  for (Position p : deletes) step->DeleteRow(p);
  std::vector<Position> out;
  for (int i = 0; i < rows; ++i) {
    const Position p{first.block + (first.log_index + i) / 10, (first.log_index + i) % 10};
    step->PutRow(p, absl::StrCat(tag, ":", RowBytes(p)));
    out.push_back(p);
  }
  Fence fence;
  fence.any_version = true;
  absl::StatusOr<CheckpointRecord> r =
      store->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{});
  EXPECT_TRUE(r.ok()) << r.status();
  return out;
}

// Every row of `id` as position -> tag.
std::map<Position, std::string> RowTags(Store* store, absl::string_view id) {
  std::map<Position, std::string> out;
  absl::Status s = store->ScanRows(id, Position{0, 0}, Position{kMax, kMax},
                                   [&](Position p, absl::string_view v) {
                                     out[p] = std::string(v.substr(0, v.find(':')));
                                     return true;
                                   });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Calls `fn(key, value)` for each row of the rows family in key order, read from the raw
// database.
void ForEachRawRow(const std::string& path,
                   const std::function<void(const std::string&, const std::string&)>& fn) {
  WithRawDb(path, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != "rows") continue;
      std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        fn(it->key().ToString(), it->value().ToString());
      }
    }
  });
}

// The epochs `id`'s rows are keyed in, read from the raw database.
std::set<uint64_t> RawRowEpochs(const std::string& path, absl::string_view id) {
  std::set<uint64_t> epochs;
  ForEachRawRow(path, [&](const std::string& key, const std::string&) {
    const uint64_t epoch = keys::RowKeyEpoch(key);
    const size_t id_at = epoch == 0 ? 0 : 8;
    if (key.compare(id_at, id.size() + 1, std::string(id) + '\0') == 0) epochs.insert(epoch);
  });
  return epochs;
}

// Many sources' commits, with memtables small enough to switch epochs many times: every
// row reads back where it was put, by scan, by point read and after a reopen, and the
// rows family holds keys of several epochs.
TEST_F(StoreTest, RowsOfManySourcesReadBackAcrossEpochs) {
  Open(/*sync=*/false, /*write_buffer_bytes=*/64 << 10);
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::map<std::string, std::map<Position, std::string>> want;
  for (int round = 0; round < 30; ++round) {
    for (const std::string& id : ids) {
      const Position first{static_cast<uint64_t>(100 + round), 0};
      for (Position p : CommitRows(store_.get(), id, first, 10, absl::StrCat("r", round))) {
        want[id][p] = absl::StrCat("r", round);
      }
    }
  }
  EXPECT_GT(store_->row_epoch(), 3u);
  for (const std::string& id : ids) {
    EXPECT_EQ(RowTags(store_.get(), id), want[id]) << id;
    absl::StatusOr<std::optional<std::string>> row = store_->GetRow(id, Position{105, 3});
    ASSERT_TRUE(row.ok()) << row.status();
    ASSERT_TRUE(row->has_value());
    EXPECT_EQ(row->value().substr(0, 3), "r5:");
    // A range inside one segment, and one across several.
    int n = 0;
    ASSERT_TRUE(store_->ScanRows(id, Position{103, 5}, Position{107, 2},
                                 [&](Position, absl::string_view) { return ++n, true; })
                    .ok());
    EXPECT_EQ(n, 5 + 3 * 10 + 3);
  }
  const uint64_t epoch = store_->row_epoch();
  Open(/*sync=*/false, 64 << 10);
  EXPECT_GE(store_->row_epoch(), epoch);  // never below an epoch a row is keyed in
  for (const std::string& id : ids) EXPECT_EQ(RowTags(store_.get(), id), want[id]) << id;
  store_.reset();
  EXPECT_GT(RawRowEpochs(path_, "a").size(), 3u);
}

// The rows family's rows in key order, as (source, tag) pairs, read from the raw database.
std::vector<std::pair<std::string, std::string>> RawRowsInKeyOrder(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  ForEachRawRow(path, [&](const std::string& key, const std::string& value) {
    const size_t id_at = keys::RowKeyEpoch(key) == 0 ? 0 : 8;
    out.emplace_back(key.substr(id_at, key.find('\0', id_at) - id_at),
                     value.substr(0, value.find(':')));
  });
  return out;
}

// Within one memtable epoch, interleaved sources' commits key their rows in commit order
// (each insert lands at the end of the memtable); a source committing alone keeps one
// epoch; an interleaved source takes at most kCommitOrdersPerSource epochs, and all of
// its rows read back wherever they are keyed.
TEST_F(StoreTest, InterleavedCommitsKeyTheirRowsInCommitOrder) {
  Open(/*sync=*/false);
  const uint64_t memtable_epoch = store_->row_epoch();
  std::vector<std::pair<std::string, std::string>> committed;
  auto commit = [&](const std::string& id, uint64_t block, const std::string& tag) {
    for (Position p : CommitRows(store_.get(), id, Position{block, 0}, 10, tag)) {
      (void)p;
      committed.emplace_back(id, tag);
    }
  };
  commit("b", 1, "b1");
  commit("a", 1, "a1");
  commit("b", 2, "b2");
  commit("a", 2, "a2");
  commit("a", 3, "a3");  // follows its own commit: the same epoch as a2
  commit("a", 4, "a4");
  commit("b", 3, "b3");
  store_.reset();
  EXPECT_EQ(RawRowsInKeyOrder(path_), committed);
  EXPECT_EQ(RawRowEpochs(path_, "a").size(), 2u);
  EXPECT_EQ(RawRowEpochs(path_, "b").size(), 3u);

  // Past kCommitOrdersPerSource interleaved commits, a source keeps its last epoch.
  Open(/*sync=*/false);
  EXPECT_GT(store_->row_epoch(), memtable_epoch);  // above every epoch keyed so far
  const uint64_t reopened_epoch = store_->row_epoch();
  std::map<Position, std::string> want_a = RowTags(store_.get(), "a");
  for (int round = 0; round < 2 * kCommitOrdersPerSource; ++round) {
    const uint64_t block = 10 + round;
    for (Position p : CommitRows(store_.get(), "a", Position{block, 0}, 10, "x")) want_a[p] = "x";
    CommitRows(store_.get(), "b", Position{block, 0}, 10, "y");
  }
  ASSERT_EQ(store_->row_epoch(), reopened_epoch);  // one memtable epoch throughout
  EXPECT_EQ(RowTags(store_.get(), "a"), want_a);
  store_.reset();
  EXPECT_EQ(RawRowEpochs(path_, "a").size(), 2u + kCommitOrdersPerSource);
}

// A correction below rows of an older epoch overwrites and deletes them where they are;
// a row put below the source's first row (a hold resolved late) is found too.
TEST_F(StoreTest, CorrectionsAndLateRowsBelowOlderEpochs) {
  Open(/*sync=*/false, /*write_buffer_bytes=*/64 << 10);
  CommitRows(store_.get(), "s", Position{10, 0}, 30, "old");  // blocks 10-12
  // Other sources' rows move the epoch on.
  const uint64_t before = store_->row_epoch();
  for (int i = 0; store_->row_epoch() == before && i < 100; ++i) {
    CommitRows(store_.get(), "other", Position{static_cast<uint64_t>(i), 0}, 10, "x");
  }
  ASSERT_GT(store_->row_epoch(), before);
  // Rewind to block 11: its rows and block 12's are deleted, block 11 written anew.
  std::vector<Position> orphans;
  for (uint64_t b = 11; b <= 12; ++b) {
    for (uint64_t l = 0; l < 10; ++l) orphans.push_back(Position{b, l});
  }
  CommitRows(store_.get(), "s", Position{11, 0}, 10, "new", orphans);
  // A late row below everything, then new rows above.
  CommitRows(store_.get(), "s", Position{5, 7}, 1, "late");
  CommitRows(store_.get(), "s", Position{20, 0}, 10, "next");
  std::map<Position, std::string> want;
  for (uint64_t l = 0; l < 10; ++l) {
    want[Position{10, l}] = "old";
    want[Position{11, l}] = "new";
    want[Position{20, l}] = "next";
  }
  want[Position{5, 7}] = "late";
  EXPECT_EQ(RowTags(store_.get(), "s"), want);
  absl::StatusOr<std::optional<std::string>> gone = store_->GetRow("s", Position{12, 4});
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  absl::StatusOr<std::optional<std::string>> late = store_->GetRow("s", Position{5, 7});
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE(late->has_value());
  EXPECT_EQ(late->value().substr(0, 5), "late:");
  // Deleting the source removes the rows of every epoch.
  ASSERT_TRUE(store_->DeleteSource("s").ok());
  EXPECT_TRUE(RowTags(store_.get(), "s").empty());
  store_.reset();
  EXPECT_TRUE(RawRowEpochs(path_, "s").empty());
}

// A database of schema 3 (rows keyed by source and position alone) opens as epoch 0:
// its rows read, a correction among them stays among them, new rows take new epochs.
TEST_F(StoreTest, RowsOfSchemaThreeReadAsEpochZero) {
  Open();
  Seed("s");
  store_.reset();
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    handoff::v1::Source source;
    source.mutable_spec()->set_id("s");
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "rows") {
        for (uint64_t l = 0; l < 10; ++l) {
          ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i],
                              keys::Positional("s", Position{7, l}), "v3:row")
                          .ok());
        }
      } else if (names[i] == "meta") {
        ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], "schema_version", "3").ok());
      } else if (names[i] == "sources") {
        ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], "s", source.SerializeAsString())
                        .ok());
      }
    }
  });
  Open(/*sync=*/true, 64 << 10);
  EXPECT_EQ(RowTags(store_.get(), "s").size(), 10u);
  // Block 7 from index 5 rewritten, index 8-9 deleted; then new rows.
  CommitRows(store_.get(), "s", Position{7, 5}, 3, "fix",
             {Position{7, 5}, Position{7, 6}, Position{7, 7}, Position{7, 8}, Position{7, 9}});
  CommitRows(store_.get(), "s", Position{8, 0}, 10, "new");
  std::map<Position, std::string> tags = RowTags(store_.get(), "s");
  ASSERT_EQ(tags.size(), 18u);
  EXPECT_EQ(tags[(Position{7, 4})], "v3");
  EXPECT_EQ(tags[(Position{7, 6})], "fix");
  EXPECT_EQ(tags.count(Position{7, 9}), 0u);
  EXPECT_EQ(tags[(Position{8, 3})], "new");
  store_.reset();
  const std::set<uint64_t> epochs = RawRowEpochs(path_, "s");
  EXPECT_EQ(epochs.count(0), 1u);   // the old rows and the fix, where they were
  EXPECT_EQ(epochs.size(), 2u);     // and the new rows' epoch
}

// ---- Sources: delete and reset ----

void FillSource(Store* store, absl::string_view id) {
  ASSERT_TRUE(store->ResetSource(id, Fresh("c0"), Fresh("")).ok());
  handoff::v1::Source source;
  source.mutable_spec()->set_id(std::string(id));
  ASSERT_TRUE(store->PutSource(source).ok());
  std::unique_ptr<StepBatch> step = BigStep(store, id, 20);
  handoff::v1::QuarantineRecord q;
  q.set_source_id(std::string(id));
  step->PutQuarantine(Stage::kIngest, Position{1000, 1}, q);
  step->PutHold(Stage::kIngest, Position{1000, 2}, HoldAt(id, Position{1000, 2}));
  step->PutReceipt(Stage::kDelivery, Position{kMax, kMax}, Receipt(Position{kMax, kMax}));
  Fence fence;
  fence.expected_version = 0;
  ASSERT_TRUE(store->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}).ok());
}

// Every key of every source in the holds, quarantine and receipts families, by source.
std::map<std::string, int> KeysBySource(Store* store) {
  std::map<std::string, int> out;
  for (StagedFamily f : {StagedFamily::kHolds, StagedFamily::kQuarantine, StagedFamily::kReceipts}) {
    EXPECT_TRUE(store
                    ->ScanAll(f, "",
                              [&](absl::string_view key, absl::string_view) {
                                ++out[std::string(key.substr(0, key.find('\0')))];
                                return true;
                              })
                    .ok());
  }
  return out;
}

TEST_F(StoreTest, DeleteSourceRemovesOnlyThatSource) {
  Open();
  for (const char* id : {"a", "a-b", "a0", "b"}) FillSource(store_.get(), id);
  const std::map<std::string, int> before = KeysBySource(store_.get());
  ASSERT_EQ(before.size(), 4u);

  ASSERT_TRUE(store_->DeleteSource("a").ok());
  Reopen();
  EXPECT_EQ(store_->GetSource("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LoadCheckpoint("a", Stage::kIngest).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LoadCheckpoint("a", Stage::kDelivery).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CountRows(store_.get(), "a"), 0);
  EXPECT_EQ(CountOutbox(store_.get(), "a"), 0);
  std::map<std::string, int> after = KeysBySource(store_.get());
  EXPECT_EQ(after.count("a"), 0u);
  for (const char* id : {"a-b", "a0", "b"}) {
    EXPECT_EQ(after[id], before.at(id)) << id;
    EXPECT_EQ(CountRows(store_.get(), id), 20) << id;
    EXPECT_EQ(CountOutbox(store_.get(), id), 20) << id;
    EXPECT_TRUE(store_->GetSource(id).ok()) << id;
    EXPECT_TRUE(store_->LoadCheckpoint(id, Stage::kDelivery).ok()) << id;
  }
  absl::StatusOr<std::vector<handoff::v1::Source>> listed = store_->ListSources("", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].spec().id(), "a-b");
}

// A range tombstone in a bottommost file makes RocksDB rewrite that whole file to drop
// it, so resetting a source writes range deletions only where it has keys.
TEST_F(StoreTest, RangeDeletionsOnlyWhereTheSourceHasKeys) {
  Open();
  ASSERT_TRUE(store_->ResetSource("fresh", Fresh("c0"), Fresh("")).ok());  // nothing stored
  FillSource(store_.get(), "full");  // its first reset found nothing either
  ASSERT_EQ(CountRows(store_.get(), "full"), 20);
  ASSERT_TRUE(store_->ResetSource("full", Fresh("c0"), Fresh("")).ok());
  EXPECT_EQ(CountRows(store_.get(), "full"), 0);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "full", Stage::kIngest), 0);
  store_.reset();
  WithRawDb(path_, [](rocksdb::DB* db, const std::vector<std::string>& names,
                      const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    std::map<std::string, uint64_t> tombstones;
    for (size_t i = 0; i < names.size(); ++i) {
      rocksdb::TablePropertiesCollection props;
      ASSERT_TRUE(db->GetPropertiesOfAllTables(handles[i], &props).ok());
      for (const auto& [file, p] : props) tombstones[names[i]] += p->num_range_deletions;
    }
    EXPECT_EQ(tombstones["rows"], 1u);  // the second reset of "full" only
    EXPECT_EQ(tombstones["holds"], 1u);
    EXPECT_EQ(tombstones["receipts"], 1u);
    EXPECT_EQ(tombstones["quarantine"], 1u);
    EXPECT_EQ(tombstones["outbox"], 1u);
  });
}

TEST_F(StoreTest, ResetSourceFencesOutOldAttempts) {
  Open();
  FillSource(store_.get(), "s");
  ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c1").ok());
  ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c1", 1, "c2").ok());  // v2

  ASSERT_TRUE(store_->ResetSource("s", Fresh("100"), Fresh("")).ok());
  CheckpointRecord ingest = Checkpoint("s");
  EXPECT_GT(ingest.version(), 2u);
  EXPECT_EQ(ingest.resume_cursor(), "100");
  EXPECT_GT(Checkpoint("s", Stage::kDelivery).version(), 2u);
  EXPECT_EQ(CountRows(store_.get(), "s"), 0);
  EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "s", Stage::kIngest), 0);

  // An attempt that loaded version 2 before the reset is fenced out.
  std::unique_ptr<StepBatch> stale = BigStep(store_.get(), "s", 5);
  Fence fence;
  fence.expected_version = 2;
  EXPECT_EQ(store_->CommitStep(Stage::kIngest, stale.get(), fence, CheckpointUpdate{}).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(CountRows(store_.get(), "s"), 0);

  // A requested version above the old one is kept.
  ASSERT_TRUE(store_->ResetSource("s", Fresh("100", 50), std::nullopt).ok());
  EXPECT_EQ(Checkpoint("s").version(), 50u);
  EXPECT_EQ(store_->LoadCheckpoint("s", Stage::kDelivery).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, RecreatedSourceFencesOutAttemptsOfTheDeletedOne) {
  Open();
  FillSource(store_.get(), "s");
  ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c1").ok());  // v1
  ASSERT_TRUE(store_->DeleteSource("s").ok());
  Reopen();
  ASSERT_TRUE(store_->ResetSource("s", Fresh("c0"), std::nullopt).ok());
  EXPECT_GT(Checkpoint("s").version(), 1u);
  // An attempt of the deleted source (version 1, or 0 before its CAS) cannot commit.
  for (uint64_t old : {0, 1}) {
    std::unique_ptr<StepBatch> stale = BigStep(store_.get(), "s", 3);
    Fence fence;
    fence.expected_version = old;
    EXPECT_EQ(store_->CommitStep(Stage::kIngest, stale.get(), fence, CheckpointUpdate{}).status().code(),
              absl::StatusCode::kAborted);
  }
  EXPECT_EQ(CountRows(store_.get(), "s"), 0);
}

// ---- Storage failures (FaultInjectionFs) ----

class StoreFaultTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    UseFaultInjection();
    Open();
    Seed("s");
    ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c0", 0, "c1").ok());  // v1
  }

  void Arm(uint32_t ops, FaultInjectionFs::Error error, uint64_t after = 0,
           const std::string& suffix = ".log") {
    FaultInjectionFs::Fault fault;
    fault.ops = ops;
    fault.error = error;
    fault.after = after;
    fault.file_suffix = suffix;
    fs_->Arm(fault);
  }

  // With `deferred`, the commit does not wait for its sync (CommitStep's ticket).
  absl::Status CommitBigStep(int rows = 300, SyncTicket* deferred = nullptr) {
    std::unique_ptr<StepBatch> step = BigStep(store_.get(), "s", rows);
    const int ops = step->count();
    Fence fence;
    fence.expected_version = 1;
    fence.barrier = Fence::Barrier{"c1", "c2"};
    CheckpointUpdate update;
    update.applied = Position{2000, 0};
    absl::Status s =
        store_->CommitStep(Stage::kIngest, step.get(), fence, update, deferred).status();
    if (!s.ok()) {
      EXPECT_EQ(step->count(), ops) << "a failed commit must leave the step as built";
    }
    return s;
  }

  // A deferred step of 100 rows of `id` from checkpoint version v (cursor c<v>).
  absl::Status CommitDeferred(uint64_t v, SyncTicket* ticket, absl::string_view id = "s",
                              int rows = 100) {
    std::unique_ptr<StepBatch> step = BigStep(store_.get(), id, rows, 1000 * (v + 2));
    Fence fence;
    fence.expected_version = v;
    fence.barrier = Fence::Barrier{absl::StrCat("c", v), absl::StrCat("c", v + 1)};
    return store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}, ticket)
        .status();
  }

  // Power loss: nothing more reaches the disk, unsynced bytes vanish; then a reopen.
  void PowerLossThenReopen() {
    fs_->Deactivate();
    store_.reset();
    ASSERT_OK(fs_->DropUnsyncedData());
    fs_->Reactivate();
    Open();
  }

  // After a failed write: sticky refusal, then nothing of the step after reopen.
  // `visible_version`: the checkpoint version reads see before the reopen (a deferred
  // commit whose sync failed is in the memtable until then).
  void ExpectRefusedThenUnchanged(bool drop_unsynced, uint64_t visible_version = 1) {
    EXPECT_EQ(store_->health().code(), absl::StatusCode::kUnavailable);
    absl::Status again = CommitBigStep(1);
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_TRUE(absl::StrContains(again.message(), "earlier write failure")) << again;
    handoff::v1::Source source;
    source.mutable_spec()->set_id("t");
    EXPECT_EQ(store_->PutSource(source).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(store_->CompareAndSwap("s", Stage::kIngest, "c1", 1, "c2").status().code(),
              absl::StatusCode::kFailedPrecondition);
    // Nor does a flush (shutdown's) write what the failure left unknown.
    EXPECT_EQ(store_->Flush().code(), absl::StatusCode::kFailedPrecondition);
    // Reads still work.
    EXPECT_EQ(Checkpoint("s").version(), visible_version);

    // Close with the fault still armed (nothing more reaches the disk), then reopen.
    store_.reset();
    if (drop_unsynced) ASSERT_OK(fs_->DropUnsyncedData());
    fs_->Disarm();
    Open();
    EXPECT_TRUE(store_->health().ok());
    CheckpointRecord cp = Checkpoint("s");
    EXPECT_EQ(cp.version(), 1u);
    EXPECT_EQ(cp.resume_cursor(), "c1");
    EXPECT_FALSE(cp.has_applied());
    EXPECT_EQ(CountRows(store_.get(), "s"), 0);
    EXPECT_EQ(CountOutbox(store_.get(), "s"), 0);
    EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kReceipts, "s", Stage::kIngest), 0);
    EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kHolds, "s", Stage::kDelivery), 0);
    // Writable again after the reopen.
    EXPECT_TRUE(CommitBigStep(10).ok());
  }
};

TEST_F(StoreFaultTest, WalAppendFailureIsUnavailableAndWritesNothing) {
  Arm(FaultInjectionFs::kAppend, FaultInjectionFs::Error::kIoError);
  absl::Status s = CommitBigStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "commit step of s")) << s;
  EXPECT_GE(fs_->injected(), 1u);
  ExpectRefusedThenUnchanged(/*drop_unsynced=*/false);
}

TEST_F(StoreFaultTest, WalSyncFailureIsUnavailableAndLostOnPowerLoss) {
  Arm(FaultInjectionFs::kSync, FaultInjectionFs::Error::kIoError);
  absl::Status s = CommitBigStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // The record reached the file but not the disk: its fate is unknown until the next
  // crash. A power loss now drops it; the store never reported it committed.
  EXPECT_GT(fs_->unsynced_bytes(), 0u);
  ExpectRefusedThenUnchanged(/*drop_unsynced=*/true);
}

// Without a power loss the synced-or-not record may come back on reopen: UNAVAILABLE
// means "outcome unknown", never "partly written". The step is all there or none of it.
TEST_F(StoreFaultTest, WalSyncFailureOutcomeIsAllOrNothingAfterReopen) {
  Arm(FaultInjectionFs::kSync, FaultInjectionFs::Error::kIoError);
  EXPECT_EQ(CommitBigStep().code(), absl::StatusCode::kUnavailable);
  store_.reset();
  fs_->Disarm();
  Open();
  const CheckpointRecord cp = Checkpoint("s");
  const int rows = CountRows(store_.get(), "s");
  if (cp.version() == 1u) {
    EXPECT_EQ(cp.resume_cursor(), "c1");
    EXPECT_EQ(rows, 0);
  } else {
    EXPECT_EQ(cp.version(), 2u);
    EXPECT_EQ(cp.resume_cursor(), "c2");
    EXPECT_EQ(rows, 300);
    EXPECT_EQ(CountStaged(store_.get(), StagedFamily::kReceipts, "s", Stage::kIngest), 300);
  }
}

TEST_F(StoreFaultTest, DiskFullIsUnavailableAndWritesNothing) {
  Arm(FaultInjectionFs::kAppend | FaultInjectionFs::kSync | FaultInjectionFs::kCreate,
      FaultInjectionFs::Error::kNoSpace, 0, "");
  absl::Status s = CommitBigStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No space")) << s;
  ExpectRefusedThenUnchanged(/*drop_unsynced=*/false);
}

TEST_F(StoreFaultTest, FailureAfterSuccessfulAppendsKeepsTheEarlierCommits) {
  // Two more WAL appends succeed, the third fails: two commits, then a failure.
  Arm(FaultInjectionFs::kAppend, FaultInjectionFs::Error::kIoError, /*after=*/2);
  std::string cursor = "c1";
  uint64_t version = 1;
  absl::Status s;
  int committed = 0;
  for (; committed < 5; ++committed) {
    const std::string next = absl::StrCat("n", committed);
    s = store_->CompareAndSwap("s", Stage::kIngest, cursor, version, next).status();
    if (!s.ok()) break;
    cursor = next;
    ++version;
  }
  EXPECT_EQ(committed, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  store_.reset();
  fs_->Disarm();
  ASSERT_OK(fs_->DropUnsyncedData());
  Open();
  EXPECT_EQ(Checkpoint("s").version(), version);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), cursor);
}

TEST_F(StoreFaultTest, FileCreationFailureStopsWritesAndKeepsCommittedSteps) {
  // A small memtable fills up: the next write must switch to a new WAL file, and
  // creating it fails.
  store_.reset();
  Open(/*sync=*/true, /*write_buffer_bytes=*/64 << 10);
  Arm(FaultInjectionFs::kCreate, FaultInjectionFs::Error::kIoError);
  std::string cursor = "c1";
  uint64_t version = 1;
  absl::Status s;
  int committed = 0;
  for (; committed < 20; ++committed) {
    std::unique_ptr<StepBatch> step =
        BigStep(store_.get(), "s", 200, 10000 * static_cast<uint64_t>(committed + 1));
    Fence fence;
    fence.expected_version = version;
    const std::string next = absl::StrCat("n", committed);
    fence.barrier = Fence::Barrier{cursor, next};
    s = store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}).status();
    if (!s.ok()) break;
    cursor = next;
    ++version;
  }
  ASSERT_LT(committed, 20) << "no file was created";
  EXPECT_GE(committed, 1);
  // Met by the write (UNAVAILABLE), or reported by RocksDB's memtable switch before it
  // (the write refused: FAILED_PRECONDITION); the failure named either way.
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "fault injection: create")) << s;
  EXPECT_EQ(CommitBigStep(1).code(), absl::StatusCode::kFailedPrecondition);
  store_.reset();
  fs_->Disarm();
  Open();
  EXPECT_EQ(Checkpoint("s").version(), version);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), cursor);
  EXPECT_EQ(CountRows(store_.get(), "s"), committed * 200);
}

// A background flush that fails (its table file cannot be created) is the store's
// failure at once, before any write meets it: a store whose sources are caught up may
// not write for hours. Before: health() stayed OK until the next write.
TEST_F(StoreFaultTest, ABackgroundFlushFailureIsReportedBeforeAnyWriteMeetsIt) {
  store_.reset();
  Open(/*sync=*/true, /*write_buffer_bytes=*/64 << 10);
  Arm(FaultInjectionFs::kCreate, FaultInjectionFs::Error::kIoError, 0, ".sst");
  // More rows than the epoch's share of the write buffer: the commit switches the
  // rows' memtable, whose flush runs in the background.
  ASSERT_OK(CommitBigStep(300));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (store_->health().ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));  // polls a condition, with a deadline
  }
  const absl::Status health = store_->health();
  EXPECT_FALSE(health.ok()) << "no write met the failure, yet it is the store's";
  EXPECT_TRUE(absl::StrContains(health.message(), "background flush")) << health;
  EXPECT_EQ(CommitBigStep(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Flush().code(), absl::StatusCode::kFailedPrecondition);
  // The commit was synced: a reopen has it.
  store_.reset();
  fs_->Disarm();
  Open();
  EXPECT_TRUE(store_->health().ok());
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(CountRows(store_.get(), "s"), 300);
}

TEST_F(StoreFaultTest, DeferredCommitIsVisibleAtOnceAndSurvivesPowerLossOnceAwaited) {
  SyncTicket ticket;
  ASSERT_OK(CommitBigStep(300, &ticket));
  EXPECT_GT(ticket.value, 0u);
  // Visible to the process's reads (and fences) before it is synced.
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(store_->CompareAndSwap("s", Stage::kIngest, "c1", 1, "x").status().code(),
            absl::StatusCode::kAborted);
  ASSERT_OK(store_->AwaitSynced(ticket));
  PowerLossThenReopen();
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), "c2");
  EXPECT_EQ(CountRows(store_.get(), "s"), 300);
}

// A step that rewrites outbox entries the delivery stage has passed (a correction) fences
// and rewinds that stage, which then rereads them at once: no reader caps it below them,
// as new entries are capped by the published (synced) ingest position. So the step is
// written synced even when asked to defer: read, it survives a power loss. Before: it
// was written unsynced, a sink could be sent 102:0 and the power loss drop it.
TEST_F(StoreFaultTest, AStepThatFencesTheDeliveryStageIsNeverDeferred) {
  CheckpointRecord delivered = Fresh("");
  delivered.set_has_applied(true);
  delivered.set_applied_block(105);
  delivered.set_applied_log_index(0);
  ASSERT_OK(store_->ResetSource("s", Fresh("c1", 1), delivered));
  const uint64_t version = Checkpoint("s").version();
  auto commit = [&](Position entry, SyncTicket* ticket) {
    std::unique_ptr<StepBatch> step = store_->NewStep("s");
    step->PutOutbox(entry, RowBytes(entry));
    Fence fence;
    fence.any_version = true;
    return store_->CommitStep(Stage::kIngest, step.get(), fence, CheckpointUpdate{}, ticket)
        .status();
  };
  // New entries above what was delivered: deferred as asked.
  SyncTicket above;
  ASSERT_OK(commit(Position{110, 0}, &above));
  EXPECT_GT(above.value, 0u);
  ASSERT_OK(store_->AwaitSynced(above));
  // An entry the delivery stage passed: fenced, and synced before CommitStep returns.
  SyncTicket fencing{12345};
  ASSERT_OK(commit(Position{102, 0}, &fencing));
  EXPECT_EQ(fencing.value, 0u) << "nothing to wait for: already durable";
  EXPECT_EQ(Checkpoint("s", Stage::kDelivery).applied_block(), 101u);
  PowerLossThenReopen();
  EXPECT_EQ(CountOutbox(store_.get(), "s"), 2);
  EXPECT_EQ(Checkpoint("s", Stage::kDelivery).applied_block(), 101u);
  EXPECT_GE(Checkpoint("s").version(), version);
}

TEST_F(StoreFaultTest, DeferredCommitWhoseSyncFailsFailsTheStoreAndIsLostOnPowerLoss) {
  Arm(FaultInjectionFs::kSync, FaultInjectionFs::Error::kIoError);
  SyncTicket ticket;
  // The write itself succeeds; its sync, in the background, does not.
  ASSERT_OK(CommitBigStep(300, &ticket));
  absl::Status synced = store_->AwaitSynced(ticket);
  EXPECT_EQ(synced.code(), absl::StatusCode::kUnavailable) << synced;
  EXPECT_TRUE(absl::StrContains(synced.message(), "WAL sync")) << synced;
  EXPECT_GT(fs_->unsynced_bytes(), 0u);
  // Sticky, exactly as a synced commit's failure: no write goes on top of it.
  EXPECT_EQ(store_->AwaitSynced(ticket).code(), absl::StatusCode::kUnavailable);
  // The store refuses writes; a power loss drops the unsynced step, all of it.
  ExpectRefusedThenUnchanged(/*drop_unsynced=*/true, /*visible_version=*/2);
}

// After the first sync (RocksDB's SyncWAL) the WalSyncer syncs the live WAL through a
// handle of its own, while writes go on; what it covered survives a power loss, and a
// WAL switch sends the next sync back through RocksDB, which syncs the older WAL too.
TEST_F(StoreFaultTest, DeferredCommitsSyncedThroughTheLiveWalsHandleSurvivePowerLoss) {
  SyncTicket ticket;
  ASSERT_OK(CommitBigStep(300, &ticket));  // v2
  ASSERT_OK(store_->AwaitSynced(ticket));
  EXPECT_EQ(store_->wal_sync_stats().by_rocksdb, 1u);
  EXPECT_EQ(store_->wal_sync_stats().by_handle, 0u);
  for (uint64_t v = 2; v < 5; ++v) {
    ASSERT_OK(CommitDeferred(v, &ticket));
    ASSERT_OK(store_->AwaitSynced(ticket));
  }
  EXPECT_EQ(store_->wal_sync_stats().by_rocksdb, 1u);
  EXPECT_GE(store_->wal_sync_stats().by_handle, 3u);
  // A WAL switch (the memtables flushed), then a write to the new WAL: RocksDB again.
  ASSERT_OK(store_->Flush());
  ASSERT_OK(CommitDeferred(5, &ticket));
  ASSERT_OK(store_->AwaitSynced(ticket));
  EXPECT_EQ(store_->wal_sync_stats().by_rocksdb, 2u);
  ASSERT_OK(CommitDeferred(6, &ticket));  // the new WAL's handle
  ASSERT_OK(store_->AwaitSynced(ticket));
  PowerLossThenReopen();
  EXPECT_EQ(Checkpoint("s").version(), 7u);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), "c7");
  EXPECT_EQ(CountRows(store_.get(), "s"), 300 + 5 * 100);
}

// A failed sync through the handle fails the store like any failed sync: the ticket
// fails, writes are refused, and a power loss drops the step it did not cover.
TEST_F(StoreFaultTest, FailedSyncThroughTheLiveWalsHandleFailsTheStore) {
  SyncTicket ticket;
  ASSERT_OK(CommitBigStep(300, &ticket));  // v2, synced by RocksDB: the handle opens
  ASSERT_OK(store_->AwaitSynced(ticket));
  const Store::WalSyncStats before = store_->wal_sync_stats();
  Arm(FaultInjectionFs::kSync, FaultInjectionFs::Error::kIoError);
  ASSERT_OK(CommitDeferred(2, &ticket));
  absl::Status synced = store_->AwaitSynced(ticket);
  EXPECT_EQ(synced.code(), absl::StatusCode::kUnavailable) << synced;
  EXPECT_EQ(store_->wal_sync_stats().by_handle, before.by_handle + 1);
  EXPECT_EQ(store_->wal_sync_stats().by_rocksdb, before.by_rocksdb);
  EXPECT_EQ(store_->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CommitDeferred(3, &ticket).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GT(fs_->unsynced_bytes(), 0u);
  PowerLossThenReopen();
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(CountRows(store_.get(), "s"), 300);
}

// Writers whose WAL appends start failing while the WalSyncer syncs concurrently: the
// process survives (RocksDB's writer is never synced after its own append failed), and
// every commit whose sync was awaited is there after a power loss.
TEST_F(StoreFaultTest, AppendFailuresRacingSyncsLoseNoAwaitedCommit) {
  // Rounds, because the race is the point: with RocksDB's SyncWAL unfenced from the
  // writes, about one round in twenty aborted on RocksDB's assertion.
  constexpr int kRounds = 20;
  constexpr int kWriters = 4;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    auto id = [round](int w) { return absl::StrCat("r", round, "w", w); };
    for (int w = 0; w < kWriters; ++w) Seed(id(w));
    Arm(FaultInjectionFs::kAppend, FaultInjectionFs::Error::kIoError, /*after=*/100);
    std::vector<uint64_t> awaited(kWriters, 0);
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        for (uint64_t v = 0; v < 1000; ++v) {
          SyncTicket ticket;
          if (!CommitDeferred(v, &ticket, id(w), /*rows=*/4).ok() ||
              !store_->AwaitSynced(ticket).ok()) {
            return;
          }
          awaited[w] = v + 1;
        }
      });
    }
    for (std::thread& t : writers) t.join();
    EXPECT_FALSE(store_->health().ok());
    EXPECT_GT(store_->wal_sync_stats().by_handle, 0u);
    fs_->Disarm();
    PowerLossThenReopen();
    for (int w = 0; w < kWriters; ++w) {
      EXPECT_GE(Checkpoint(id(w)).version(), awaited[w]) << w;
    }
  }
}

TEST_F(StoreFaultTest, SyncedCommitsSurvivePowerLossUnsyncedOnesDoNot) {
  // Synced (the default): survives.
  ASSERT_TRUE(CommitBigStep(50).ok());  // v2, cursor c2
  PowerLossThenReopen();
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(CountRows(store_.get(), "s"), 50);

  // Not synced: lost with the power, and the database still opens at the synced state.
  store_.reset();
  Open(/*sync=*/false);
  ASSERT_TRUE(store_->CompareAndSwap("s", Stage::kIngest, "c2", 2, "c3").ok());
  EXPECT_GT(fs_->unsynced_bytes(), 0u);
  PowerLossThenReopen();
  EXPECT_EQ(Checkpoint("s").version(), 2u);
  EXPECT_EQ(Checkpoint("s").resume_cursor(), "c2");
  EXPECT_EQ(CountRows(store_.get(), "s"), 50);
}

}  // namespace
}  // namespace handoff::store
