// Page: one complete page from the event provider, as parsed from the wire.
//
// A Page is only ever built from a complete body or SSE frame; partial input never
// becomes a Page. Items are handoff::v1::EventRow (the derived row format), so the
// engine stores what the parser produced without another conversion.
#ifndef HANDOFF_CONSUMER_PAGE_H_
#define HANDOFF_CONSUMER_PAGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "handoff/v1/source.pb.h"
#include "store/position.h"

namespace handoff::consumer {

struct BlockMarkValue {
  uint64_t number = 0;
  std::string hash;
};

struct Page {
  // First block this page covers (decimal on the wire).
  uint64_t from = 0;
  // Last block covered; absent (null) on an empty page that covers nothing.
  std::optional<BlockMarkValue> through;
  // Opaque continuation token. Never compared except for equality with the request.
  std::string next;
  // A correction page: its range replaces what was applied there.
  bool reorg = false;
  std::optional<BlockMarkValue> safe;
  std::optional<BlockMarkValue> finalized;
  std::optional<uint64_t> tip;
  // Logs in the order received (validated by the engine, not the parser).
  std::vector<handoff::v1::EventRow> items;
  // Size of the body or frame data the page came from.
  size_t wire_bytes = 0;
};

inline Position PositionOf(const handoff::v1::EventRow& row) {
  return Position{row.block_number(), row.log_index()};
}

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PAGE_H_
