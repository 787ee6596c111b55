#include "store/rocks_status.h"

#include "absl/strings/str_cat.h"

namespace handoff::store {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view operation) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat("storage: ", operation, ": ", s.ToString());
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(msg);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(msg);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case rocksdb::Status::kNotSupported:
      return absl::UnimplementedError(msg);
    case rocksdb::Status::kIOError:
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kAborted:
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kShutdownInProgress:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace handoff::store
