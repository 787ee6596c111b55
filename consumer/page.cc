#include "consumer/page.h"

#include "store/row_codec.h"

namespace handoff::consumer {

Page CopyOfPage(const Page& page) {
  Page copy;
  copy.from = page.from;
  copy.through = page.through;
  copy.next = page.next;
  copy.reorg = page.reorg;
  copy.safe = page.safe;
  copy.finalized = page.finalized;
  copy.tip = page.tip;
  copy.items = page.items;
  copy.wire_bytes = page.wire_bytes;
  copy.row_bytes = page.row_bytes;
  copy.row_ends = page.row_ends;
  return copy;
}

void ReserveEncodedItems(size_t items, Page* page) {
  page->row_ends.clear();
  page->row_ends.reserve(items);
  page->row_bytes.clear();
  // A stored row is about half its wire text; reserving that keeps this to one or two
  // allocations per page.
  page->row_bytes.reserve(page->wire_bytes / 2 + 64 * items);
}

void AppendEncodedItem(const handoff::v1::EventRow& row, Page* page) {
  store::AppendEncodedRow(row, &page->row_bytes);
  page->row_ends.push_back(page->row_bytes.size());
}

}  // namespace handoff::consumer
