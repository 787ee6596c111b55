#include "store/fault_injection_fs.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace handoff::store {

// A writable file that reports its appends and syncs to the FaultInjectionFs and asks
// it before each one whether to fail. The FaultInjectionFs outlives its files.
class FaultInjectionFs::File : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(FaultInjectionFs* fs, std::string fname, std::unique_ptr<rocksdb::FSWritableFile> t)
      : FSWritableFileOwnerWrapper(std::move(t)), fs_(fs), fname_(std::move(fname)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->MaybeFail(kAppend, fname_);
    if (s.ok()) s = target()->Append(data, options, dbg);
    if (s.ok()) fs_->OnAppend(fname_, kAtEnd, data.size());
    return s;
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->MaybeFail(kAppend, fname_);
    if (s.ok()) s = target()->Append(data, options, info, dbg);
    if (s.ok()) fs_->OnAppend(fname_, kAtEnd, data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->MaybeFail(kAppend, fname_);
    if (s.ok()) s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) fs_->OnAppend(fname_, offset, data.size());
    return s;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = fs_->MaybeFail(kAppend, fname_);
    if (s.ok()) s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) fs_->OnAppend(fname_, offset, data.size());
    return s;
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                         rocksdb::IODebugContext* dbg) override {
    return fs_->TrackedSync(fname_, [&] { return target()->Sync(options, dbg); });
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    return fs_->TrackedSync(fname_, [&] { return target()->Fsync(options, dbg); });
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive("truncate");
    rocksdb::IOStatus s = target()->Truncate(size, options, dbg);
    if (s.ok()) fs_->OnTruncate(fname_, size);
    return s;
  }
  // A range sync starts writeback but promises nothing after power loss: it does not
  // move the synced size.
  rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes,
                              const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override {
    if (!fs_->active()) return fs_->Inactive("range sync");
    return target()->RangeSync(offset, nbytes, options, dbg);
  }

  static constexpr uint64_t kAtEnd = ~uint64_t{0};

 private:
  FaultInjectionFs* const fs_;
  const std::string fname_;
};

FaultInjectionFs::FaultInjectionFs() : FaultInjectionFs(rocksdb::FileSystem::Default()) {}

FaultInjectionFs::FaultInjectionFs(const std::shared_ptr<rocksdb::FileSystem>& base)
    : FileSystemWrapper(base) {}

FaultInjectionFs::~FaultInjectionFs() = default;

void FaultInjectionFs::Arm(const Fault& fault) {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  fault_ = fault;
  fault_skipped_ = 0;
  fault_injected_ = 0;
}

void FaultInjectionFs::Disarm() {
  absl::MutexLock lock(&mu_);
  armed_ = false;
}

uint64_t FaultInjectionFs::injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

void FaultInjectionFs::Deactivate() {
  absl::MutexLock lock(&mu_);
  active_ = false;
}

void FaultInjectionFs::Reactivate() {
  absl::MutexLock lock(&mu_);
  active_ = true;
}

bool FaultInjectionFs::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

rocksdb::IOStatus FaultInjectionFs::Inactive(absl::string_view what) const {
  return rocksdb::IOStatus::IOError(
      absl::StrCat("fault injection: ", what, " after simulated power loss"));
}

rocksdb::IOStatus FaultInjectionFs::MaybeFail(Op op, const std::string& fname) {
  absl::MutexLock lock(&mu_);
  if (!active_) {
    return rocksdb::IOStatus::IOError("fault injection: simulated power loss: ", fname);
  }
  if (!armed_ || (fault_.ops & op) == 0) return rocksdb::IOStatus::OK();
  if (!fault_.file_suffix.empty() && !absl::EndsWith(fname, fault_.file_suffix)) {
    return rocksdb::IOStatus::OK();
  }
  if (fault_skipped_ < fault_.after) {
    ++fault_skipped_;
    return rocksdb::IOStatus::OK();
  }
  ++fault_injected_;
  ++injected_;
  if (fault_.times != 0 && fault_injected_ >= fault_.times) armed_ = false;
  const char* what = op == kAppend ? "append" : op == kSync ? "sync" : "create";
  const std::string msg = absl::StrCat("fault injection: ", what, " of ", fname);
  switch (fault_.error) {
    case Error::kNoSpace:
      return rocksdb::IOStatus::NoSpace(msg);
    case Error::kIoError:
      break;
  }
  return rocksdb::IOStatus::IOError(msg);
}

