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

#include "absl/strings/string_view.h"
#include "consumer/page_budget.h"
#include "handoff/v1/source.pb.h"
#include "store/position.h"

namespace handoff::consumer {

struct BlockMarkValue {
  uint64_t number = 0;
  std::string hash;
};

// Everything a page carries but its budget slot (copyable).
struct PageContents {
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

  // Optional: every item encoded as its stored row (store/row_codec.h), made by the
  // parser on the fetching thread so the commit path only copies them. Item i is
  // row_bytes[row_ends[i-1], row_ends[i]). Empty when the page was built another way;
  // the engine then encodes on demand. Items must not change once this is filled.
  std::string row_bytes;
  std::vector<size_t> row_ends;

  // The stored-row bytes of item i, or an empty view when row_bytes is not filled.
  absl::string_view EncodedItem(size_t i) const {
    if (row_ends.size() != items.size() || i >= row_ends.size()) return {};
    const size_t begin = i == 0 ? 0 : row_ends[i - 1];
    return absl::string_view(row_bytes).substr(begin, row_ends[i] - begin);
  }
  bool has_encoded_items() const { return !items.empty() && row_ends.size() == items.size(); }

  // The contract's "nothing new yet": an empty page whose `next` is the cursor it was
  // asked with. Applying it is a no-op; the consumer waits before asking again.
  bool NothingNewAfter(absl::string_view request_cursor) const {
    return items.empty() && next == request_cursor;
  }
};

struct Page : PageContents {
  // The PageBudget slot this page was fetched under, released with the page (empty for
  // a page built without a budget). Makes Page move-only.
  PageSlot slot;
};

// A copy of `page`'s contents without its slot (a copy is not a fetched page: the budget
// does not count it). For tests and fakes that replay pages.
Page CopyOfPage(const Page& page);

// Reserves page->row_bytes for `items` items of a page of page->wire_bytes.
void ReserveEncodedItems(size_t items, Page* page);
// Appends `row`, the page's next item, to page->row_bytes/row_ends. The parser calls it
// right after filling the row, while the row is still in the core's cache. Returns
// store::AppendEncodedRow's answer: whether every hex field was canonical lowercase hex
// (its digits checked on the way).
bool AppendEncodedItem(const handoff::v1::EventRow& row, Page* page);

inline Position PositionOf(const handoff::v1::EventRow& row) {
  return Position{row.block_number(), row.log_index()};
}

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PAGE_H_
