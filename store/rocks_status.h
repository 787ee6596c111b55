// The one place where a rocksdb::Status becomes an absl::Status.
//
// Every RocksDB call in the store goes through FromRocks, so no RocksDB error is ever
// dropped and every error carries the operation that failed.
#ifndef HANDOFF_STORE_ROCKS_STATUS_H_
#define HANDOFF_STORE_ROCKS_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace handoff::store {

// Maps `s` to an absl::Status whose message starts with `operation`.
//   NotFound        -> NOT_FOUND
//   Corruption      -> DATA_LOSS
//   IOError, NoSpace, Busy, TimedOut, TryAgain, Aborted -> UNAVAILABLE (storage failure)
//   InvalidArgument -> INVALID_ARGUMENT, NotSupported -> UNIMPLEMENTED, else INTERNAL.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view operation);

}  // namespace handoff::store

#endif  // HANDOFF_STORE_ROCKS_STATUS_H_