void FaultInjectionFs::Track(const std::string& fname, uint64_t size) {
  absl::MutexLock lock(&mu_);
  files_[fname] = FileState{size, size};
}

void FaultInjectionFs::OnAppend(const std::string& fname, uint64_t offset, uint64_t n) {
  absl::MutexLock lock(&mu_);
  FileState& f = files_[fname];
  f.size = offset == File::kAtEnd ? f.size + n : std::max(f.size, offset + n);
}

void FaultInjectionFs::OnSync(const std::string& fname, uint64_t covered) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(fname);
  if (it == files_.end()) return;
  it->second.synced = std::max(it->second.synced, std::min(covered, it->second.size));
}

void FaultInjectionFs::OnTruncate(const std::string& fname, uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(fname);
  if (it == files_.end()) return;
  it->second.size = size;
  it->second.synced = std::min(it->second.synced, size);
}

// A read-write handle of a file the database writes, used only to sync it from another
// thread (Store::SyncWal): its syncs count like the writer's own, its writes are refused.
class FaultInjectionFs::SyncHandle : public rocksdb::FSRandomRWFileOwnerWrapper {
 public:
  SyncHandle(FaultInjectionFs* fs, std::string fname, std::unique_ptr<rocksdb::FSRandomRWFile> t)
      : FSRandomRWFileOwnerWrapper(std::move(t)), fs_(fs), fname_(std::move(fname)) {}

  rocksdb::IOStatus Write(uint64_t, const rocksdb::Slice&, const rocksdb::IOOptions&,
                          rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("fault injection: a sync handle does not write");
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                         rocksdb::IODebugContext* dbg) override {
    return fs_->TrackedSync(fname_, [&] { return target()->Sync(options, dbg); });
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    return Sync(options, dbg);
  }

 private:
  FaultInjectionFs* const fs_;
  const std::string fname_;
};

rocksdb::IOStatus FaultInjectionFs::NewRandomRWFile(
    const std::string& fname, const rocksdb::FileOptions& file_opts,
    std::unique_ptr<rocksdb::FSRandomRWFile>* result, rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s = MaybeFail(kCreate, fname);
  if (!s.ok()) return s;
  s = target()->NewRandomRWFile(fname, file_opts, result, dbg);
  if (!s.ok()) return s;
  *result = std::make_unique<SyncHandle>(this, fname, std::move(*result));
  return s;
}

rocksdb::IOStatus FaultInjectionFs::TrackedSync(
    const std::string& fname, const std::function<rocksdb::IOStatus()>& sync) {
  // A sync covers what was appended before it began; appends racing it may or may not
  // be on disk after a power loss, so they stay unsynced.
  uint64_t covered = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(fname);
    if (it != files_.end()) covered = it->second.size;
  }
  rocksdb::IOStatus s = MaybeFail(kSync, fname);
  if (s.ok()) s = sync();
  if (s.ok()) OnSync(fname, covered);
  return s;
}

uint64_t FaultInjectionFs::unsynced_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [name, f] : files_) total += f.size - std::min(f.size, f.synced);
  return total;
}

rocksdb::IOStatus FaultInjectionFs::Wrap(const std::string& fname, rocksdb::IOStatus s,
                                         std::unique_ptr<rocksdb::FSWritableFile>* result,
                                         uint64_t initial_size) {
  if (!s.ok()) return s;
  Track(fname, initial_size);
  *result = std::make_unique<File>(this, fname, std::move(*result));
  return s;
}

