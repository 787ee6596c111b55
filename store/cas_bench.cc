// cas_bench: measures the store's fencing (per-source mutex + read-check-write in one
// WriteBatch) against the same read-check-write done with RocksDB transactions
// (pessimistic TransactionDB with GetForUpdate, and OptimisticTransactionDB).
//
//   bazel run -c opt //store:cas_bench -- [--dir=/path] [--quick]
//
// Workloads, each with WAL sync on and off:
//   cas       the page barrier alone: (cursor, version) -> (next, version + 1)
//   step1000  a fenced commit of a 1000-row step (rows built inside the timed loop for
//             every variant, from pre-serialized bytes)
//   race4     4 threads CAS the same source from the same (cursor, version); the
//             loser's abort counts as an operation (it is what a stale attempt costs)
// Prints microseconds per operation (mean, p50, p99) and operations per second.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/utilities/optimistic_transaction_db.h"
#include "rocksdb/utilities/transaction.h"
#include "rocksdb/utilities/transaction_db.h"
#include "store/keys.h"
#include "store/records.pb.h"
#include "store/store.h"

namespace handoff::store {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::vector<double> micros;  // per operation
  double wall_seconds = 0;
  int aborted = 0;
};

void Print(const std::string& name, Result r) {
  std::sort(r.micros.begin(), r.micros.end());
  double sum = 0;
  for (double m : r.micros) sum += m;
  const size_t n = r.micros.size();
  std::printf("%-42s %6zu ops  mean %9.1f us  p50 %9.1f us  p99 %9.1f us  %9.0f ops/s",
              name.c_str(), n, sum / n, r.micros[n / 2], r.micros[std::min(n - 1, n * 99 / 100)],
              n / r.wall_seconds);
  if (r.aborted > 0) std::printf("  (%d aborted)", r.aborted);
  std::printf("\n");
  std::fflush(stdout);
}

std::vector<std::string> RowPayloads(int n) {
  std::vector<std::string> rows;
  for (int i = 0; i < n; ++i) {
    handoff::v1::EventRow row;
    row.set_block_number(1000 + i / 4);
    row.set_log_index(i % 4);
    row.set_block_hash(std::string(66, 'b'));
    row.set_address(std::string(42, 'a'));
    row.add_topics(std::string(66, 't'));
    row.add_topics(std::string(66, 'u'));
    row.set_data(std::string(130, 'd'));
    row.set_transaction_hash(std::string(66, 'h'));
    rows.push_back(row.SerializeAsString());
  }
  return rows;
}

// ---- The fencing under test, behind one interface ----

class Fencer {
 public:
  virtual ~Fencer() = default;
  // Fenced commit of `rows` (may be empty) moving (cursor, version) to (next, version+1).
  // Returns OK, ABORTED when fenced out, or another error.
  virtual absl::Status Commit(const std::string& id, const std::string& cursor,
                              uint64_t version, const std::string& next,
                              const std::vector<std::string>* rows, uint64_t first_block) = 0;
  virtual absl::Status Seed(const std::string& id) = 0;
};

class StoreFencer : public Fencer {
 public:
  static std::unique_ptr<StoreFencer> Open(const std::string& dir, bool sync) {
    StoreOptions options;
    options.path = dir;
    options.sync = sync;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    if (!store.ok()) {
      std::fprintf(stderr, "open store: %s\n", store.status().ToString().c_str());
      std::exit(1);
    }
    auto f = std::make_unique<StoreFencer>();
    f->store_ = std::move(*store);
    return f;
  }
  absl::Status Seed(const std::string& id) override {
    CheckpointRecord r;
    r.set_resume_cursor("c");
    return store_->ResetSource(id, r, std::nullopt);
  }
  absl::Status Commit(const std::string& id, const std::string& cursor, uint64_t version,
                      const std::string& next, const std::vector<std::string>* rows,
                      uint64_t first_block) override {
    if (rows == nullptr) {
      return store_->CompareAndSwap(id, Stage::kIngest, cursor, version, next).status();
    }
    std::unique_ptr<StepBatch> step = store_->NewStep(id);
    for (size_t i = 0; i < rows->size(); ++i) {
      step->PutRow(Position{first_block + i / 4, i % 4}, (*rows)[i]);
    }
    Fence fence;
    fence.expected_version = version;
    fence.barrier = Fence::Barrier{cursor, next};
    CheckpointUpdate update;
    update.applied = Position{first_block + rows->size() / 4, 0};
    return store_->CommitStep(Stage::kIngest, step.get(), fence, update).status();
  }

