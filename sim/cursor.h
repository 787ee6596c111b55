// CursorCodec: the simulator's opaque page cursors.
//
// A cursor is web-safe base64 of "c:<next block>:<chain epoch>:<check>", where check is
// a keyed hash of the block, the epoch and the (chain, source, filter) binding. Clients
// must treat it as opaque; the simulator uses the epoch to tell whether a client applied
// blocks that a later reorg replaced.
//
// Invariant: a cursor decodes only under the binding it was issued for (otherwise
// kFailedPrecondition: the contract's 409 cursor_mismatch); text that is not a cursor
// at all is kInvalidArgument (400 invalid_request). Immutable, thread-safe.
#ifndef HANDOFF_SIM_CURSOR_H_
#define HANDOFF_SIM_CURSOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace handoff::sim {

struct CursorPosition {
  uint64_t block = 0;  // the first block the next page covers
  uint64_t epoch = 0;  // the chain epoch (reorg count) when the cursor was issued
};

// Identity of a source: a cursor is valid for exactly one.
uint64_t SourceBinding(absl::string_view chain, absl::string_view source,
                       absl::string_view filter);

class CursorCodec {
 public:
  explicit CursorCodec(uint64_t secret) : secret_(secret) {}

  std::string Encode(uint64_t binding, CursorPosition position) const;
  absl::StatusOr<CursorPosition> Decode(uint64_t binding, absl::string_view cursor) const;

 private:
  uint64_t Check(uint64_t binding, CursorPosition position) const;
  const uint64_t secret_;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_CURSOR_H_