rocksdb::IOStatus FaultInjectionFs::NewWritableFile(
    const std::string& fname, const rocksdb::FileOptions& file_opts,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s = MaybeFail(kCreate, fname);
  if (!s.ok()) return s;
  return Wrap(fname, target()->NewWritableFile(fname, file_opts, result, dbg), result, 0);
}

rocksdb::IOStatus FaultInjectionFs::ReopenWritableFile(
    const std::string& fname, const rocksdb::FileOptions& file_opts,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s = MaybeFail(kCreate, fname);
  if (!s.ok()) return s;
  // What the file already holds counts as synced, unless we know better.
  uint64_t size = 0;
  target()->GetFileSize(fname, rocksdb::IOOptions(), &size, dbg).PermitUncheckedError();
  s = target()->ReopenWritableFile(fname, file_opts, result, dbg);
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(fname);
    if (it == files_.end()) {
      files_[fname] = FileState{size, size};
    } else {
      it->second.size = size;
    }
  }
  *result = std::make_unique<File>(this, fname, std::move(*result));
  return s;
}

rocksdb::IOStatus FaultInjectionFs::ReuseWritableFile(
    const std::string& fname, const std::string& old_fname,
    const rocksdb::FileOptions& file_opts, std::unique_ptr<rocksdb::FSWritableFile>* result,
    rocksdb::IODebugContext* dbg) {
  rocksdb::IOStatus s = MaybeFail(kCreate, fname);
  if (!s.ok()) return s;
  s = target()->ReuseWritableFile(fname, old_fname, file_opts, result, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    files_.erase(old_fname);
  }
  return Wrap(fname, s, result, 0);
}

rocksdb::IOStatus FaultInjectionFs::RenameFile(const std::string& src,
                                               const std::string& target_name,
                                               const rocksdb::IOOptions& options,
                                               rocksdb::IODebugContext* dbg) {
  if (!active()) return Inactive("rename");
  rocksdb::IOStatus s = target()->RenameFile(src, target_name, options, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(src);
    if (it != files_.end()) {
      FileState state = it->second;
      files_.erase(it);
      files_[target_name] = state;
    } else {
      files_.erase(target_name);
    }
  }
  return s;
}

rocksdb::IOStatus FaultInjectionFs::DeleteFile(const std::string& fname,
                                               const rocksdb::IOOptions& options,
                                               rocksdb::IODebugContext* dbg) {
  if (!active()) return Inactive("delete");
  rocksdb::IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    files_.erase(fname);
  }
  return s;
}

rocksdb::IOStatus FaultInjectionFs::Truncate(const std::string& fname, size_t size,
                                             const rocksdb::IOOptions& options,
                                             rocksdb::IODebugContext* dbg) {
  if (!active()) return Inactive("truncate");
  rocksdb::IOStatus s = target()->Truncate(fname, size, options, dbg);
  if (s.ok()) OnTruncate(fname, size);
  return s;
}

absl::Status FaultInjectionFs::DropUnsyncedData() {
  std::vector<std::pair<std::string, uint64_t>> files;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, f] : files_) {
      if (f.size > f.synced) files.emplace_back(name, f.synced);
      f.size = f.synced;
    }
  }
  for (const auto& [name, synced] : files) {
    if (!target()->FileExists(name, rocksdb::IOOptions(), nullptr).ok()) continue;
    // FileSystem::Truncate is not implemented by the POSIX file system of RocksDB 7;
    // FSWritableFile::Truncate (ftruncate) is.
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s =
        target()->ReopenWritableFile(name, rocksdb::FileOptions(), &file, nullptr);
    if (s.ok()) s = file->Truncate(synced, rocksdb::IOOptions(), nullptr);
    if (s.ok()) s = file->Close(rocksdb::IOOptions(), nullptr);
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrCat("fault injection: cannot truncate ", name, ": ", s.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace handoff::store