 private:
  std::unique_ptr<Store> store_;
};

// The same read-check-write with a RocksDB transaction: GetForUpdate on the checkpoint,
// check (cursor, version), Put rows and the new checkpoint, Commit. Two column families
// (checkpoints, rows) with the store's keys and records.
class TxnFencer : public Fencer {
 public:
  enum Kind { kPessimistic, kOptimistic };

  static std::unique_ptr<TxnFencer> Open(const std::string& dir, bool sync, Kind kind) {
    auto f = std::make_unique<TxnFencer>();
    f->kind_ = kind;
    f->write_options_.sync = sync;
    rocksdb::Options options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    options.write_buffer_size = 64 << 20;
    options.compression = rocksdb::kLZ4Compression;
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(options)},
        {"checkpoints", rocksdb::ColumnFamilyOptions(options)},
        {"rows", rocksdb::ColumnFamilyOptions(options)},
    };
    rocksdb::Status s;
    if (kind == kPessimistic) {
      rocksdb::TransactionDB* db = nullptr;
      s = rocksdb::TransactionDB::Open(options, rocksdb::TransactionDBOptions(), dir, families,
                                       &f->handles_, &db);
      f->txn_db_.reset(db);
    } else {
      rocksdb::OptimisticTransactionDB* db = nullptr;
      s = rocksdb::OptimisticTransactionDB::Open(options, dir, families, &f->handles_, &db);
      f->opt_db_.reset(db);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "open txn db: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    return f;
  }
  ~TxnFencer() override {
    rocksdb::DB* db = txn_db_ ? static_cast<rocksdb::DB*>(txn_db_.get())
                              : static_cast<rocksdb::DB*>(opt_db_.get());
    for (auto* h : handles_) db->DestroyColumnFamilyHandle(h);
  }

  absl::Status Seed(const std::string& id) override {
    CheckpointRecord r;
    r.set_resume_cursor("c");
    rocksdb::DB* db = txn_db_ ? static_cast<rocksdb::DB*>(txn_db_.get())
                              : static_cast<rocksdb::DB*>(opt_db_.get());
    rocksdb::Status s = db->Put(write_options_, handles_[1], keys::Checkpoint(id, Stage::kIngest),
                                r.SerializeAsString());
    return s.ok() ? absl::OkStatus() : absl::InternalError(s.ToString());
  }

  absl::Status Commit(const std::string& id, const std::string& cursor, uint64_t version,
                      const std::string& next, const std::vector<std::string>* rows,
                      uint64_t first_block) override {
    std::unique_ptr<rocksdb::Transaction> txn(
        kind_ == kPessimistic ? txn_db_->BeginTransaction(write_options_)
                              : opt_db_->BeginTransaction(write_options_));
    const std::string key = keys::Checkpoint(id, Stage::kIngest);
    std::string value;
    rocksdb::Status s = txn->GetForUpdate(rocksdb::ReadOptions(), handles_[1], key, &value);
    if (s.IsBusy() || s.IsTimedOut()) return absl::AbortedError(s.ToString());
    if (!s.ok()) return absl::InternalError(s.ToString());
    CheckpointRecord record;
    if (!record.ParseFromString(value)) return absl::DataLossError("checkpoint");
    if (record.version() != version || record.resume_cursor() != cursor) {
      txn->Rollback().PermitUncheckedError();
      return absl::AbortedError("fenced out");
    }
    record.set_version(version + 1);
    record.set_resume_cursor(next);
    if (rows != nullptr) {
      for (size_t i = 0; i < rows->size(); ++i) {
        s = txn->Put(handles_[2], keys::Positional(id, Position{first_block + i / 4, i % 4}),
                     (*rows)[i]);
        if (!s.ok()) return absl::InternalError(s.ToString());
      }
      record.set_has_applied(true);
      record.set_applied_block(first_block + rows->size() / 4);
    }
    s = txn->Put(handles_[1], key, record.SerializeAsString());
    if (!s.ok()) return absl::InternalError(s.ToString());
    s = txn->Commit();
    if (s.IsBusy() || s.IsTimedOut()) return absl::AbortedError(s.ToString());
    return s.ok() ? absl::OkStatus() : absl::InternalError(s.ToString());
  }

 private:
  Kind kind_ = kPessimistic;
  rocksdb::WriteOptions write_options_;
  std::unique_ptr<rocksdb::TransactionDB> txn_db_;
  std::unique_ptr<rocksdb::OptimisticTransactionDB> opt_db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

