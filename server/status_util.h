// The one place where an absl::Status from the core becomes a grpc::Status.
//
// absl::StatusCode and grpc::StatusCode share the canonical numbering of
// google.rpc.Code, so the code is carried over unchanged; the message is passed as is
// (the core never puts a secret in a status message, see consumer/source_manager.h).
// Thread-safe (pure functions).
#ifndef HANDOFF_SERVER_STATUS_UTIL_H_
#define HANDOFF_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace handoff::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_STATUS_UTIL_H_
