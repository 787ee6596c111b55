#include "consumer/page.h"

#include "store/row_codec.h"

namespace handoff::consumer {

Page CopyOfPage(const Page& page) {
  Page copy;
  static_cast<PageContents&>(copy) = page;
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

bool AppendEncodedItem(const handoff::v1::EventRow& row, Page* page) {
  const bool canonical = store::AppendEncodedRow(row, &page->row_bytes);
  page->row_ends.push_back(page->row_bytes.size());
  return canonical;
}

}  // namespace handoff::consumer