// Sequential fenced commits on one source.
Result RunSequential(Fencer* f, int ops, const std::vector<std::string>* rows) {
  Result r;
  if (!f->Seed("src").ok()) std::exit(1);
  std::string cursor = "c";
  const auto start = Clock::now();
  for (int i = 0; i < ops; ++i) {
    const std::string next = absl::StrCat("c", i);
    const auto t0 = Clock::now();
    absl::Status s = f->Commit("src", cursor, i, next, rows, 1000 + 1000 * uint64_t(i));
    r.micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!s.ok()) {
      std::fprintf(stderr, "commit %d: %s\n", i, s.ToString().c_str());
      std::exit(1);
    }
    cursor = next;
  }
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// `threads` threads race the same (cursor, version) each round; one must win.
Result RunRace(Fencer* f, int rounds, int threads) {
  Result r;
  if (!f->Seed("src").ok()) std::exit(1);
  absl::Mutex mu;
  std::string cursor = "c";
  const auto start = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> ts;
    std::vector<absl::Status> results(threads);
    std::vector<double> micros(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const auto t0 = Clock::now();
        results[t] = f->Commit("src", cursor, round, absl::StrCat("r", round, "t", t), nullptr, 0);
        micros[t] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      });
    }
    for (auto& t : ts) t.join();
    int winners = 0;
    for (int t = 0; t < threads; ++t) {
      r.micros.push_back(micros[t]);
      if (results[t].ok()) {
        ++winners;
        cursor = absl::StrCat("r", round, "t", t);
      } else if (absl::IsAborted(results[t])) {
        ++r.aborted;
      } else {
        std::fprintf(stderr, "race: %s\n", results[t].ToString().c_str());
        std::exit(1);
      }
    }
    if (winners != 1) {
      std::fprintf(stderr, "round %d: %d winners\n", round, winners);
      std::exit(1);
    }
  }
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

int Main(int argc, char** argv) {
  std::string base;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::StartsWith(arg, "--dir=")) base = std::string(arg.substr(6));
    if (arg == "--quick") quick = true;
  }
  if (base.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    base = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/handoff_cas_bench");
  }
  std::filesystem::remove_all(base);
  // Each level of `base` (RocksDB creates only the last one of a path).
  for (size_t slash = base.find('/', 1);; slash = base.find('/', slash + 1)) {
    rocksdb::Env::Default()->CreateDirIfMissing(base.substr(0, slash)).PermitUncheckedError();
    if (slash == std::string::npos) break;
  }
  const std::vector<std::string> rows = RowPayloads(1000);
  int dir_seq = 0;
  auto dir = [&] { return absl::StrCat(base, "/db", dir_seq++); };

  using Factory = std::function<std::unique_ptr<Fencer>(const std::string&, bool)>;
  const std::vector<std::pair<std::string, Factory>> variants = {
      {"store (mutex+WriteBatch)",
       [](const std::string& d, bool sync) { return StoreFencer::Open(d, sync); }},
      {"TransactionDB",
       [](const std::string& d, bool sync) {
         return TxnFencer::Open(d, sync, TxnFencer::kPessimistic);
       }},
      {"OptimisticTransactionDB",
       [](const std::string& d, bool sync) {
         return TxnFencer::Open(d, sync, TxnFencer::kOptimistic);
       }},
  };
  const int scale = quick ? 10 : 1;
  for (bool sync : {true, false}) {
    const char* mode = sync ? "sync" : "nosync";
    for (const auto& [name, open] : variants) {
      auto f = open(dir(), sync);
      Print(absl::StrCat("cas      ", mode, " ", name),
            RunSequential(f.get(), (sync ? 500 : 20000) / scale, nullptr));
    }
    for (const auto& [name, open] : variants) {
      auto f = open(dir(), sync);
      Print(absl::StrCat("step1000 ", mode, " ", name),
            RunSequential(f.get(), (sync ? 200 : 500) / scale, &rows));
    }
    for (const auto& [name, open] : variants) {
      auto f = open(dir(), sync);
      Print(absl::StrCat("race4    ", mode, " ", name), RunRace(f.get(), (sync ? 200 : 1000) / scale, 4));
    }
  }
  std::filesystem::remove_all(base);
  return 0;
}

}  // namespace
}  // namespace handoff::store

int main(int argc, char** argv) { return handoff::store::Main(argc, argv); }
