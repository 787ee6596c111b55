// Validation and normalisation of source specs and admin requests: the one place that
// decides what INVALID_ARGUMENT means. Every message names the offending field.
#ifndef HANDOFF_CONSUMER_SPEC_VALIDATION_H_
#define HANDOFF_CONSUMER_SPEC_VALIDATION_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

// `field` is the path used in error messages, e.g. "source_id" or "spec.id".
absl::Status ValidateSourceId(absl::string_view id, absl::string_view field);

// Checks `spec` and fills defaults (page_limit 1000, local rows sink, the FINALIZED gate
// for a downstream sink, failure policy defaults). The result is what is stored and compared for idempotency.
// A downstream sink's tls: its fields need `enabled`, the client certificate and key go
// together, and a token needs TLS; a tls message that enables nothing is dropped. Only
// the shape is checked here: the files are read when the source starts.
absl::StatusOr<handoff::v1::SourceSpec> NormalizeSpec(const handoff::v1::SourceSpec& spec);

// The fields (paths such as "filter" or "sink.gate") in which two normalised specs
// differ and that cannot change without a rebuild. Safe to change in place: transport
// (cursors are the same for POLL and SSE), page_limit, api_key, failure_policy, and the
// downstream sink's deadline_ms, batch, max_batch, tls and token (how events travel, not
// which ones or where).
std::vector<std::string> UnsafeSpecChanges(const handoff::v1::SourceSpec& stored,
                                           const handoff::v1::SourceSpec& updated);

// Page size of a list request: 0 means `default_size`; negative or above `max_size`
// is INVALID_ARGUMENT naming `field`.
absl::StatusOr<int> PageSize(int requested, int default_size, int max_size,
                             absl::string_view field);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SPEC_VALIDATION_H_
