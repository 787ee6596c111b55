// Status propagation helpers. This abseil (20220623) ships no RETURN_IF_ERROR or
// ASSIGN_OR_RETURN, so the project defines them once, here.
#ifndef HANDOFF_BASE_STATUS_MACROS_H_
#define HANDOFF_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HANDOFF_CONCAT_INNER_(a, b) a##b
#define HANDOFF_CONCAT_(a, b) HANDOFF_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status handoff_status_ = (expr);             \
    if (!handoff_status_.ok()) return handoff_status_;   \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(HANDOFF_CONCAT_(handoff_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // HANDOFF_BASE_STATUS_MACROS_H_
