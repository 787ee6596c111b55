// FaultInjectionFs: a RocksDB FileSystem that fails writes on demand and can drop
// unsynced data, for crash-consistency tests of the store.
//
// Model (after LevelDB's and RocksDB's FaultInjectionTestEnv): every writable file the
// database creates is tracked with the bytes appended and the bytes covered by the last
// successful Sync/Fsync. A test
//  * arms a fault: the next Append, Sync/Fsync or file creation (optionally only after
//    N more successful ones, optionally only on files whose name ends with a suffix)
//    fails with an IOError or a NoSpace error (disk full), until disarmed or `times`
//    failures have been injected;
//  * simulates power loss: Deactivate() makes every mutating call fail (nothing more
//    reaches the disk), the test closes the database, DropUnsyncedData() truncates each
//    tracked file back to its last synced size, Reactivate() and the database reopens.
//
// RocksDB 7 routes all file I/O through env->GetFileSystem(), so an EnvWrapper's file
// overrides are bypassed; wrap this FileSystem into an Env instead:
//
//   auto fs = std::make_shared<FaultInjectionFs>();
//   std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
//   options.env = env.get();   // `fs` and `env` must outlive the database
//   ...
//   FaultInjectionFs::Fault fault;
//   fault.ops = FaultInjectionFs::kSync;   // every WAL, table and MANIFEST sync fails
//   fs->Arm(fault);
//
// Thread-safe: RocksDB's foreground and background threads call in concurrently with
// the test's Arm/Disarm.
#ifndef HANDOFF_STORE_FAULT_INJECTION_FS_H_
#define HANDOFF_STORE_FAULT_INJECTION_FS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/file_system.h"

namespace handoff::store {

class FaultInjectionFs : public rocksdb::FileSystemWrapper {
 public:
  // Operations a fault can hit (bit mask).
  enum Op : uint32_t {
    kAppend = 1 << 0,  // FSWritableFile::Append / PositionedAppend
    kSync = 1 << 1,    // FSWritableFile::Sync / Fsync
    kCreate = 1 << 2,  // NewWritableFile / ReopenWritableFile / ReuseWritableFile
  };
  enum class Error {
    kIoError,  // IOStatus::IOError: a failing device
    kNoSpace,  // IOStatus::NoSpace: disk full (an IOError with subcode kNoSpace)
  };
  struct Fault {
    uint32_t ops = kAppend;
    Error error = Error::kIoError;
    // Matching operations that still succeed before the first failure.
    uint64_t after = 0;
    // Failures to inject before the fault disarms itself; 0 means until Disarm().
    uint64_t times = 0;
    // Only files whose name ends with this ("" = all files): ".log" is the WAL,
    // ".sst" the tables.
    std::string file_suffix;
  };

  // Wraps rocksdb::FileSystem::Default().
  FaultInjectionFs();
  explicit FaultInjectionFs(const std::shared_ptr<rocksdb::FileSystem>& base);
  ~FaultInjectionFs() override;

  static const char* kClassName() { return "HandoffFaultInjectionFs"; }
  const char* Name() const override { return kClassName(); }

  // ---- Faults ----
  // Replaces any armed fault.
  void Arm(const Fault& fault) ABSL_LOCKS_EXCLUDED(mu_);
  void Disarm() ABSL_LOCKS_EXCLUDED(mu_);
  // Failures injected since construction (all faults, not counting Deactivate()).
  uint64_t injected() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Power loss ----
  // While inactive every Append, Sync, file creation, rename, delete and truncate fails
  // with an IOError and changes nothing on disk.
  void Deactivate() ABSL_LOCKS_EXCLUDED(mu_);
  void Reactivate() ABSL_LOCKS_EXCLUDED(mu_);
  // Truncates every tracked file that still exists to the size it had at its last
  // successful sync (0 if never synced). Call with the database closed.
  absl::Status DropUnsyncedData() ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes appended but not yet synced, over all tracked files.
  uint64_t unsynced_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- FileSystem overrides ----
  rocksdb::IOStatus NewWritableFile(const std::string& fname,
                                    const rocksdb::FileOptions& file_opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& file_opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& file_opts,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  // A handle that only syncs (its writes are refused): Store::SyncWal syncs the live
  // WAL through one while the database appends to it. Its syncs move the synced size
  // like the writer's own, to what was appended when the sync began.
  rocksdb::IOStatus NewRandomRWFile(const std::string& fname,
                                    const rocksdb::FileOptions& file_opts,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& target,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus Truncate(const std::string& fname, size_t size,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;

 private:
  class File;
  friend class File;
  class SyncHandle;
  friend class SyncHandle;

  struct FileState {
    uint64_t size = 0;    // bytes appended
    uint64_t synced = 0;  // bytes covered by the last successful sync
  };

  // OK, or the error to inject for `op` on `fname` (counts the operation).
  rocksdb::IOStatus MaybeFail(Op op, const std::string& fname) ABSL_LOCKS_EXCLUDED(mu_);
  rocksdb::IOStatus Inactive(absl::string_view what) const;
  bool active() const ABSL_LOCKS_EXCLUDED(mu_);
  // Starts tracking `fname` at `size` bytes, all of them synced.
  void Track(const std::string& fname, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // `offset` is File::kAtEnd for a plain append.
  void OnAppend(const std::string& fname, uint64_t offset, uint64_t n)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `sync` of `fname` unless a fault fails it, then moves the synced size to what
  // was appended when it began.
  rocksdb::IOStatus TrackedSync(const std::string& fname,
                                const std::function<rocksdb::IOStatus()>& sync)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A sync that began when `covered` bytes were appended completed.
  void OnSync(const std::string& fname, uint64_t covered) ABSL_LOCKS_EXCLUDED(mu_);
  void OnTruncate(const std::string& fname, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // Wraps a file the target created (if `s` is OK) and tracks it at `initial_size`.
  rocksdb::IOStatus Wrap(const std::string& fname, rocksdb::IOStatus s,
                         std::unique_ptr<rocksdb::FSWritableFile>* result,
                         uint64_t initial_size);

  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  Fault fault_ ABSL_GUARDED_BY(mu_);
  uint64_t fault_skipped_ ABSL_GUARDED_BY(mu_) = 0;   // successes so far under fault_
  uint64_t fault_injected_ ABSL_GUARDED_BY(mu_) = 0;  // failures so far under fault_
  uint64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  bool active_ ABSL_GUARDED_BY(mu_) = true;
  absl::flat_hash_map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::store

#endif  // HANDOFF_STORE_FAULT_INJECTION_FS_H_
