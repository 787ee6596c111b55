#include "consumer/page.h"

namespace handoff::consumer {

void SerializeItems(Page* page) {
  page->row_ends.clear();
  page->row_ends.reserve(page->items.size());
  size_t total = 0;
  for (const handoff::v1::EventRow& row : page->items) {
    total += row.ByteSizeLong();  // caches each message's size
    page->row_ends.push_back(total);
  }
  page->row_bytes.resize(total);
  uint8_t* out = reinterpret_cast<uint8_t*>(page->row_bytes.data());
  for (const handoff::v1::EventRow& row : page->items) {
    out = row.SerializeWithCachedSizesToArray(out);
  }
}

}  // namespace handoff::consumer
